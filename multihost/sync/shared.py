"""Which hosts see one directory: a token one host writes and the others read.

Homes and project directories are often one filesystem (NFS, Lustre, GPFS) on every
host. A sync that writes such a workdir from every host at once races itself (one host
deletes the temporary file another renames), and writes the tree once per host. So
before a sync, every host is asked one shell line, through the connection it already
has: in ``<workdir>/.multihost-share/`` it creates, exclusively (O_EXCL, the shell's
noclobber), a file named by this command's nonce holding its rank in the command
(removed again once every host has answered). An exclusive create holds on NFS (v3 and
later) and sshfs, where flock does not: only the first host's file is made, and every
host reads back whose it is. Hosts that read the same owner see the same directory; a host
that reads its own, and is alone with it, has a directory of its own. Nothing relies on
device and inode numbers (an NFS client's device is its own; sshfs makes up inodes) or
on flock. Tokens a probe cut short left behind are removed after ten minutes by the next.

The same nonce file, written here in the code directory, read on every host at the same
path, tells whether the code directory itself is shared: then nothing is copied.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import shlex
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from ..errors import MultihostError, SyncError
from ..fanout import fan_out
from ..remote.machine import machine_identity
from ..remote.sync.plan import SHARE_DIR
from ..transport.base import quote_path
from .fastpath import STATE_DIR
from .model import HostSync, SharedWorkdir, sync_error


# In: $w the directory, $nc the nonce, $c the code directory's path (or nothing), $mk 1
# to make the directory when missing, $r the host's rank (unique in the command: one
# machine listed twice with two workdirs writes two tokens, each read back by itself
# alone). Prints the owner of the nonce in the directory, then the code directory's
# token as read here ("-": none), each after its tag: a login shell may have printed
# lines of its own before. One line of characters every login shell passes on as they
# are (transport/base.py remote_line: no decoding step), and shell builtins but for one
# mkdir: at 64 hosts every process a host starts here is CPU the sync's write needs.
# Hosts make the directories at once: over sshfs a mkdir that another host won fails
# (not EEXIST: an SFTP "failure"), so it is tried again until the directory is seen. The
# winner's line may show late (a network filesystem caches sizes): it is read again, 2 s
# at most, rather than its size tested first. (Written over lines, sent as one: no
# string in it holds two spaces.)
PROBE = " ".join("""
d="$w/.multihost-share"; f="$d/$nc"; i=0; p=; [ "$mk" = 1 ] && p=-p;
until [ -d "$d" ] || mkdir $p "$d" 2>/dev/null; do
  i=$((i + 1)); [ -d "$w" ] || [ -n "$p" ] || i=99;
  if [ $i -gt 20 ]; then
    echo "=owner= -"; echo "=code= -"; exit 0;
  fi;
  sleep 0.05;
done;
set -C; echo "r$r" 2>/dev/null > "$f"; set +C;
i=0; o=;
while [ $i -lt 100 ]; do
  read -r o 2>/dev/null < "$f"; [ -n "$o" ] && break;
  sleep 0.02; i=$((i + 1));
done;
echo "=owner= ${o:--}";
t=-; [ -n "$c" ] && read -r t 2>/dev/null < "$c/.multihost-share/$nc"; echo "=code= ${t:--}";
exit 0""".split())


@dataclass(frozen=True)
class Sharing:
    """What the hosts share. ``groups``: for each directory seen by more than one host,
    the ranks that see it (in rank order; the first writes it). ``code_everywhere``: the
    code directory is the same directory, at its own path, on every host."""

    groups: Tuple[Tuple[int, ...], ...] = ()
    code_everywhere: bool = False
    nonce: str = ""          # of the tokens left to remove (forget_tokens)
    # Ranks the probe reached by a new connection (no OpenSSH master an earlier command
    # left): a host no later step of the sync reaches is left one for the next command.
    unmastered: Tuple[int, ...] = ()

    def writer_of(self, rank: int) -> Optional[int]:
        """The rank that writes the directory ``rank`` shares (None: its own)."""
        for group in self.groups:
            if rank in group and rank != group[0]:
                return group[0]
        return None

    @property
    def followers(self) -> Tuple[int, ...]:
        return tuple(r for group in self.groups for r in group[1:])


def probe_line(workdir: str, nonce: str, code_dir: str = "", make: bool = True,
               rank: int = 0) -> str:
    code = shlex.quote(code_dir) if code_dir else ""
    return (f"w={quote_path(workdir)}; nc={nonce}; c={code}; mk={1 if make else 0}; "
            f"r={int(rank)}; " + PROBE)


def remove_line(workdir: str, nonce: str) -> str:
    """This probe's token gone, and any a probe cut short left (ten minutes old)."""
    share = quote_path(workdir) + "/" + SHARE_DIR
    return (f"rm -f {share}/{nonce}; find {share} -type f -mmin +10 -exec rm -f {{}} + "
            f"2>/dev/null; rmdir {share} 2>/dev/null; exit 0")


