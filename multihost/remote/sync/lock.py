"""One writer per workdir on a host, and a tree being written marked until complete.
Stdlib only, Python 3.6+.

Two shells syncing different code into one workdir at once would each write some files
and leave a mix that neither made; a sync into the workdir of a running job replaces its
code under it. So every process that writes a workdir for a sync (its session, a relay
node, a later stream) holds a claim on it for its life, and so does a run's supervisor:

- The lock file sits beside the workdir or in ``~/.multihost/locks/`` (lock_files.py
  says where, and opens it safely). Byte 0 is a gate, held for a moment while a claim
  is decided; byte 1 is held shared by every live process of the holder. POSIX record locks go with their process: a killed holder leaves nothing
  to clean up, and the next writer finds byte 1 free and takes over.
- POSIX record locks hold across hosts only as far as the filesystem's lock manager
  goes (sshfs: not at all), and a workdir may be one directory on many hosts (NFS):
  so a holder's first process on a host also creates ``<lock>.host`` exclusively,
  naming its host, boot id and pid (hostlock.py). Another host finds it there and waits
  or is refused as below; one left by a holder that is gone is taken over by its host.
- Its first line is the workdir's generation, raised by the first write of every sync;
  the second names the holder (user, what, pid, since) for the message of whoever is
  refused. The no-change check reads the generation with `read` (sync/fastpath.py), so
  a change sent from the controller's record is applied only if nobody wrote since.
- A process of the holding sync joins it; an older sync waits a bounded time for it to
  end, a younger one is refused at once naming it (two syncs that each hold some hosts
  never wait for each other); a run's claim is never waited for (the fix stops it).
- Before the first change a sync marks the tree incomplete (lock_files.py); the last
  of its parts to end cleanly unmarks it. A run refuses a marked tree
  (``refuse_unfinished``): a sync killed half way left old and new files.
"""
import errno
import fcntl
import getpass
import json
import os
import time

from ..machine import host_name
from . import hostlock
from .lock_files import lock_path, marked, open_lock, remove_marker, write_marker

GATE, HOLDERS = 0, 1
SAY_EVERY = 10.0
STALE = "was written by another sync since it was checked"


class Busy(Exception):
    """The workdir is someone else's now: ``holder`` says whose, ``fix`` what to do."""

    def __init__(self, text, fix, holder=None):
        Exception.__init__(self, text)
        self.text, self.fix, self.holder = text, fix, holder or {}


def describe(holder):
    """'root's multihost sync from ctl (pid 812) since 16:02:11' for a message."""
    since = time.strftime("%H:%M:%S", time.localtime(float(holder.get("since") or 0)))
    who = holder.get("user") or "someone"
    where = ""
    if holder.get("host") and holder.get("host") != host_name():
        where = " on %s" % holder["host"]   # a workdir other hosts share
    return "%s's %s (pid %s%s) since %s" % (who, holder.get("what") or "writer",
                                            holder.get("pid"), where, since)


def _lock(fd, kind, offset, wait=False):
    flags = kind if wait or kind == fcntl.LOCK_UN else kind | fcntl.LOCK_NB
    try:
        fcntl.lockf(fd, flags, 1, offset)
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


