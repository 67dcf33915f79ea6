"""Wait until every ADDRESS:PORT accepts a TCP connection. Stdlib only; the lab runs it
inside the controller namespace (``ip netns exec <lab>-ctl python probe.py ...``), the
only place lab addresses are reachable from.

    python probe.py TIMEOUT ADDR:PORT [ADDR:PORT ...]

Exit 0 when all accepted, 1 at the timeout, printing the addresses that never did.
"""
import errno
import selectors
import socket
import sys
import time

RETRY = 0.02


def wait_all(targets, timeout):
    deadline = time.monotonic() + timeout
    pending = set(targets)
    sel = selectors.DefaultSelector()
    next_try = {t: 0.0 for t in targets}
    while pending and time.monotonic() < deadline:
        now = time.monotonic()
        for target in list(pending):
            if next_try[target] > now or any(k.data == target for k in sel.get_map().values()):
                continue
            host, port = target.rsplit(":", 1)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            err = sock.connect_ex((host, int(port)))
            if err in (0, errno.EINPROGRESS):
                sel.register(sock, selectors.EVENT_WRITE, target)
            else:
                sock.close()
                next_try[target] = now + RETRY
        for key, _ in sel.select(timeout=RETRY):
            sock, target = key.fileobj, key.data
            sel.unregister(sock)
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                pending.discard(target)
            else:
                next_try[target] = time.monotonic() + RETRY
            sock.close()
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    return sorted(pending)


def main(argv):
    missing = wait_all(argv[2:], float(argv[1]))
    if missing:
        print("no answer from " + " ".join(missing), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
