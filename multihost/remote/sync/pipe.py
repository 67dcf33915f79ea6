"""Pipes of a sync made large. Apart from fs.py so that a relay's join, which needs
only this, does not import what hashing files needs. Stdlib only, Python 3.6+."""
try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX host
    fcntl = None

F_SETPIPE_SZ = 1031      # Linux; fcntl names it only from Python 3.10
PIPE_SIZE = 1 << 20


def grow_pipe(stream):
    """A 1 MiB pipe instead of 64 KiB, so whoever writes into it goes on while the reader
    is busy with a chunk (not a pipe, or not allowed: nothing changes). ``stream``: a
    file, or a file descriptor."""
    if fcntl is None:
        return
    try:
        fd = stream if isinstance(stream, int) else stream.fileno()
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, ValueError, AttributeError):
        pass
