"""A relay hop's join without a Python start: the login shell and one ``mkfifo``.

Each hop of a chain is ``ssh NEXT <line>``: sshd starts the user's login shell, and the
join only has to get the pipe from sshd (the shell's stdin) to the node of that host and
wait until the node has read all of it. Python's join (sync_rendezvous.join) does that
over the node's unix socket (SCM_RIGHTS); with the interpreter's start that join is
about 30 ms of CPU a hop, more when 64 hosts start theirs on two cores, where the shell
and its ``mkfifo`` are about 4 ms (bench/join_cpu.py). Here the shell does it:

1. it makes its answer FIFO ``<token>.<its pid>.ans`` in the relay directory (0600) and
   holds it open both ways (an open of a FIFO with nobody at the other end blocks); a
   host's sync session makes that directory as soon as its plan is sent, so it is there
   before the chain starts, even on a host's first relay (where it is not, the shell
   runs Python's join, which waits for the node);
2. waits (bounded) for the node's FIFO ``<token>.<node pid>.join``, writes its pid into
   it (one short write: atomic) and prints the READY line the host before waits for;
3. reads its answer: ``G`` the node opened ``/proc/PID/fd/0`` (for a pipe that is the
   same pipe: the node reads sshd's pipe itself, as with a handed-over descriptor);
   ``P`` it could not (not Linux, stdin not a pipe): the shell runs Python's join, so
   nothing that worked before stops working; ``X`` the node is ending. While no answer
   has come, the shell looks every 2 s whether the node is still there (its pid, its
   FIFO);
4. after ``G`` it drops its own writer of the answer FIFO, so the node ending (or dying)
   without ``D`` is an end of file, never a hang; ``D``: the whole stream was read.

The shell never reads its stdin, nor moves it: its reads name their descriptor (``read
-u``), since a redirection of a builtin (``read <&4``) puts that file at descriptor 0
while it runs, where the node may be looking. The node unlinks an answer FIFO as soon
as it has it open (an ``rm`` would be a second process in every hop); a shell that got
no answer removes its own. The shell join is bash's (``read -t`` with fractions, bash 4
on); any other shell, or anything unexpected, runs Python's join.

A host is untrusted input even here: a pid is taken only from a whole short line of
digits, only when its answer FIFO (named by this sync's token, in this user's private
directory) is a FIFO of this user with a reader, and only a pipe that is the standard
input of a process of this user, not this node itself, is ever opened. Stdlib only,
Python 3.6+.
"""
import errno
import os
import stat

from .sync_pipe import grow_pipe

GO, PYTHON, DROP = b"G", b"P", b"X"     # a node's first answer to a shell join
NODE_SUFFIX, ANSWER_SUFFIX = ".join", ".ans"
MAX_LINE = 16                            # "4194304\n" is 8: anything longer is garbage
# Test hook: set on a host, its nodes answer every shell join "use Python's join", as a
# host where /proc cannot be used does.
PYTHON_JOIN_ENV = "MULTIHOST_RELAY_PYTHON_JOIN"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def join_line(head, python_join):
    """The shell line of a hop: ``head`` (the marker, the helper check), then the shell
    join, falling back to ``python_join`` (``exec PYTHON ... sync.join``). The relay
    appends the quoted request ``{"token": ...}`` as the last word: mhj's ``$1``."""
    return head + _JOIN.replace("@PYTHON_JOIN@", python_join)


# Read in order: mhs (the join; returns only to fall back), mhe (an error answer), mhj.
_JOIN = r"""mhs() {
[ "${BASH_VERSINFO:-0}" -ge 4 ] 2>/dev/null || return
t=${1%\"*}; t=${t##*\"}; D=$HOME/.cache/multihost/relay; A=$D/$t.$$.ans; N=
case $t in *[!0-9a-f]*) return;; esac
[ ${#t} -ge 16 ] && [ ${#t} -le 64 ] && [ -d "$D" ] && mkfifo -m 600 "$A" 2>/dev/null || return
exec 3<>"$A" 4<"$A"
i=0
while :; do
for N in "$D/$t".*.join; do break; done
[ -p "$N" ] && break
[ $i -lt 400 ] || mhe "no relay node started here within 20 s"
i=$((i+1)); read -t 0.05 -u 3 r
done
n=${N%.join}; n=${n##*.}
kill -0 "$n" 2>/dev/null || mhe "the relay node here is gone"
printf '%s\n' $$ 1<>"$N"
printf '%s\n' '{"ready":true}'
i=0
until read -t 2 -u 4 r; do
kill -0 "$n" 2>/dev/null && [ -p "$N" ] && [ $i -lt 600 ] || mhe "the relay node here went away (it never took the stream)"
i=$((i+1))
done
exec 3<&-
[ "$r" = P ] && { exec 4<&-; return; }
[ "$r" = G ] && read -u 4 r
exec 4<&-
[ "$r" = D ] || mhe "the relay node here went away (it ended before the stream did)"
printf '%s\n' '{"ok":true,"result":null}'
exit 0
}
mhe() {
exec 3<&- 4<&-
[ -p "$A" ] && rm -f "$A"
printf '{"ok":false,"error":"%s","fix":"the controller sends this host its files itself"}\n' "$1"
exit 1
}
mhj() { mhs "$1"; exec 3<&- 4<&-; @PYTHON_JOIN@ "$1"; }
mhj"""


