"""The files of a workdir's claim (lock.py) on a host: the lock file, and the marker of a
tree being written. Stdlib only, Python 3.6+.

- The lock file sits beside the workdir, ``<real path>.multihost-lock``, or in
  ``~/.multihost/locks/`` (a run in place, a tree below a sticky or world-writable
  directory such as /tmp, a parent that is not writable: ``lock_path``). It is opened
  without following links, and must be a plain file of ours (``open_lock``).
- Before the first change a sync writes ``.multihost-incomplete`` into the workdir
  (fsync'd); the last of its parts to end cleanly removes it. A run refuses a marked
  tree (lock.py, ``refuse_unfinished``): a sync killed half way left old and new files.
"""
import errno
import os
import stat

from ..machine import host_dir
from .. import owners
from .fs import tree_key

SUFFIX = ".multihost-lock"
MARKER = ".multihost-incomplete"
FALLBACK_DIR = "~/.multihost/locks"


def lock_path(root, in_place=False):
    """Beside the workdir (what every user of it can find), else in the home directory:
    for a run in place (beside it would be the parent's, ``/run.multihost-lock`` for a
    run in ``/run``), for a tree below a directory others may write (``/tmp``: anyone
    could put a file or a link there first), and for one whose parent is not ours to
    write. Once a tree's lock is in the home directory it stays there, which is also
    where the no-change check (sync/fastpath.py) looks first."""
    real = os.path.realpath(root).rstrip("/") or "/"
    home = os.path.join(host_dir(FALLBACK_DIR), tree_key(root) + SUFFIX)
    if in_place or os.path.exists(home) or _below_shared(real):
        return home
    beside = real + SUFFIX
    parent = os.path.dirname(beside)
    if os.path.lexists(beside) or os.access(parent, os.W_OK):
        return beside
    if not os.path.isdir(parent):
        try:
            os.makedirs(parent, exist_ok=True)
            return beside
        except OSError:
            pass
    return home


def _below_shared(real):
    """Is a directory above ``real`` sticky or writable by everyone?"""
    path = os.path.dirname(real)
    while True:
        try:
            if os.stat(path).st_mode & 0o1002:
                return True
        except OSError:
            pass
        if path in ("/", ""):
            return False
        path = os.path.dirname(path)


def open_lock(path):
    """The lock file, opened without following a link (one planted in its place would
    have us truncate and write whatever it names), made by us if new, refused when
    another user's or not a plain file."""
    directory, name = os.path.split(path)
    dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                     0o644, dir_fd=dfd)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        info = os.lstat(name, dir_fd=dfd)
        raise OSError(errno.EPERM, "it is a link (owner %s, to %s), not a lock file of yours"
                      % (owners.user_name(info.st_uid), os.readlink(name, dir_fd=dfd)[:200]))
    finally:
        os.close(dfd)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink != 1:
        os.close(fd)
        raise OSError(errno.EPERM, "it is %s, not a lock file of yours"
                      % owners.describe(path, info))
    return fd


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_marker(root, text):
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, MARKER)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        os.write(fd, ("%s\n" % text).encode("utf-8", "replace"))
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(root)


def remove_marker(root):
    try:
        os.unlink(os.path.join(root, MARKER))
    except OSError:
        return
    _fsync_dir(root)


def marked(root):
    """What the marker of an unfinished write says, or None when the tree is complete."""
    try:
        with open(os.path.join(root, MARKER), "rb") as handle:
            return handle.read(4096).decode("utf-8", "replace").strip() or "a sync"
    except OSError:
        return None