def mark_code_dir(code_dir: str, nonce: str) -> Optional[str]:
    """Write this machine's token into the code directory (None when it cannot be)."""
    directory = os.path.join(code_dir, SHARE_DIR)
    token = f"controller:{machine_identity() or '-'}:{nonce}"
    try:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, nonce), "w") as out:
            out.write(token + "\n")
    except OSError:
        return None
    return token


def unmark_code_dir(code_dir: str, nonce: str) -> None:
    try:
        os.unlink(os.path.join(code_dir, SHARE_DIR, nonce))
        os.rmdir(os.path.join(code_dir, SHARE_DIR))
    except OSError:
        pass


def tagged(text: str, tag: str) -> str:
    """The value of the last line that starts with ``tag`` ("-" when there is none)."""
    found = [line[len(tag):].strip() for line in text.splitlines() if line.startswith(tag)]
    return found[-1] if found else "-"


def group_owners(owners: Dict[int, Optional[str]]) -> Tuple[Tuple[int, ...], ...]:
    """Ranks grouped by the owner they read, groups of two or more, in rank order."""
    by_owner: Dict[str, list] = {}
    for rank in sorted(owners):
        owner = owners[rank]
        if owner and owner != "-":
            by_owner.setdefault(owner, []).append(rank)
    return tuple(tuple(ranks) for ranks in by_owner.values() if len(ranks) > 1)


def find_sharing(cluster, workdirs: Dict[int, str], code_dir: Optional[str] = None,
                 hosts: Optional[Sequence] = None, make: bool = True) -> Sharing:
    """Which of the hosts' workdirs are one directory, and (given ``code_dir``) whether
    the code directory is the same directory at the same path on every host. A host that
    cannot be asked counts as having its own (the sync reports it). ``make``: a missing
    workdir is made (a sync's first write must know it already); a check makes none."""
    hosts = tuple(hosts if hosts is not None else cluster.hosts)
    if len(hosts) < 2 and not code_dir:
        return Sharing()
    nonce = secrets.token_hex(8)
    token = mark_code_dir(os.path.abspath(code_dir), nonce) if code_dir else None
    where = os.path.abspath(code_dir) if token else ""

    unmastered = set()

    def on(host, line):
        quick = cluster.reused(host)   # a master an earlier command left: no handshake
        try:
            result = quick.run(line, timeout=30) if quick is not None else None
        except MultihostError:
            result = None
        if result is None or result.exit_code == 255:
            unmastered.add(host.rank)
            result = cluster.transport(host).run(line, timeout=30)
        return result

    def ask(host):
        result = on(host, probe_line(workdirs[host.rank], nonce, where, make, host.rank))
        text = result.stdout.decode("utf-8", "replace")
        return tagged(text, "=owner= "), tagged(text, "=code= ")

    try:
        answers = {r.host.rank: r.value for r in fan_out(hosts, ask, cluster.workers) if r.ok}
    finally:
        if token:
            unmark_code_dir(os.path.abspath(code_dir), nonce)
    groups = group_owners({rank: owner for rank, (owner, _) in answers.items()})
    everywhere = bool(token) and len(answers) == len(hosts) and all(
        seen == token for _, seen in answers.values())
    return Sharing(groups, everywhere, nonce, tuple(sorted(unmastered)))


