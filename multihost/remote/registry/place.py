"""Where the host's registry of runs is (holds.py), and whether it can be trusted: the
one directory every user of a host shares, in /tmp, where anyone can plant a link or a
directory of her own first. It is used only as root made it (a directory, not a link,
owned by root, mode 1777); otherwise each user's runs keep their entries in
``~/.multihost/holds/<hostname>`` (per host: a home may be shared by several), seen by
that user's own runs only, and ``shared_trouble`` says why. Stdlib only, Python 3.6+.
"""
import fcntl
import os
import pwd
import socket
import stat
import time

DIR = "/tmp/multihost-holds"
PERSONAL = "~/.multihost/holds"
LOCK_WAIT = 10          # seconds: writers hold the registry's flock for milliseconds


def user_of(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def holds_dir():
    return os.environ.get("MULTIHOST_HOLDS_DIR") or DIR


def personal_dir():
    return os.path.join(os.path.expanduser(PERSONAL), socket.gethostname()[:64] or "host")


def root_fix(base):
    """What root types to make the registry anew: ``rm`` takes a link away, never its
    target, and ``mkdir`` fails on anything that is there again (nothing of anyone else's
    changes mode or owner)."""
    return "as root on that host: `rm -rf %s && mkdir -m 1777 %s`" % (base, base)


def shared_trouble(base=None):
    """Why the host's registry can not be used as it is (None when it can): a link, not a
    directory, not made by root, not writable by us."""
    base = base or holds_dir()
    try:
        info = os.lstat(base)
    except FileNotFoundError:
        if os.geteuid() == 0:
            return None   # root makes it
        return "there is no host registry %s yet (root makes it)" % base
    except OSError as exc:
        return "the host registry %s can not be read: %s" % (base, exc.strerror)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
        what = "a link" if stat.S_ISLNK(info.st_mode) else "a directory" \
            if stat.S_ISDIR(info.st_mode) else "not a directory"
        return "the host registry %s is %s of %s (mode %04o), not root's: not used" % (
            base, what, user_of(info.st_uid), stat.S_IMODE(info.st_mode))
    if os.geteuid() != 0 and (info.st_mode & 0o1777) != 0o1777:
        return "the host registry %s is mode %04o, not 1777: not used" % (
            base, stat.S_IMODE(info.st_mode))
    return None


class Unwritable(Exception):
    pass


def ensure_dir():
    """The directory this user's entries go to: the host registry when it can be
    trusted (root makes it, mode 1777, without following anything planted), else this
    user's own fallback."""
    base = holds_dir()
    if shared_trouble(base) is None:
        if os.geteuid() != 0:
            return base
        try:
            os.mkdir(base, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return _personal()
        fd = os.open(base, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_DIRECTORY", 0))
        try:
            info = os.fstat(fd)
            if info.st_uid == 0 and stat.S_ISDIR(info.st_mode):
                if stat.S_IMODE(info.st_mode) != 0o1777:
                    os.fchmod(fd, 0o1777)   # the umask took the bits others need
                return base
        finally:
            os.close(fd)
    return _personal()


def _personal():
    path = personal_dir()
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


class locked(object):
    """``with locked() as base:`` the registry's flock (on the directory itself: no file
    that one user creates and another can not open), and where this user's entries go.
    Advisory: a flock someone keeps is waited for a bounded time, then gone without."""

    def __enter__(self):
        self.base = ensure_dir()
        self.fd = os.open(self.base, os.O_RDONLY | os.O_NOFOLLOW)
        deadline = time.time() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self.base
            except OSError:
                if time.time() > deadline:
                    return self.base
                time.sleep(0.05)

    def __exit__(self, *exc):
        os.close(self.fd)


