"""Writing a tree safely on a host: the receiving end of a sync. Stdlib only, 3.6+.

Every path is walked from the tree's root one component at a time with O_NOFOLLOW on
directory file descriptors, so no write can leave the tree through a symlink, whatever
the sender's manifest says ('..' and absolute paths are refused before that). A file
is written to a temporary name in its own directory, checked against its hash, given
its mode and mtime, then renamed over the old one: a reader never sees half a file, and
a sync cut at any point leaves each file either old or new.
"""
import errno
import hashlib
import os
import stat

from .fs import MODE_BITS, TMP_PREFIX, UnsafePath, check_relpath

O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | \
    getattr(os, "O_CLOEXEC", 0)
MAX_OPEN_DIRS = 256


class ApplyError(Exception):
    """One entry could not be applied; the rest of the stream goes on."""


def tmp_name(name):
    if len(name) > 180:  # keep within NAME_MAX with the prefix
        name = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return "%s%d.%s" % (TMP_PREFIX, os.getpid(), name)


def _split(rel):
    head, _, name = rel.rpartition("/")
    return head, name


class SafeRoot(object):
    """A tree's root, opened once; every path below it is resolved without following."""

    def __init__(self, root, create=True):
        self.root = root
        if create:
            os.makedirs(root, exist_ok=True)
        self.dirs = {"": os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))}

    def close(self):
        for fd in self.dirs.values():
            os.close(fd)
        self.dirs = {}

    def _forget(self, rel_dir):
        """Drop cached descriptors of rel_dir and below (it was removed or replaced)."""
        prefix = rel_dir + "/"
        for key in [k for k in self.dirs if k == rel_dir or k.startswith(prefix)]:
            if key:
                os.close(self.dirs.pop(key))

    def dir_fd(self, rel_dir, create=False):
        """The directory ``rel_dir`` (a path inside the tree, '' for the root)."""
        fd = self.dirs.get(rel_dir)
        if fd is not None:
            return fd
        if len(self.dirs) > MAX_OPEN_DIRS:
            self._forget_all()
        parent_rel, name = _split(rel_dir)
        parent = self.dir_fd(parent_rel, create)
        try:
            fd = os.open(name, O_DIR, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ENOENT and create:
                try:
                    os.mkdir(name, 0o755, dir_fd=parent)
                except OSError as again:
                    if again.errno != errno.EEXIST:
                        raise ApplyError("cannot create directory %s: %s" % (rel_dir, again.strerror))
                fd = self._open_existing(rel_dir, name, parent)
            elif exc.errno == errno.ENOENT:
                raise
            else:
                fd = self._open_existing(rel_dir, name, parent, exc)
        self.dirs[rel_dir] = fd
        return fd

    def _open_existing(self, rel_dir, name, parent, first=None):
        try:
            return os.open(name, O_DIR, dir_fd=parent)
        except OSError as exc:
            exc = first or exc
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
                raise UnsafePath("%s is %s on this host: refusing to write through it" % (rel_dir, what))
            raise ApplyError("cannot open directory %s: %s" % (rel_dir, exc.strerror))

    def _forget_all(self):
        for key in [k for k in self.dirs if k]:
            os.close(self.dirs.pop(key))

    def lstat(self, rel):
        """lstat of a path in the tree; None when it (or a parent directory) is missing
        or a parent is not a real directory."""
        parent_rel, name = _split(check_relpath(rel))
        try:
            parent = self.dir_fd(parent_rel)
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        except (OSError, UnsafePath, ApplyError):
            return None

    def _clear_dir_for(self, rel, parent, name):
        """Something else is to be put where a directory is: only an empty one goes."""
        try:
            os.rmdir(name, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise ApplyError("%s is a directory on this host holding files multihost did "
                                 "not put there; move them away" % rel)
            raise ApplyError("cannot remove directory %s: %s" % (rel, exc.strerror))
        self._forget(rel)

    def _place(self, tmp, rel, parent, name):
        """Rename tmp over name (atomic); a directory in the way must be empty."""
        try:
            old = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            self._clear_dir_for(rel, parent, name)
        os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)

    def write_file(self, rel, chunks, mode, mtime_ns, digest):
        """Write a file from ``chunks`` atomically. Returns its stat after the rename.
        The chunks are always consumed, even when the file is refused."""
        parent_rel, name = _split(check_relpath(rel))
        try:
            parent = self.dir_fd(parent_rel, create=True)
        except (UnsafePath, ApplyError):
            for _ in chunks:
                pass
            raise
        tmp = tmp_name(name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) |
                     getattr(os, "O_CLOEXEC", 0), 0o600, dir_fd=parent)
        placed = False
        try:
            hasher = hashlib.sha256()
            for data in chunks:
                hasher.update(data)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            if hasher.hexdigest() != digest:
                raise ApplyError("%s changed on the sender while it was sent; sync again" % rel)
            os.fchmod(fd, mode & MODE_BITS)
            os.utime(fd, ns=(mtime_ns, mtime_ns))
            os.close(fd)
            fd = None
            self._place(tmp, rel, parent, name)
            placed = True
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        finally:
            if fd is not None:
                os.close(fd)
            if not placed:
                try:
                    os.unlink(tmp, dir_fd=parent)
                except OSError:
                    pass

    def make_link(self, rel, target):
        parent_rel, name = _split(check_relpath(rel))
        parent = self.dir_fd(parent_rel, create=True)
        try:
            if os.readlink(name, dir_fd=parent) == target:
                return os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            pass
        tmp = tmp_name(name)
        os.symlink(target, tmp, dir_fd=parent)
        try:
            self._place(tmp, rel, parent, name)
        except BaseException:
            os.unlink(tmp, dir_fd=parent)
            raise
        return os.stat(name, dir_fd=parent, follow_symlinks=False)

    def make_dir(self, rel, mode):
        """A directory (owner-writable until finish_dir), replacing a file or link."""
        parent_rel, name = _split(check_relpath(rel))
        parent = self.dir_fd(parent_rel, create=True)
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent)  # the manifest has a directory here
            st = None
        if st is None:
            try:
                os.mkdir(name, 0o700, dir_fd=parent)
            except OSError as exc:
                if exc.errno != errno.EEXIST:
                    raise ApplyError("cannot create directory %s: %s" % (rel, exc.strerror))
        fd = self.dir_fd(rel)
        current = os.fstat(fd).st_mode & MODE_BITS
        if current | 0o700 != current:
            os.fchmod(fd, current | 0o700)

    def finish_dir(self, rel, mode):
        fd = self.dir_fd(rel)
        if os.fstat(fd).st_mode & MODE_BITS != mode & MODE_BITS:
            os.fchmod(fd, mode & MODE_BITS)
        return os.fstat(fd)

    def set_meta(self, rel, mode, mtime_ns):
        """New mode or mtime for a file whose content is already right."""
        parent_rel, name = _split(check_relpath(rel))
        parent = self.dir_fd(parent_rel)
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise ApplyError("%s is no longer a regular file" % rel)
        if st.st_mode & MODE_BITS != mode & MODE_BITS:
            os.chmod(name, mode & MODE_BITS, dir_fd=parent)  # checked above: not a link
        if st.st_mtime_ns != mtime_ns:
            os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=parent, follow_symlinks=False)
        return os.stat(name, dir_fd=parent, follow_symlinks=False)

    def delete(self, rel):
        """Remove a file, link or empty directory: 'deleted', 'missing' or 'kept' (a
        directory still holding files multihost did not put there)."""
        parent_rel, name = _split(check_relpath(rel))
        try:
            parent = self.dir_fd(parent_rel)
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            return "missing"
        if stat.S_ISDIR(st.st_mode):
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    return "kept"
                raise
            self._forget(rel)
        else:
            os.unlink(name, dir_fd=parent)
        return "deleted"

    def clean_stale_tmp(self, rel_dir):
        """Remove temporary files left by a receiver that was killed (its pid is gone)."""
        try:
            fd = self.dir_fd(rel_dir)
            names = [n for n in os.listdir(fd) if n.startswith(TMP_PREFIX)]
        except (OSError, UnsafePath, ApplyError):
            return 0
        removed = 0
        for name in names:
            pid_text = name[len(TMP_PREFIX):].split(".", 1)[0]
            if pid_text.isdigit() and _alive(int(pid_text)):
                continue
            try:
                os.unlink(name, dir_fd=fd)
                removed += 1
            except OSError:
                pass
        return removed


def _alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: not ours to judge
    return True