def forget_tokens(cluster, workdirs: Dict[int, str], sharing: Sharing,
                  hosts: Optional[Sequence] = None) -> threading.Thread:
    """Every host has read its owner: the tokens go (the workdir is the job's directory),
    in the background, beside whatever comes next; join the thread before exiting. A
    shared directory holds one token, the first host's: that host alone removes it (64
    hosts sharing a home cost one line, not 64)."""
    def remove(host):
        line = remove_line(workdirs[host.rank], sharing.nonce)
        quick = cluster.reused(host)
        try:
            if quick is not None and quick.run(line, timeout=30).exit_code != 255:
                return
        except MultihostError:
            pass
        cluster.transport(host).run(line, timeout=30)

    followers = set(sharing.followers)
    thread = threading.Thread(target=fan_out, daemon=True, args=(
        tuple(h for h in (hosts if hosts is not None else cluster.hosts)
              if h.rank not in followers), remove, cluster.workers))
    thread.start()
    return thread


def code_everywhere(cluster, code_dir: str) -> bool:
    """Whether ``code_dir`` is the same directory, at its own path, on every host: this
    machine's token, written there, is read back by every host (nothing is written on
    the hosts). False where it cannot be written here or a host cannot be asked."""
    nonce = secrets.token_hex(8)
    root = os.path.abspath(code_dir)
    token = mark_code_dir(root, nonce)
    if token is None:
        return False
    line = (f'echo "=code= $(head -n 1 {shlex.quote(os.path.join(root, SHARE_DIR, nonce))} '
            '2>/dev/null)"')
    try:
        results = cluster.map(lambda host, t: t.run(line, timeout=30))
    finally:
        unmark_code_dir(root, nonce)
    return all(r.ok and tagged(r.value.stdout.decode("utf-8", "replace"), "=code= ") == token
               for r in results)


def _shared_mark(label: str, workdir: str) -> str:
    key = hashlib.sha256("\0".join((label, os.path.dirname(workdir.rstrip("/")))).encode())
    return os.path.join(os.path.expanduser(STATE_DIR), key.hexdigest()[:24] + ".shared")


def shared_before(label: str, workdir: str) -> bool:
    """The last probe found this host's workdir, or one beside it (the same parent, as
    every default workdir in a home is), shared with other hosts of its sync."""
    return os.path.exists(_shared_mark(label, workdir))


def remember_shared(label: str, workdir: str, shared: bool) -> None:
    """What the probe found of this host, for ``shared_before`` next time: a guess that
    only decides whether its write waits for the probe (a wrong one costs time once)."""
    path = _shared_mark(label, workdir)
    try:
        if shared:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            open(path, "a").close()
        else:
            os.unlink(path)
    except OSError:
        pass


def checkers_of(groups: Tuple[Tuple[int, ...], ...],
                workdirs: Dict[int, str]) -> Dict[int, int]:
    """For each host of a group but its writer, the host whose check of the written tree
    stands for it (itself: it checks). The probe proved that the group sees one
    directory, so it is checked once, from the group's second host: a client other than
    the one that wrote it, which is what the others are too. A host that names the
    directory by another path than that checker checks itself: the checker's record (its
    root, resolved there) may name another directory, or none, on that host."""
    checker: Dict[int, int] = {}
    for group in groups:
        first = group[1] if len(group) > 1 else None
        for rank in group[1:]:
            same = workdirs.get(rank) == workdirs.get(first)
            checker[rank] = first if same else rank
    return checker