class PidLines(object):
    """The pids written into a node's FIFO, from whatever comes: whole lines of 1 to 7
    digits only. A line longer than MAX_LINE is dropped whole, however it is cut into
    reads, so its tail is never taken for a pid."""

    def __init__(self):
        self.partial = b""
        self.skipping = False

    def feed(self, data):
        pids = []
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            if self.skipping:
                self.skipping = False   # the end of an overlong line
                continue
            pid = parse_pid(line)
            if pid is not None:
                pids.append(pid)
        if len(self.partial) > MAX_LINE:
            self.partial, self.skipping = b"", True
        return pids


def parse_pid(line):
    line = line.strip()
    if not 1 <= len(line) <= 7 or not line.isdigit():
        return None
    pid = int(line)
    return pid if pid > 1 else None


class Answer(object):
    """A shell join's answer FIFO, its writer side (the node's end of that join). It
    stands where a Python join's socket does (``sendall``, ``close``)."""

    def __init__(self, fd):
        self.fd = fd

    def sendall(self, word):
        os.write(self.fd, word + b"\n")  # 2 bytes into an empty FIFO: never blocks

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def open_answer(directory, token, pid):
    """The writer side of join ``pid``'s answer FIFO, unlinked once open; None when there
    is none (garbage, a join gone) or it is not a FIFO of this user with a reader."""
    path = os.path.join(directory, "%s.%d%s" % (token, pid, ANSWER_SUFFIX))
    try:
        st = os.lstat(path)
        if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.getuid():
            return None
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | _NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ENXIO:   # no reader: its join is gone
            _unlink(path)
        return None
    _unlink(path)  # the join holds it open; nothing of it is left on the host
    return Answer(fd)


def open_stdin(pid, proc="/proc"):
    """A new descriptor of process ``pid``'s standard input when that is a pipe and the
    process is this user's and not this one; else None. Nothing else is opened: its
    type is checked before the open (no device, terminal or file is ever opened) and
    again after; its directory is held open, so a pid used again in between fails."""
    if pid == os.getpid():
        return None
    try:
        folder = os.open("%s/%d" % (proc, pid), os.O_RDONLY | _DIRECTORY)
    except OSError:
        return None
    try:
        if os.fstat(folder).st_uid != os.getuid():
            return None
        before = os.stat("fd/0", dir_fd=folder)
        if not stat.S_ISFIFO(before.st_mode):
            return None
        fd = os.open("fd/0", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=folder)
    except OSError:
        return None
    finally:
        os.close(folder)
    after = os.fstat(fd)
    same = (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    if not stat.S_ISFIFO(after.st_mode) or not same:
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    grow_pipe(fd)  # sshd keeps writing while the node writes a chunk to disk
    return fd


class JoinFifo(object):
    """A node's FIFO where shell joins write their pids (``<token>.<pid>.join``, 0600).
    The node holds it open both ways: an open never blocks, and it never reads an end
    of file when a join closes its side."""

    def __init__(self, directory, token):
        self.directory = directory
        self.token = token
        self.path = os.path.join(directory, "%s.%d%s" % (token, os.getpid(), NODE_SUFFIX))
        self.lines = PidLines()
        try:
            os.mkfifo(self.path, 0o600)
        except OSError as exc:
            raise _relay_error("cannot make %s: %s" % (self.path, exc.strerror or exc))
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | _NOFOLLOW)
        except OSError as exc:
            _unlink(self.path)
            raise _relay_error("cannot open %s: %s" % (self.path, exc.strerror or exc))

    def fileno(self):
        return self.fd

    def joins(self):
        """[(stdin fd, Answer)] of the shell joins whose pids came: each answered G. One
        whose stdin cannot be opened was answered P (it runs Python's join)."""
        taken = []
        for pid in self._pids():
            answer = open_answer(self.directory, self.token, pid)
            if answer is None:
                continue
            stdin = None if os.environ.get(PYTHON_JOIN_ENV) else open_stdin(pid)
            if stdin is not None and _same_file(stdin, answer.fd):
                stdin = _close(stdin)  # the join's own answer FIFO, not its stdin
            try:
                answer.sendall(PYTHON if stdin is None else GO)
            except OSError:  # its join is gone
                stdin = _close(stdin)
            if stdin is None:
                answer.close()
            else:
                taken.append((stdin, answer))
        return taken

    def _pids(self):
        pids = []
        while True:
            try:
                data = os.read(self.fd, 4096)
            except OSError:  # EAGAIN: all read
                return pids
            if not data:
                return pids
            pids += self.lines.feed(data)

    def close(self):
        """Joins that came too late are told X; the FIFO goes."""
        _unlink(self.path)
        for pid in self._pids():
            answer = open_answer(self.directory, self.token, pid)
            if answer is not None:
                try:
                    answer.sendall(DROP)
                except OSError:
                    pass
                answer.close()
        os.close(self.fd)


def _same_file(one, other):
    a, b = os.fstat(one), os.fstat(other)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _close(fd):
    if fd is not None:
        os.close(fd)
    return None


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _relay_error(message):
    from .sync_rendezvous import RelayError
    return RelayError(message)