class Claim(object):
    """This process's claim on a workdir. ``claim``: the controller's {"id": the sync's
    or run's id, "kind": "sync" or "run", "what": what to call it, "wait": seconds to
    wait for another sync, "born": when the sync began (the older one waits), "gen": the
    generation its plan was made at (a later helper of a sync, or a stream worked out from
    the controller's record: refused if another sync wrote since)}."""

    def __init__(self, root, claim):
        self.root = root
        self.claim = dict(claim)
        self.path = lock_path(root, bool(claim.get("in_place")))
        self.fd = None
        self.marked = False
        self.waited = 0.0
        self.waited_for = None
        self.part = claim.get("part")
        self.gen = None         # the generation found when the claim was taken
        self.held = False       # taken: on giving back, the last of this host unnames it

    # -- taking and giving back ---------------------------------------------------------
    def take(self, say=None):
        """Hold the workdir (joining the holder when it is this very sync or run), or
        raise Busy (also when the lock cannot be opened or written: a full disk, a lock
        of another user). ``say(text)`` is told once a wait begins."""
        try:
            return self._take(say)
        except OSError as exc:
            self.give_back()
            raise Busy("cannot take the lock %s: %s" % (self.path, exc.strerror or exc),
                       "free space there, or make it (and the workdir's parent) writable "
                       "for you", {"error": True})

    def _take(self, say):
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=0o700, exist_ok=True)
        self.fd = open_lock(self.path)
        began = time.time()
        told = None
        while True:
            holder = self._try()
            if holder is None:
                self.waited = time.time() - began
                return self
            waited = time.time() - began
            self.waited_for = describe(holder)
            if not self._may_wait(holder) or waited >= float(self.claim.get("wait") or 0):
                self.give_back()
                raise self._busy(holder, waited)
            if say is not None and (told is None or time.time() - told >= SAY_EVERY):
                told = time.time()
                say("waiting for %s to finish with %s" % (describe(holder), self.root))
            time.sleep(0.2)

    def _try(self):
        """None once held; else the live holder that stands in the way."""
        _lock(self.fd, fcntl.LOCK_EX, GATE, wait=True)
        try:
            gen, holder = self._read()
            self.gen = gen
            if self._joins(holder):
                if _lock(self.fd, fcntl.LOCK_SH, HOLDERS):
                    self.held = True
                    return None
                return holder   # the holder is being taken over this very moment
            if not _lock(self.fd, fcntl.LOCK_EX, HOLDERS):
                return holder
            # Nobody holds it: ours, unless our plan is older than the last write.
            expected = self.claim.get("gen")
            if expected is not None and str(expected) != str(gen):
                _lock(self.fd, fcntl.LOCK_UN, HOLDERS)
                raise Busy("the workdir %s %s" % (self.root, STALE), "run the sync again", holder)
            mine = {"id": self.claim.get("id"), "kind": self.claim.get("kind"),
                    "what": self.claim.get("what"), "born": self.claim.get("born"),
                    "user": _user(), "pid": os.getpid(), "since": time.time()}
            elsewhere = hostlock.take(self.path + hostlock.SUFFIX, mine, self._joins)
            if elsewhere is not None:   # a holder on another host that shares the workdir
                _lock(self.fd, fcntl.LOCK_UN, HOLDERS)
                return elsewhere
            self._write(gen, mine)
            _lock(self.fd, fcntl.LOCK_SH, HOLDERS, wait=True)  # downgrade: others may join
            self.held = True
            return None
        finally:
            _lock(self.fd, fcntl.LOCK_UN, GATE)

    def _joins(self, holder):
        """``holder`` is this very sync (or a run, as runs join each other)."""
        return holder.get("id") == self.claim.get("id") or \
            (holder.get("kind") == "run" and self.claim.get("kind") == "run")

    def _may_wait(self, holder):
        """A run is never waited for, nor waits. Of two syncs, only the older waits for
        the younger: two that each hold some hosts and want the others' would otherwise
        wait for each other until both gave up (wait-die, as databases order waits)."""
        if holder.get("kind") == "run" or self.claim.get("kind") == "run":
            return False
        mine = (float(self.claim.get("born") or 0), str(self.claim.get("id")))
        theirs = (float(holder.get("born") or 0), str(holder.get("id")))
        return mine < theirs

    def _busy(self, holder, waited):
        busy = self._busy_here(holder, waited)
        host = holder.get("host")
        if host and host != host_name():   # its pid can be checked on that host only
            busy.fix += ("; if %s is down for good, remove its hold: rm %s"
                         % (host, self.path + hostlock.SUFFIX))
        return busy

    def _busy_here(self, holder, waited):
        who = describe(holder)
        if holder.get("kind") == "run":
            run_id = str(holder.get("id") or "").partition(":")[2] or "RUN"
            stop = "stop it first (`multihost stop %s`)" % run_id
            if holder.get("user") and holder.get("user") != _user():
                stop = "ask %s to stop it" % holder["user"]  # not ours to stop
            return Busy("the workdir %s is in use by run %s: %s" % (self.root, run_id, who),
                        "%s, or sync into another --workdir" % stop, holder)
        if self.claim.get("kind") == "run":
            return Busy("a sync is writing the workdir %s: %s" % (self.root, who),
                        "wait for it to finish, then run again", holder)
        waits = " (waited %d s)" % waited if waited >= 1 else ""
        return Busy("the workdir %s is being written by %s%s" % (self.root, who, waits),
                    "wait for it to finish, then sync again", holder)

    def give_back(self):
        if self.fd is None:
            return
        try:
            if self.held:
                self._unname()
        finally:
            os.close(self.fd)  # every record lock of this process on the file goes with it
            self.fd = None
            self.held = False

    def _unname(self):
        """The last process of this holder on this host removes its ``.host`` file."""
        try:
            _lock(self.fd, fcntl.LOCK_EX, GATE, wait=True)
        except OSError:
            return
        try:
            if _lock(self.fd, fcntl.LOCK_EX, HOLDERS):   # no other process here holds it
                hostlock.give_back(self.path + hostlock.SUFFIX, self._joins)
        except OSError:
            pass
        finally:
            _lock(self.fd, fcntl.LOCK_UN, GATE)

    # -- the record ------------------------------------------------------------------
    def _read(self):
        try:
            data = os.pread(self.fd, 65536, 0).decode("utf-8", "replace")
        except OSError:
            data = ""
        first, _, rest = data.partition("\n")
        try:
            holder = json.loads(rest.strip() or "{}")
        except ValueError:
            holder = {}
        gen = first.strip() or "0"
        return gen, holder if isinstance(holder, dict) else {}

    def _write(self, gen, holder, durable=False):
        """Only a raised generation is worth an fsync (every sync's takeover is not):
        lost with the host's power, it could let a stale change through."""
        data = ("%s\n%s\n" % (gen, json.dumps(holder, separators=(",", ":")))).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)
        if durable:
            os.fsync(self.fd)

    # -- the marker ------------------------------------------------------------------
    def mark(self):
        """Before this process's first change: the tree is marked incomplete, and the
        first writer of this sync raises the generation."""
        if self.marked:
            return
        _lock(self.fd, fcntl.LOCK_EX, GATE, wait=True)
        try:
            gen, holder = self._read()
            if not holder.get("wrote"):
                try:
                    gen = str(int(gen) + 1)
                except ValueError:
                    gen = "1"
                self._write(gen, dict(holder, wrote=True), durable=True)
        finally:
            _lock(self.fd, fcntl.LOCK_UN, GATE)
        write_marker(self.root, describe(holder))
        self.marked = True

    def finish(self, clean):
        """This process ends: when it ended cleanly and was the last of its pass's
        ``part`` ([pass, how many streams]), the tree is complete: unmark it."""
        if self.fd is None:
            return
        try:
            if clean and self.part:
                _lock(self.fd, fcntl.LOCK_EX, GATE, wait=True)
                try:
                    gen, holder = self._read()
                    parts = dict(holder.get("parts") or {})
                    key = str(self.part[0])
                    parts[key] = int(parts.get(key) or 0) + 1
                    self._write(gen, dict(holder, parts=parts))
                    if parts[key] >= int(self.part[1]):
                        remove_marker(self.root)
                finally:
                    _lock(self.fd, fcntl.LOCK_UN, GATE)
        finally:
            self.give_back()


