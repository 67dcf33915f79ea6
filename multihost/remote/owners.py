"""Whose is this directory: a directory another account may change is not one to run code
from or write into. Stdlib only, Python 3.6+.

A workdir another user owns, or may write, lets that user swap the code between the sync
and the launch: her script then runs as us (as root, when root runs the job). The same
goes for every directory above it that lies below a world-writable one (``/tmp/a/job``:
whoever owns ``/tmp/a`` may rename ``job`` away and put her own in its place), and for
a symbolic link on the way that another user made (in a sticky ``/tmp`` she can plant
``/tmp/job -> /her/dir``). This is sshd's StrictModes rule, with Debian's allowance for
a group that is the user's own (umask 002 with user private groups) and with sticky
world-writable directories like /tmp allowed above the workdir. Directories of the system
itself (``/etc``, ``/usr``, ``/``) are never a job's directory either.
"""
import grp
import os
import pwd
import stat

# Directories of the system itself, and where merged-/usr systems resolve /bin, /sbin
# and /lib to. Only the directory itself: /usr/local/myjob is somebody's choice.
SYSTEM_DIRS = frozenset((
    "/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run",
    "/sbin", "/sys", "/usr", "/var", "/usr/bin", "/usr/lib", "/usr/lib32", "/usr/lib64",
    "/usr/sbin",
))
MAX_LINKS = 40   # as the kernel's ELOOP


def user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # no passwd entry (a container): the number says enough
        return str(uid)


def _private_group(gid, uid):
    """A group that is the user's own (user private groups): its name is the user's and
    nobody else is listed in it, so group write gives no other account anything."""
    try:
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return group.gr_name == user_name(uid) and set(group.gr_mem) <= {user_name(uid)}


def _others_may_write(info, uid):
    if info.st_mode & 0o002:
        return "anyone"
    if info.st_mode & 0o020 and not _private_group(info.st_gid, uid):
        try:
            return "group %s" % grp.getgrgid(info.st_gid).gr_name
        except KeyError:
            return "group %d" % info.st_gid
    return None


def describe(path, info):
    """'/tmp/job (owner alice, mode 0777)'."""
    return "%s (owner %s, mode %04o)" % (path, user_name(info.st_uid), stat.S_IMODE(info.st_mode))


def _walk(path):
    """The directories (and links) met on the way to ``path``, as [(path, lstat)], links
    followed (each listed itself, then its target's way); stops at the first missing one
    (the sync makes the rest, as ours)."""
    met, pending, current, links = [], [p for p in path.split("/") if p], "/", 0
    met.append(("/", os.lstat("/")))
    while pending:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = os.path.dirname(current) or "/"
            continue
        nxt = os.path.join(current, name)
        try:
            info = os.lstat(nxt)
        except OSError:
            break
        met.append((nxt, info))
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > MAX_LINKS:
                break
            target = os.readlink(nxt)
            if target.startswith("/"):
                current = "/"
            pending = [p for p in target.split("/") if p] + pending
            continue
        current = nxt
    return met


def why_unsafe(path, uid=None):
    """Why another account could change what is in directory ``path`` (absolute), naming
    the directory or link, its owner and mode; None when only we (or root) can."""
    uid = os.geteuid() if uid is None else uid
    trusted = (0, uid)
    met = _walk(os.path.abspath(path))
    final = os.path.realpath(path)
    shared_above = False   # below a world-writable directory: every step on is checked
    for where, info in met:
        if stat.S_ISLNK(info.st_mode):
            if info.st_uid not in trusted:
                return "%s is a link made by %s (to %s)" % (
                    where, user_name(info.st_uid), os.readlink(where)[:200])
            continue
        last = where == final
        if last or shared_above:
            if info.st_uid not in trusted:
                return "%s belongs to %s (mode %04o)" % (
                    where, user_name(info.st_uid), stat.S_IMODE(info.st_mode))
            writer = _others_may_write(info, uid)
            if writer and (last or not info.st_mode & stat.S_ISVTX):
                return "%s may be written by %s" % (describe(where, info), writer)
        if info.st_mode & 0o002:
            if not info.st_mode & stat.S_ISVTX and not last:
                # anyone may rename what is in it: no sticky bit keeps our directory ours
                return "%s may be written by anyone and is not sticky" % describe(where, info)
            shared_above = True
    return None


def is_system_dir(path):
    return os.path.realpath(path) in SYSTEM_DIRS


def fix_for(path, reason):
    """A fix that changes only what is ours: our own directory made private, else
    another directory."""
    try:
        info = os.lstat(path)
    except OSError:
        info = None
    if info is not None and stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() \
            and reason.startswith(path + " ") and "may be written" in reason:
        return "make it yours alone: chmod go-w %s" % _quote(path)
    return "use a directory only you can write (e.g. under your home directory)"


def _quote(text):
    if text and all(c.isalnum() or c in "/._-+:@%=," for c in text):
        return text
    return "'" + text.replace("'", "'\"'\"'") + "'"
