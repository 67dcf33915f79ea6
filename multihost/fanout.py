"""Run one operation on every host in parallel and collect a result or an error for each.

Like fabric's GroupResult and ClusterShell's workers, a fan-out never stops at the first
failure: every host gets its turn, and the caller sees every outcome, in rank order.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Dict, Generic, List, Optional, Sequence, Tuple, TypeVar

from .errors import ConnectError, MultihostError, RemoteError
from .hosts import Host
from .transport import SrunOptions, SshOptions, Transport, is_local_host, open_transport

T = TypeVar("T")
DEFAULT_FANOUT = 64


@dataclass(frozen=True)
class HostResult(Generic[T]):
    host: Host
    value: Optional[T] = None
    error: Optional[MultihostError] = None

    @property
    def ok(self) -> bool:
        return self.error is None


def fan_out(hosts: Sequence[Host], operation: Callable[[Host], T],
            workers: int = DEFAULT_FANOUT) -> List[HostResult[T]]:
    """``operation(host)`` on every host at once (at most ``workers`` at a time).

    A MultihostError (or an OSError escaping a transport) becomes that host's error;
    anything else is a bug and is raised after every host has finished.
    """
    def one(host: Host) -> HostResult[T]:
        try:
            return HostResult(host, value=operation(host))
        except MultihostError as err:
            return HostResult(host, error=err)
        except OSError as err:
            return HostResult(host, error=RemoteError(f"{type(err).__name__}: {err}",
                                                      host=host.label))

    if len(hosts) == 1:  # no thread for the common single-host case
        return [one(hosts[0])]
    # Plain threads rather than concurrent.futures: importing that (and logging with it)
    # costs every command 6 ms, a tenth of a no-change sync's own work.
    results: List[Optional[HostResult[T]]] = [None] * len(hosts)
    bugs: List[BaseException] = []
    queue = iter(range(len(hosts)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                index = next(queue, None)
            if index is None:
                return
            try:
                results[index] = one(hosts[index])
            except BaseException as exc:  # a bug: raised below, once every host is done
                bugs.append(exc)

    threads = [threading.Thread(target=worker, daemon=True)
               for _ in range(max(1, min(workers, len(hosts))))]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except KeyboardInterrupt:
        for thread in threads:  # what was started on a host finishes before Ctrl-C goes on
            thread.join()
        raise
    if bugs:
        raise bugs[0]
    return results  # type: ignore[return-value]


class HostGroup:
    """The hosts of one command and their connections: opened once per host, reused.

    ``transport(host)`` connects on first use (thread-safe), and remembers a failure so a
    dead host is not retried by every later step of the same command.
    """

    def __init__(self, hosts: Sequence[Host], options: SshOptions = SshOptions(),
                 workers: int = DEFAULT_FANOUT):
        self.hosts: Tuple[Host, ...] = tuple(hosts)
        self.options = options
        self.workers = workers
        self._transports: Dict[int, Transport] = {}
        self._errors: Dict[int, MultihostError] = {}
        self._locks = {host.rank: threading.Lock() for host in self.hosts}
        self._masters: List = []

    def subset(self, hosts: Sequence[Host]) -> "HostGroup":
        """Some of the hosts, on the same connections (closing the group closes them)."""
        part = HostGroup.__new__(HostGroup)
        part.__dict__.update(self.__dict__)
        part.hosts = tuple(hosts)
        return part

    def reused(self, host: Host) -> Optional[Transport]:
        """A transport through the host's OpenSSH master left by an earlier command
        (transport/openssh.py), or None: for quick steps that fall back to ``transport``."""
        if is_local_host(host) or isinstance(self.options, SrunOptions):
            return None
        from .transport.openssh import MuxTransport

        return MuxTransport.open(host, self.options)

    def leave_connection(self, host: Host) -> None:
        """Start, in the background, an OpenSSH master to the host for later commands."""
        if is_local_host(host) or isinstance(self.options, SrunOptions):
            return
        from .transport.openssh import start_master

        master = start_master(host, self.options)
        if master is not None:
            self._masters.append(master)

    def transport(self, host: Host) -> Transport:
        with self._locks[host.rank]:
            if host.rank in self._errors:
                raise self._errors[host.rank]
            if host.rank not in self._transports:
                try:
                    self._transports[host.rank] = open_transport(host, self.options)
                except ConnectError as err:
                    self._errors[host.rank] = err
                    raise
            return self._transports[host.rank]

    def forget(self, host: Host) -> None:
        """Drop a host's connection (after it was lost) so the next use reconnects."""
        with self._locks[host.rank]:
            self._errors.pop(host.rank, None)
            transport = self._transports.pop(host.rank, None)
        if transport:
            transport.close()

    def map(self, operation: Callable[[Host, Transport], T],
            hosts: Optional[Sequence[Host]] = None) -> List[HostResult[T]]:
        """``operation(host, transport)`` on every host (or the given ones), in parallel."""
        return fan_out(hosts if hosts is not None else self.hosts,
                       lambda host: operation(host, self.transport(host)), self.workers)

    def close(self) -> None:
        for transport in list(self._transports.values()):
            transport.close()
        self._transports.clear()
        # A master still authenticating finishes on its own (its first session is `true`).
        self._masters = [m for m in self._masters if m.poll() is None]

    def __enter__(self) -> "HostGroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
