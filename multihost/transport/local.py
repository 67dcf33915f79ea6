"""The local transport: a host that is this machine runs its commands as subprocesses,
so the single-machine case needs no sshd. Commands go through ``/bin/sh -c`` exactly as
a remote login shell would run them, so both transports behave the same.
"""
from __future__ import annotations

import getpass
import os
import signal
import socket
import subprocess
import time
from typing import Optional

from ..errors import CommandTimeout
from ..hosts import Host
from .base import Command, CommandResult, InputStream, Process, Transport, split_start, to_shell

LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def is_local_host(host: Host) -> bool:
    """This machine, reached without ssh: localhost, a loopback or own address, our name.

    An explicit port or another user means the user wants sshd, so that is never local.
    Names are not resolved (an ssh alias may point anywhere); literal addresses are
    tested by binding a socket to them, which sends nothing.
    """
    if host.port is not None or (host.user is not None and host.user != getpass.getuser()):
        return False
    name = host.name.lower()
    if name in LOCAL_NAMES or name == socket.gethostname().lower():
        return True
    family = socket.AF_INET6 if ":" in name else socket.AF_INET
    try:
        socket.inet_pton(family, name.split("%", 1)[0])
    except OSError:
        return False
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((name, 0))
        except OSError:
            return False
    return True


class LocalProcess(Process):
    def __init__(self, popen: "subprocess.Popen[bytes]", label: str):
        self._popen = popen
        self._label = label
        assert popen.stdout is not None and popen.stdin is not None
        self.stdout = popen.stdout
        self.stdin = InputStream(popen.stdin)  # a pipe's errors: OSError, ValueError

    def read_stderr(self) -> bytes:
        return split_start(self._popen.stderr.read())[2] if self._popen.stderr else b""

    def wait(self, timeout: Optional[float] = None) -> int:
        try:
            return self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise CommandTimeout(f"command still running after {timeout:.0f}s",
                                 host=self._label) from None

    def kill(self) -> None:
        try:
            self._popen.kill()
        except OSError:  # already gone
            pass

    def end_group(self) -> None:
        try:
            os.killpg(self._popen.pid, signal.SIGKILL)   # its own session: start()
        except OSError:  # already gone
            pass

    def close(self) -> None:
        for stream in (self._popen.stdin, self._popen.stdout, self._popen.stderr):
            if stream:
                try:
                    stream.close()
                except OSError:  # stdin of a command that exited without reading it
                    pass


class LocalTransport(Transport):
    is_local = True

    def __init__(self, host: Host):
        self.host = host

    def run(self, command: Command, *, input: Optional[bytes] = None,
            timeout: Optional[float] = None, cwd: Optional[str] = None) -> CommandResult:
        line = to_shell(command, cwd)
        started = time.monotonic()
        popen = self._spawn(line, with_stdin=input is not None)
        try:
            stdout, stderr = popen.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            self._give_up(popen)
            raise CommandTimeout(f"command did not finish within {timeout:.0f}s: {line[:80]}",
                                 host=self.host.label) from None
        return self._result(CommandResult(self.host.label, line, popen.returncode, stdout,
                                          stderr, time.monotonic() - started))

    def _give_up(self, popen: "subprocess.Popen[bytes]") -> bytes:
        """End a command that did not finish in time, and all it started; its stderr."""
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            return popen.communicate(timeout=5)[1] or b""
        except subprocess.TimeoutExpired:   # a child that left the group holds the pipes
            popen.kill()
            return b""

    def _result(self, result: CommandResult) -> CommandResult:
        return result

    def start(self, command: Command, *, cwd: Optional[str] = None) -> Process:
        return LocalProcess(self._spawn(to_shell(command, cwd), with_stdin=True), self.host.label)

    def _spawn(self, line: str, with_stdin: bool):
        """The running shell line with pipes for its outputs (and its input: ``with_stdin``),
        Popen or alike (the OpenSSH transport's runs on the host, through a master)."""
        # own session: a Ctrl-C at the terminal is the controller's to handle, as it
        # would be for a command on a remote host; and a command given up on is ended
        # with everything it started (its process group)
        return subprocess.Popen(self._argv(line),
                                stdin=subprocess.PIPE if with_stdin else None,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)

    def _argv(self, line: str) -> list:
        """The argv that runs a shell line here (srun's puts `srun` in front)."""
        return ["/bin/sh", "-c", line]

    def close(self) -> None:
        pass
