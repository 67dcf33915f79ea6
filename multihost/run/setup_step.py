"""The setup step: one command run on every host after sync and before launch.

``pip install -r requirements.txt``, say. It runs in the host's workdir with the job's
python's directory first on PATH (so ``pip`` is that python's pip), and is skipped on a
host where the same command already succeeded on the same code: the key, the command +
the code tree's content hash + the python, is kept on the host in
``~/.multihost/setup/<host name>/<workdir hash>`` after a success (``--setup-always`` runs
it anyway). Its output goes to ``~/.multihost/setup/<host name>/<workdir hash>.log`` on
the host (kept whole; by host name, as hosts that share a home run theirs at once); the
controller shows the last lines of each host's, cleaned of terminal escapes.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Dict, Tuple

from ..errors import LaunchError, and_more
from ..fanout import HostGroup
from ..hosts import Host

SHOWN_BYTES = 16384   # of each host's output, the end; the whole is in the log on the host
SKIPPED = "multihost-setup: unchanged"
# The script's first line: the host's name, which keys its marker and log (hosts that
# share a home run their setups at once, each into a log of its own).
HOST_LINE = "multihost-setup-host:"

# $1 key, $2 file name, $3 always (1/0), $4 python, $5 the setup command. Runs in the
# workdir. Prints HOST_LINE, then SKIPPED alone when the key matches; otherwise the
# command's output (the tail of its log) and its exit status.
SCRIPT = r'''
host=$(uname -n)
echo "%(host)s $host"
dir="$HOME/.multihost/setup/$host"
mkdir -p "$dir" && chmod 700 "$HOME/.multihost" "$HOME/.multihost/setup" "$dir" || exit 1
if [ "$3" != 1 ] && [ -f "$dir/$2" ] && [ "$(cat "$dir/$2")" = "$1" ]; then
  echo "multihost-setup: unchanged"; exit 0
fi
rm -f "$dir/$2"
python=$(command -v "$4") || { echo "multihost-setup: python $4 not found on PATH" >&2; exit 127; }
PATH="$(dirname "$python"):$PATH"
export PATH
( umask 077; : > "$dir/$2.log" )
sh -c "$5" </dev/null >"$dir/$2.log" 2>&1
code=$?
tail -c %(shown)d "$dir/$2.log"
if [ "$code" = 0 ]; then
  ( umask 077; printf '%%s' "$1" > "$dir/$2.tmp" ) && mv -f "$dir/$2.tmp" "$dir/$2"
fi
exit "$code"
''' % {"shown": SHOWN_BYTES, "host": HOST_LINE}


@dataclass(frozen=True)
class SetupResult:
    host: Host
    exit_code: int
    output: str          # the end of the output, cleaned for a terminal
    skipped: bool
    log: str             # the whole output, on the host

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def setup_key(command: str, code_digest: str, python: str) -> str:
    return hashlib.sha256("\0".join((command, code_digest, python)).encode()).hexdigest()


def marker_name(workdir: str) -> str:
    return hashlib.sha256(workdir.encode()).hexdigest()[:16]


def run_setup(cluster: HostGroup, command: str, code_digest: str, workdirs: Dict[int, str],
              always: bool = False,
              on_result: Callable[[SetupResult], None] = lambda r: None
              ) -> Tuple[SetupResult, ...]:
    """The setup on every host at once; every host finishes (a failure elsewhere does not
    cut one short). Raises LaunchError naming the first failed host (in rank order)."""
    from ..untrusted import clean_line

    def one(host: Host, transport) -> SetupResult:
        name = marker_name(workdirs[host.rank])
        argv = ["sh", "-c", SCRIPT, "multihost-setup", setup_key(command, code_digest,
                host.python), name, "1" if always else "0", host.python, command]
        result = transport.run(argv, cwd=workdirs[host.rank], input=b"")
        first, _, rest = result.stdout.partition(b"\n")
        where = name
        if first.startswith(HOST_LINE.encode()):
            where = f"{first[len(HOST_LINE):].decode('utf-8', 'replace').strip()}/{name}"
        else:
            rest = result.stdout
        text = (rest + result.stderr)[-SHOWN_BYTES:]
        output = "\n".join(clean_line(line) for line in text.splitlines())
        skipped = result.exit_code == 0 and output.strip() == SKIPPED
        setup = SetupResult(host, result.exit_code, "" if skipped else output, skipped,
                            f"~/.multihost/setup/{where}.log")
        on_result(setup)
        return setup

    results = cluster.map(one)
    for result in results:
        if not result.ok:
            raise result.error  # could not reach the host: its own one-line error
    setups = tuple(r.value for r in results)
    failed = [s for s in setups if not s.ok]
    if failed:
        first = failed[0]
        last = " | ".join(line.strip() for line in first.output.splitlines()[-3:] if line.strip())
        more = and_more([s.host.label for s in failed[1:]], unit="host(s)")
        raise LaunchError(f"setup {command!r} exited {first.exit_code}{more}: "
                          f"{last or 'no output'}", host=first.host.label,
                          fix=f"fix the setup command or the host; its whole output is in "
                              f"{first.log} on {first.host.label}")
    return setups


def show(result: SetupResult, write: Callable[[str], None]) -> None:
    """One host's setup output, each line prefixed with the host (like `exec --plain`)."""
    label = result.host.label
    if result.skipped:
        write(f"{label}: setup unchanged since its last success, skipped "
              "(--setup-always to run it)")
        return
    for line in result.output.splitlines():
        write(f"{label}: {line}")
    write(f"{label}: setup {'done' if result.ok else f'exited {result.exit_code}'}")


def code_digest(code_dir: str) -> str:
    """The code tree's content hash (the manifest sync sends; hashes are cached)."""
    from ..sync.manifest import build_manifest

    return build_manifest(code_dir).digest
