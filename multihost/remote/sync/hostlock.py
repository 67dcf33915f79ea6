"""The part of a workdir's lock that holds across hosts. Stdlib only, Python 3.6+.

POSIX record locks (lock.py) hold between the processes of one host, and across hosts
only as far as the filesystem's lock manager goes: sshfs has none across clients, and
NFS's depends on its server. So the first process of a holder on a host also creates,
exclusively (O_EXCL, atomic on NFS v3 and later and on sshfs), ``<lock>.host``, naming
its host, the host's boot id and its pid beside the holder's record. A process of
another host that finds it there waits for that holder or is refused, naming it.

A file whose holder is gone is known by its host: on the host that wrote it, the same
boot id and a pid no longer alive, or another boot id (the host restarted). Only that
host takes it over (its takers are already one at a time, under lock.py's gate); one
of another host is never taken over, since its pids mean nothing here: the message says
whose it is, and the fix removes it once that host is known to be gone.
"""
import errno
import json
import os
import time

from ..machine import host_name

SUFFIX = ".host"
# An empty or unreadable file this old was left by a create cut short: gone.
UNREADABLE_STALE = 60.0


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _alive(pid):
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError) as exc:
        return getattr(exc, "errno", None) == errno.EPERM  # another user's: alive
    try:   # an exited process its parent has not reaped yet holds nothing
        with open("/proc/%d/stat" % int(pid), "rb") as handle:
            return handle.read().rpartition(b")")[2].split()[:1] != [b"Z"]
    except OSError:
        return True


def stale(found):
    """Left by a holder that is gone: written on this host, and this boot's pid is
    dead or the host has restarted since."""
    if found.get("host") != host_name():
        return False
    return found.get("boot") != boot_id() or not _alive(found.get("pid"))


def read(path):
    """The holder the file names; None when there is no file; {} when it cannot be
    read as one (being written, or damaged: see ``UNREADABLE_STALE``)."""
    for _ in range(25):
        try:   # a link planted in its place is read as what it is: no holder of ours
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as handle:
                text = handle.read(65536).decode("utf-8", "replace").strip()
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            if exc.errno == errno.ELOOP:
                return {}
            raise
        if text:
            try:
                found = json.loads(text)
            except ValueError:
                found = None
            return found if isinstance(found, dict) else {}
        time.sleep(0.02)   # created, not yet written: the writer is a moment behind
    return {}


def _old(path):
    try:
        return time.time() - os.lstat(path).st_mtime > UNREADABLE_STALE
    except OSError:
        return False


def take(path, holder, joins):
    """Name this process as the holder in ``path`` unless a live holder is named there.
    ``joins(found)``: the holder found is this one (another process or host of the same
    sync or run). Returns None once held (or joined), else the live holder found."""
    found, error = {}, None
    for _ in range(5):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                         getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as exc:
            # Over sshfs a create another client won fails with EPERM (an SFTP
            # "failure"), not EEXIST: look at what is there before giving up.
            if exc.errno not in (errno.EEXIST, errno.EPERM, errno.EACCES):
                raise
            error = exc
            found = read(path)
            if found is None:
                continue            # removed meanwhile: try again
            if found and joins(found):
                return None
            if stale(found) or (not found and _old(path)):
                _remove(path)
                continue
            return found
        try:
            os.write(fd, json.dumps(dict(holder, host=host_name(), boot=boot_id(),
                                         pid=os.getpid())).encode())
        finally:
            os.close(fd)
        return None
    if found is None and error is not None:
        raise error   # not there, yet not ours to create: the directory refuses us
    return found


def give_back(path, joins):
    """This host's last process of the holder ends: the file goes, if it names it."""
    try:
        found = read(path)
    except OSError:
        return
    if found and found.get("host") == host_name() and joins(found):
        _remove(path)


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass
