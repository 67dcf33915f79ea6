"""Which machine this is: for telling two entries of a hostfile apart, and for keeping
each host's own state apart where hosts share a home directory (NFS homes). Stdlib only."""
import errno
import hashlib
import os
import time

# The file in a state directory (~/.multihost, ~/.cache/multihost) naming the host that
# keeps its state there; every other host that sees the same directory keeps its own in
# hosts/<its name>/ below it.
OWNER = "host"
HOSTS = "hosts"
_dirs = {}


def machine_identity():
    """What tells two entries of a hostfile apart as machines: the kernel's boot id (one
    per running kernel) and the network namespace (containers on one kernel are separate
    hosts, with their own ports). Two entries with the same pair are one machine, reached
    twice (localhost and 127.0.0.1, or two addresses of one host). None if unreadable."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return "%s/%s" % (boot, os.readlink("/proc/self/ns/net"))
    except OSError:
        return None


def host_name():
    """A name for this host that outlives a reboot and differs between the hosts that
    share a home: the host name, and a hash of the machine id (cloned images can share
    one, diskless nodes booted from one image share it; host names tell those apart)."""
    node = os.uname()[1] or "host"
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path) as f:
                machine = f.read().strip()
        except OSError:
            continue
        if machine:
            return "%s-%s" % (node, hashlib.sha256(machine.encode()).hexdigest()[:8])
    return node


def _read_owner(path):
    """The owner named in ``path`` (None when the file is missing). A claim is written
    with one write after an exclusive create: an empty file is a claim being written."""
    for _ in range(50):
        try:
            with open(path) as f:
                text = f.read(256).strip()
        except (IOError, OSError) as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        if text:
            return text
        time.sleep(0.02)
    return ""


def _claim(base, path, me):
    """Name this host as the owner of ``base`` unless one already is (exclusive create:
    it holds on NFS, where flock does not). Returns the owner."""
    owner = _read_owner(path)
    if owner is not None:
        return owner
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        # sshfs says EPERM where another client's file is there (an SFTP "failure"),
        # and its cache may have said "missing" a moment before: read it again.
        owner = _read_owner(path) if exc.errno in (errno.EEXIST, errno.EPERM, errno.EACCES) \
            else None
        if owner is None:
            raise
        return owner
    try:
        os.write(fd, (me + "\n").encode())
    finally:
        os.close(fd)
    return me


def host_dir(base, make=True):
    """This host's own directory for state under ``base`` (``~/.multihost``): ``base``
    itself on a host whose home is its own (or the first host that used a shared one),
    ``base/hosts/<host name>`` on every other host that sees the same directory. Run
    records, locks, caches and node state then never meet another host's, whatever is
    shared. Where nothing can be written, ``base`` (the error comes from the writer).
    ``make=False`` (a reader): a missing ``base`` is left missing, and nothing is kept."""
    base = os.path.expanduser(base)
    if base in _dirs:
        return _dirs[base]
    if not make and not os.path.isdir(base):
        return base
    me = host_name()
    try:
        _makedirs(base)
        owner = _claim(base, os.path.join(base, OWNER), me)
    except OSError:
        owner = me
    found = base if owner == me else os.path.join(base, HOSTS, me)
    if found != base:
        try:
            _makedirs(found)
        except OSError:
            pass
    _dirs[base] = found
    return found


def _makedirs(path):
    """``mkdir -p`` (0700) that another host may be doing at the same moment: over sshfs
    the loser's mkdir fails with EPERM, not EEXIST, so it looks again before giving up."""
    for _ in range(50):
        try:
            if not os.path.isdir(path):
                os.makedirs(path, 0o700)
            return
        except OSError:
            if os.path.isdir(path):
                return
            time.sleep(0.05)
    os.makedirs(path, 0o700)