def one_writer_each(cluster, probe: Callable[[], Sharing], workdirs: Dict[int, str],
                    sync_part: Callable[[Any, Dict[int, str]], Any],
                    adopt: Callable[[int, int], None] = lambda rank, checker: None,
                    early: bool = True):
    """The sync's report, one writer and one checker per shared directory: ``probe()``
    finds who shares what (find_sharing); ``sync_part(hosts, writers)`` syncs a subset
    of the cluster (a HostGroup on the same connections); ``writers`` names, for each
    host whose workdir another host has just written, that host.

    With ``early``, the first host is written beside the probe: whoever shares its
    workdir comes after it in rank order, so it writes whatever the probe finds (the
    caller leaves it off for a tree heavy enough for relays unless that host shared its
    workdir last time: hosts with disks of their own written apart cannot relay to each
    other, and the controller would send the heavy files twice). The other hosts with a
    workdir of their own and the first host of each other shared one follow the probe;
    then one other host of each group checks the tree against what its writer recorded
    (one `stat` of every path; where that differs, by size and the time the writer
    stamped, reading only a file that differs): it finds it written, writes nothing,
    and never deletes what another host writes at that moment. The rest of the group is
    counted as verified by that check (``adopt(rank, checker)``: the checker's record
    becomes theirs); where the check failed, each of them checks for itself."""
    started = time.monotonic()
    head = min(cluster.hosts, key=lambda h: h.rank)
    heading = _Part(cluster, sync_part, [head], {}).start() if early else None
    try:
        sharing = probe()
        followers = set(sharing.followers)
        rest = _Part(cluster, sync_part, [h for h in cluster.hosts if h.rank not in followers
                                          and (heading is None or h.rank != head.rank)], {})
        hosts = rest.run()
    except BaseException:
        if heading is not None:
            heading.thread.join()   # no sync goes on behind the error
        raise
    labels = {h.rank: h.label for h in cluster.hosts}
    writers = {rank: labels[sharing.writer_of(rank)] for rank in followers}
    first = heading.join() if heading is not None else rest.report
    hosts.update({h.rank: h for h in first.hosts})
    checker = checkers_of(sharing.groups, workdirs)
    checked = _check(cluster, writers, sync_part, {c for c in checker.values()})
    hosts.update(checked)
    again = {r for r, c in checker.items() if r != c and not checked[c].ok}
    hosts.update(_check(cluster, writers, sync_part, again))
    checked_by = set(checked) | again
    for rank, by in checker.items():
        if rank not in hosts:
            adopt(rank, by)
            if rank in sharing.unmastered:   # as a host the sync wrote would be
                cluster.leave_connection(next(h for h in cluster.hosts if h.rank == rank))
            hosts[rank] = HostSync(labels[rank], rank, checked[by].root, notes=(
                f"shares the workdir of {writers[rank]}: written there once, checked from "
                f"{labels[by]}",))
    shared = tuple(SharedWorkdir(hosts[g[0]].root or workdirs[g[0]], tuple(labels[r] for r in g),
                                 labels[g[0]], tuple(labels[r] for r in g[1:] if r in checked_by))
                   for g in sharing.groups)
    report = replace(first, hosts=tuple(hosts[h.rank] for h in cluster.hosts), shared=shared,
                     seconds=time.monotonic() - started)
    if not report.ok:
        raise sync_error(report)
    return report


class _Part:
    """One part of the sync (``sync_part`` of some hosts), run here or in a thread; its
    report, a failed one included, is what ``run`` and ``join`` give."""

    def __init__(self, cluster, sync_part, hosts, writers: Dict[int, str]):
        self.cluster, self.sync_part, self.hosts, self.writers = cluster, sync_part, hosts, writers
        self.report = None
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._work, daemon=True)

    def start(self) -> "_Part":
        self.thread.start()
        return self

    def _work(self) -> None:
        try:
            self.report = self.sync_part(self.cluster.subset(self.hosts), self.writers)
        except SyncError as err:
            self.report = getattr(err, "report", None)
            if self.report is None:
                self.error = err
        except BaseException as err:  # handed to the thread that joins
            self.error = err

    def join(self):
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.report

    def run(self) -> Dict[int, HostSync]:
        if not self.hosts:
            return {}
        self._work()
        if self.error is not None:
            raise self.error
        return {h.rank: h for h in self.report.hosts}


def _check(cluster, writers: Dict[int, str],
           sync_part: Callable[[Any, Dict[int, str]], Any], ranks) -> Dict[int, HostSync]:
    """The results of ``ranks`` checking the tree their writers just wrote."""
    if not ranks:
        return {}
    try:
        then = sync_part(cluster.subset([h for h in cluster.hosts if h.rank in ranks]),
                         {rank: writers[rank] for rank in ranks})
    except SyncError as err:
        then = getattr(err, "report", None)
        if then is None:
            raise
    note = "shares the workdir of {}: written there once"
    return {h.rank: replace(h, notes=(note.format(writers[h.rank]),) + h.notes) for h in then.hosts}
