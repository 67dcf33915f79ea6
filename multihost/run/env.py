"""The environment of a run's processes, and the masking of secrets in what is shown.

Layers, later ones win (docs/environment.md):
  1. pass-through from the controller: NCCL_*, GLOO_*, CUDA_* (not CUDA_VISIBLE_DEVICES,
     which names this machine's devices: use --gpus), TORCH_*, PYTHON*, OMP_NUM_THREADS,
     FLAGS_*
  2. set by multihost: FLAGS_START_PORT, MULTIHOST_RUN_ID / NODE_RANK / NUM_NODES /
     NODE_IPS, CUDA_VISIBLE_DEVICES (from --gpus), PYTHONUNBUFFERED=1 (logs as they
     come), NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME (the interface check found) unless
     the user set them in any layer, and PROGRESS_ENV unless the user set them
  3. the template's @env lines
  4. --env-file FILE, then --env K=V (repeatable)

Values travel to the hosts inside the launch request on stdin, never in a command line.
Anything printed or recorded goes through ``mask_env`` / ``mask_argv`` first: the values
of names that contain a secret word (SECRET_WORDS) and the password of any URL.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..userfiles import read_config_text

PASS_PREFIXES = ("NCCL_", "GLOO_", "CUDA_", "TORCH_", "PYTHON", "FLAGS_")
PASS_NAMES = ("OMP_NUM_THREADS",)
NOT_PASSED = ("CUDA_VISIBLE_DEVICES",)
# A name containing one of these (any case) holds a secret: its value is never shown.
# Plain substrings on purpose: masking a harmless value (--keyframes=***) costs nothing,
# missing a secret (DB_PASS, MYSQL_PWD, BASIC_AUTH) leaks it into records and screens.
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASS", "PWD", "CREDENTIAL", "AUTH", "PRIVATE",
                "COOKIE")
MASK = "***"
# scheme://userinfo@ : the userinfo of a URL (postgres://user:pw@db/x) carries passwords.
_URL_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^/?#@\s]+)@")
SOCKET_IFNAMES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
# A rich progress bar (Lightning's default where rich is installed) draws nothing into a
# file until its end; told the output can take terminal codes, it redraws one line with
# \r as tqdm does, which the log follower shows live. Wide, so Lightning's metrics stay
# on the bar's line (at 80 columns they wrap onto a second line at every redraw).
PROGRESS_ENV = {"TTY_COMPATIBLE": "1", "COLUMNS": "200"}

# Set per host or per rank by multihost or the launcher: a user value would make hosts
# disagree, or override what the launcher computes for each rank.
RESERVED = {
    "FLAGS_START_PORT": "give the port with --start-port",
    "MULTIHOST_RUN_ID": "multihost sets it", "MULTIHOST_NODE_RANK": "multihost sets it",
    "MULTIHOST_NUM_NODES": "multihost sets it", "MULTIHOST_NODE_IPS": "multihost sets it",
    "TORCHELASTIC_RESTART_COUNT": "multihost sets it from the attempt (--max-restarts)",
}
PER_RANK = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "MASTER_ADDR", "MASTER_PORT", "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM",
            "PADDLE_TRAINER_ENDPOINTS", "PADDLE_CURRENT_ENDPOINT", "PADDLE_MASTER",
            "PADDLE_GLOBAL_RANK", "PADDLE_LOCAL_RANK")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def passthrough(environ: Mapping[str, str]) -> Dict[str, str]:
    return {k: v for k, v in sorted(environ.items())
            if (k.startswith(PASS_PREFIXES) or k in PASS_NAMES) and k not in NOT_PASSED
            and k not in RESERVED}


def parse_assignment(text: str, where: str) -> Tuple[str, str]:
    name, eq, value = text.partition("=")
    name = name.strip()
    if name.startswith("export "):
        name = name[len("export "):].strip()
    if not eq or not _NAME.match(name):
        raise ConfigError(f"{where}: {text.strip()!r} is not NAME=VALUE",
                          fix="write it like --env NCCL_DEBUG=INFO")
    return name, value


def parse_env_flag(text: str, environ: Mapping[str, str]) -> Tuple[str, str]:
    """``--env NAME=VALUE``, or ``--env NAME``: the value of NAME in the controller's own
    environment, so that a secret need never be written on a command line (where `ps`
    shows it to every user of the controller for the whole run)."""
    name = text.strip()
    if "=" in text or not _NAME.match(name):
        return parse_assignment(text, "--env")
    if name not in environ:
        raise ConfigError(f"--env {name}: {name} is not set in this shell",
                          fix=f"export {name}=... before running multihost, "
                              f"or give the value: --env {name}=VALUE")
    return name, environ[name]


def parse_env_file(path: str) -> List[Tuple[str, str]]:
    """A ``.env`` file, read with python-dotenv (as docker compose and most tools read
    them): '#' comments, ``export NAME=...``, single or double quotes (multi-line inside
    double quotes), a UTF-8 BOM. No $-expansion: a value is used as written. A line
    dotenv cannot read is refused, never skipped: a lost line is a lost setting."""
    import io

    from dotenv.parser import parse_stream

    file = Path(path).expanduser()
    text = read_config_text(file, "env file", "--env-file").lstrip("\ufeff")
    pairs = []
    for binding in parse_stream(io.StringIO(text)):
        where = f"{path}:{binding.original.line}"
        line = binding.original.string.strip()
        if binding.error and re.match(r"^(export\s+)?[^=\s]+\s*=\s*['\"]", line):
            # A value cut short would silently become a different secret or path.
            raise ConfigError(f"{where}: the value of {_start(line)} opens a quote that is "
                              "never closed", fix="close the quote: NAME=\"value\"")
        if binding.error:
            raise ConfigError(f"{where}: the line starting {_start(line)!r} is not NAME=VALUE",
                              fix="write NAME=value, quoting a value with spaces or '#': "
                                  "NAME=\"a b\" (close every quote)")
        if binding.key is None:
            continue  # a blank or comment line
        if not _NAME.match(binding.key):
            raise ConfigError(f"{where}: {binding.key!r} is not a variable name",
                              fix="names are letters, digits and _, not starting with a digit")
        if binding.value is None:
            raise ConfigError(f"{where}: {binding.key} has no value",
                              fix=f"write {binding.key}=value (or {binding.key}= for empty)")
        pairs.append((binding.key, binding.value))
    return pairs


def _start(line: str) -> str:
    """The line up to its first '=' or blank: enough to find it, never a (secret) value."""
    return re.split(r"[=\s]", line, maxsplit=1)[0][:40]


def check_user_env(pairs: Iterable[Tuple[str, str]], where: str,
                   gpus_given: bool) -> Dict[str, str]:
    env: Dict[str, str] = {}
    for name, value in pairs:
        if name in RESERVED or name.startswith("MULTIHOST_"):
            raise ConfigError(f"{where}: {name} cannot be set by hand",
                              fix=RESERVED.get(name, "multihost sets it"))
        if name in PER_RANK:
            raise ConfigError(f"{where}: {name} is set for each rank by the launcher",
                              fix=f"remove {name}; the launcher computes it per rank")
        if name == "CUDA_VISIBLE_DEVICES" and gpus_given:
            raise ConfigError(f"{where}: CUDA_VISIBLE_DEVICES and --gpus both say which devices",
                              fix="keep only --gpus")
        env[name] = value
    return env


def multihost_env(run_id: str, node_rank: int, addresses: Sequence[str], start_port: int,
                  gpus: Sequence[int], attempt: int = 0) -> Dict[str, str]:
    # The attempt (0 first, then 1, 2, ... under --max-restarts) under torchrun's name too,
    # so code written for torchrun's restarts resumes from its checkpoint unchanged.
    env = {"FLAGS_START_PORT": str(start_port), "MULTIHOST_RUN_ID": run_id,
           "MULTIHOST_NODE_RANK": str(node_rank), "MULTIHOST_NUM_NODES": str(len(addresses)),
           "MULTIHOST_NODE_IPS": ",".join(addresses), "MULTIHOST_RESTART_COUNT": str(attempt),
           "TORCHELASTIC_RESTART_COUNT": str(attempt)}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return env


def node_env(passed: Mapping[str, str], computed: Mapping[str, str],
             template_env: Mapping[str, str], user: Mapping[str, str],
             iface: Optional[str]) -> Dict[str, str]:
    """The layers merged (see the module doc)."""
    env: Dict[str, str] = dict(passed)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(computed)
    env.update(template_env)
    env.update(user)
    if iface:
        for name in SOCKET_IFNAMES:
            env.setdefault(name, iface)
    for name, value in PROGRESS_ENV.items():
        env.setdefault(name, value)
    return env


def mask_url_userinfo(text: str) -> str:
    """``postgres://user:pw@db/x`` -> ``postgres://user:***@db/x``; a userinfo without a
    colon (``https://TOKEN@host``) is all secret."""
    def hide(match: "re.Match[str]") -> str:
        user, colon, _ = match.group(2).partition(":")
        return f"{match.group(1)}{user + ':' if colon else ''}{MASK}@"

    return _URL_USERINFO.sub(hide, text) if "://" in text else text


def mask_env(env: Mapping[str, str]) -> Dict[str, str]:
    return {k: (MASK if is_secret(k) and v else mask_url_userinfo(v)) for k, v in env.items()}


def secret_values(env: Mapping[str, str]) -> List[str]:
    return sorted({v for k, v in env.items() if is_secret(k) and len(v) >= 4},
                  key=len, reverse=True)


def mask_argv(argv: Sequence[str], env: Mapping[str, str] = {}) -> List[str]:
    """``--api-key X``, ``--token=X``, ``HF_TOKEN=X``, any secret env value and the
    password of any URL become ***."""
    values = secret_values(env)
    out: List[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        name, eq, _ = word.partition("=")
        bare = name.lstrip("-")
        if eq and bare and is_secret(bare) and re.match(r"^-{0,2}[A-Za-z_][\w.-]*$", name):
            out.append(f"{name}={MASK}")
            continue
        if word.startswith("-") and not eq and is_secret(word.lstrip("-")):
            hide_next = True
        for value in values:
            word = word.replace(value, MASK)
        out.append(mask_url_userinfo(word))
    return out
