"""The no-change fast path's parser, on output recorded from coreutils 9.1 `stat`, and
the record it keeps between syncs."""
import hashlib
import marshal
import os
import stat
import subprocess
import types

from multihost.sync.fastpath import (load_record, parse_stat_output, record_entries,
                                     remember_check, save_record, stat_command,
                                     stat_generation, stat_machine, verified_digest)
from multihost.remote.sync.lock_files import MARKER, SUFFIX
from multihost.sync.manifest import build_manifest

# The workdir's generation, then
# printf 'a.py\0link\0pkg\0' | xargs -0 stat --printf '%f\0%s\0%.9Y\0%.9Z\0%i\0'
NAMES = ["a.py", "link", "pkg"]
RECORDED = (b"7 4f1c/net:[4026531840]\n81a4\x00120\x001795299624.002425747\x001795299624.102425747\x002146375\x00"
            b"a1ff\x0010\x001795299624.002425747\x001795299624.002425747\x002146376\x00"
            b"41ed\x004096\x001795299624.006773038\x001795299624.006773038\x002296745\x00")


def test_stat_output_becomes_the_keys_the_hosts_record():
    keys = parse_stat_output(RECORDED, NAMES)
    assert keys["a.py"] == [stat.S_IFREG, 120, 1795299624002425747, 1795299624102425747, 2146375]
    assert keys["link"][0] == stat.S_IFLNK
    assert keys["pkg"] == [stat.S_IFDIR, 0o755]     # a directory: type and mode only


def test_a_stat_without_nanoseconds_or_a_cut_output_is_no_answer():
    old_stat = RECORDED.replace(b".002425747", b"").replace(b".102425747", b"")
    assert parse_stat_output(old_stat, NAMES) is None
    assert parse_stat_output(RECORDED[:-20], NAMES) is None
    assert parse_stat_output(RECORDED, NAMES + ["missing.py"]) is None   # a name unanswered


def test_the_answer_is_hashed_only_when_it_shows_every_recorded_key():
    keys = parse_stat_output(RECORDED, NAMES)
    assert verified_digest(RECORDED, NAMES, keys) == hashlib.sha256(RECORDED).hexdigest()
    moved = dict(keys, **{"a.py": keys["a.py"][:3] + [keys["a.py"][3] + 1, keys["a.py"][4]]})
    assert verified_digest(RECORDED, NAMES, moved) is None      # a ctime moved: no hash


def _check(root):
    return subprocess.run(["sh", "-c", stat_command(str(root))], input=b"a.py\0",
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_check_answers_the_workdirs_generation_then_its_keys(tmp_path):
    root = tmp_path / "my work"
    root.mkdir()
    (root / "a.py").write_text("x")
    done = _check(root)
    assert done.returncode == 0 and done.stderr == b""
    assert stat_generation(done.stdout) == "-"            # no sync took its lock yet
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    assert stat_machine(done.stdout) == f"{boot}/{os.readlink('/proc/self/ns/net')}"
    assert parse_stat_output(done.stdout, ["a.py"])["a.py"][1] == 1
    (tmp_path / ("my work" + SUFFIX)).write_text('12\n{"id": "sync:x"}\n')
    assert stat_generation(_check(root).stdout) == "12"


def test_a_tree_marked_incomplete_is_never_found_unchanged(tmp_path):
    (tmp_path / "a.py").write_text("x")
    (tmp_path / MARKER).write_text("a sync")
    done = _check(tmp_path)
    assert done.returncode != 0 and done.stdout == b""


def test_a_record_keeps_names_and_keys_and_then_the_hash_a_check_learned(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "a.py").write_text("x")
    manifest = build_manifest(str(tmp_path / "code"), cache_dir=str(tmp_path / "cache"))
    key = [stat.S_IFREG, 1, 2, 3, 4]
    assert not save_record("h1", "~/w", "/code", "/root/w", manifest, {})   # a key missing
    assert load_record("h1", "~/w", "/code") is None
    assert save_record("h1", "~/w", "/code", "/root/w", manifest, {"a.py": key})
    record = load_record("h1", "~/w", "/code")
    assert (record["root"], record["names"], record["stat"]) == ("/root/w", b"a.py", None)
    assert record_entries(record) == [manifest.entries[0].wire() + [key]]
    record["stat"], record["fresh"] = "ab" * 32, True     # a check found every key right
    remember_check("h1", "~/w", "/code", record)
    again = load_record("h1", "~/w", "/code")
    assert again["stat"] == "ab" * 32 and record_entries(again) == record_entries(record)
    assert load_record("h2", "~/w", "/code") is None   # another host: its own record


def state_files(home, suffix):
    folder = home / ".cache" / "multihost" / "sync-state"
    return sorted(p for p in folder.iterdir() if p.name.endswith(suffix))


def test_hosts_synced_from_one_manifest_share_one_record_of_its_entries(env, monkeypatch, tmp_path):
    """The entries (paths, hashes) are written and unpacked once per sync, not once per
    host: at 64 hosts that was 64 copies of a 2,000-entry record saved on every edit."""
    from multihost.sync import fastpath

    env.sync()
    home = tmp_path / "home"
    trees, hosts = state_files(home, ".tree"), state_files(home, ".state")
    assert len(trees) == 1 and len(hosts) == 2
    assert all(b"train.py" not in p.read_bytes() for p in hosts)   # only the host's keys
    (env.code / "train.py").write_text("print('edited')\n")
    packed, unpacked = marshal.loads(trees[0].read_bytes())["packed"], []
    counting = types.SimpleNamespace(dumps=marshal.dumps, dump=marshal.dump, loads=lambda data: (
        unpacked.append(data == packed) or marshal.loads(data)))
    monkeypatch.setattr(fastpath, "marshal", counting)
    assert [h.files for h in env.sync().hosts] == [1, 1]
    assert unpacked.count(True) == 1                  # both hosts' plans, one unpacking
    assert len(state_files(home, ".tree")) == 2       # the new manifest's, once
    assert [h.files for h in env.sync(verify=True).hosts] == [0, 0]


def test_old_trees_are_removed_and_a_record_without_its_tree_is_no_record(tmp_path, monkeypatch):
    from multihost.sync.fastpath import TREES_KEPT

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "code").mkdir()
    key = [stat.S_IFREG, 1, 2, 3, 4]
    for version in range(TREES_KEPT + 3):
        (tmp_path / "code" / "a.py").write_text("x" * (version + 1))
        manifest = build_manifest(str(tmp_path / "code"), cache_dir=str(tmp_path / "cache"))
        assert save_record(f"h{version}", "~/w", "/code", "/root/w", manifest, {"a.py": key})
    assert len(state_files(tmp_path, ".tree")) == TREES_KEPT
    assert load_record(f"h{TREES_KEPT + 2}", "~/w", "/code") is not None
    assert load_record("h0", "~/w", "/code") is None   # its tree is gone: compared by content