def _user():
    try:
        return getpass.getuser()
    except Exception:  # no name for this uid (a container): the number says enough
        return str(os.getuid())


UNFINISHED_FIX = ("sync it first: run again without --no-sync (or `multihost sync` to the "
                  "same hosts and --workdir)")


def run_claim(run_id, in_place=False):
    return {"id": "run:%s" % run_id, "kind": "run", "what": "run %s" % run_id,
            "in_place": in_place}


def refuse_unfinished(root, fix=UNFINISHED_FIX):
    """For a run about to start in ``root``: a Busy naming why its code cannot be trusted."""
    said = marked(root)
    if said is not None:
        raise Busy("the code in %s is incomplete: a sync into it did not finish (%s)"
                   % (root, said), fix)


def _run_claim_taken(root, run_id, in_place=False):
    """A run's claim on ``root``; None when its lock cannot be opened at all (a lock of
    another user): that stops no run, only a sync that would write under it does."""
    try:
        return Claim(root, run_claim(run_id, in_place)).take()
    except Busy as busy:
        if busy.holder.get("error"):
            return None
        raise


def check_for_run(root, run_id, in_place=False):
    """Before a run prepares: no sync is writing ``root`` now, and none left it half
    written. (Its supervisor then holds it for the run's life: ``hold_for_run``.)"""
    claim = _run_claim_taken(root, run_id, in_place)
    if claim is not None:
        claim.give_back()
    refuse_unfinished(root)


def hold_for_run(root, run_id, in_place=False):
    """The supervisor's claim on its workdir, held until it exits; a Busy if a sync got
    there since the prepare or left the tree half written."""
    claim = _run_claim_taken(root, run_id, in_place)
    try:
        refuse_unfinished(root)
    except Busy:
        if claim is not None:
            claim.give_back()
        raise
    return claim
