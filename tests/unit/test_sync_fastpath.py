"""The no-change fast path's parser, on output recorded from coreutils 9.1 `stat`."""
import stat

from multihost.sync_fastpath import parse_stat_output, stat_command

# printf 'a.py\0link\0pkg\0' | xargs -0 stat --printf '%n\0%f\0%s\0%.9Y\0%.9Z\0%i\0'
RECORDED = (b"a.py\x0081a4\x00120\x001795299624.002425747\x001795299624.102425747\x002146375\x00"
            b"link\x00a1ff\x0010\x001795299624.002425747\x001795299624.002425747\x002146376\x00"
            b"pkg\x0041ed\x004096\x001795299624.006773038\x001795299624.006773038\x002296745\x00")


def test_stat_output_becomes_the_keys_the_hosts_record():
    keys = parse_stat_output(RECORDED)
    assert keys["a.py"] == [stat.S_IFREG, 120, 1795299624002425747, 1795299624102425747, 2146375]
    assert keys["link"][0] == stat.S_IFLNK
    assert keys["pkg"] == [stat.S_IFDIR, 0o755]     # a directory: type and mode only


def test_a_stat_without_nanoseconds_or_a_cut_output_is_no_answer():
    old_stat = RECORDED.replace(b".002425747", b"").replace(b".102425747", b"")
    assert parse_stat_output(old_stat) is None
    assert parse_stat_output(RECORDED[:-20]) is None


def test_the_command_quotes_the_root():
    assert stat_command("/home/me/my work").startswith("cd -- '/home/me/my work' && xargs -0 -r stat")
