"""Launcher templates: data files that say how one node starts its ranks.

A template (``templates/*.tmpl``, or the user's own with ``--launcher FILE``) is a list
of words with ``{variables}``; it renders to an argv list, never to a shell line, so
nothing is re-parsed by a remote shell. Rules (docs/templates.md has the full story):

  # comment                       a line starting with '#'
  @spawn node | rank | ps         node: the template starts a launcher that starts the
                                  ranks (torchrun, paddle); rank: multihost starts the
                                  template once per local rank and sets RANK etc. itself;
                                  ps: once per parameter server and trainer of the host,
                                  with paddle's PS variables (`multihost fleetrun`)
  @env NAME=value                 an environment variable for this launcher
  words {var} {list...} [opt]     {var} is replaced inside a word; {list...} stands alone
                                  and becomes zero or more words; a word in [brackets]
                                  is dropped when a variable in it is empty; {{ }} are
                                  literal braces

Every variable a template uses is checked against VARIABLES when it is loaded, before
anything starts anywhere: an unknown one is a ConfigError naming the file and line.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Sequence, Tuple, Union

from ..errors import ConfigError

BUILTIN = ("torchrun", "paddle", "python", "paddle_ps", "accelerate")
DEFAULT_TEMPLATE = "torchrun"

# name -> what it holds. Scalars render inside words; lists stand alone as {name...}.
VARIABLES: Dict[str, str] = {
    "python": "the host's python interpreter (--python, the hostfile's, else python3)",
    "nnodes": "number of hosts",
    "node_rank": "this host's position in --ips / the hostfile (0 is the first)",
    "nproc_per_node": "processes on this host (--nproc_per_node, else len(--gpus), else 1)",
    "master_addr": "the first host's address (an IP when it can be resolved)",
    "master_port": "FLAGS_START_PORT (the rendezvous port on the first host)",
    "start_port": "FLAGS_START_PORT, identical on every host",
    "ips": "every host's address, comma-separated, in node-rank order",
    "host_ip": "this host's address, as in {ips}",
    "gpus": "this host's devices, comma-separated ('' on CPU)",
    "world_size": "total number of ranks",
    "rank_offset": "global rank of this host's local rank 0",
    "run_id": "the run id",
    "run_dir": "absolute run directory on the host (~/.multihost/runs/<run_id>)",
    "log_dir": "absolute directory of the per-rank logs: <run_dir>/log",
    "workdir": "absolute working directory (where the code was synced)",
    "script": "the first word after --",
}
LIST_VARIABLES: Dict[str, str] = {
    "program": "python + everything after -- (without python under --no-python)",
    "script_args": "everything after -- but the first word",
    "rank_log": "the per-rank wrapper: writes log/workerlog.<LOCAL_RANK> and records the "
                "rank's exit; put it before {program...} with torchrun --no-python",
}
FRAMEWORKS = ("torch", "paddle")  # what the check's software probe can see
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(\.\.\.)?\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Value = Union[str, Sequence[str]]


@dataclass(frozen=True)
class Word:
    text: str
    line: int
    optional: bool = False


@dataclass(frozen=True)
class Template:
    name: str                              # "torchrun", or the user's file path
    spawn: str                             # "node", "rank" or "ps"
    words: Tuple[Word, ...]
    env: Tuple[Tuple[str, str, int], ...]  # (NAME, value with {vars}, line)

    @property
    def builtin(self) -> bool:
        return self.name in BUILTIN

    @property
    def frameworks(self) -> Tuple[str, ...]:
        """The frameworks this launcher itself imports (``{python} -m torch.distributed.run``
        needs torch on every host): the preflight fails a host without them."""
        texts = [w.text for w in self.words]
        return tuple(dict.fromkeys(
            module.split(".")[0] for flag, module in zip(texts, texts[1:])
            if flag == "-m" and module.split(".")[0] in FRAMEWORKS))

    def variables(self) -> Tuple[str, ...]:
        texts = [_escaped(w.text) for w in self.words] + [_escaped(v) for _, v, _ in self.env]
        return tuple(sorted({m.group(1) for t in texts for m in _PLACEHOLDER.finditer(t)}))


def _escaped(text: str) -> str:
    """Literal braces ({{ and }}) out of the way of the placeholders."""
    return text.replace("{{", "\0").replace("}}", "\1")


def _unescaped(text: str) -> str:
    return text.replace("\0", "{").replace("\1", "}")


def _error(where: str, cause: str, fix: str) -> ConfigError:
    return ConfigError(f"{where}: {cause}", fix=fix)


def _check_word(text: str, where: str, in_env: bool = False) -> None:
    text = _escaped(text)
    for match in _PLACEHOLDER.finditer(text):
        name, dots = match.group(1), match.group(2)
        if name in LIST_VARIABLES:
            if in_env or not dots or match.group(0) != text:
                raise _error(where, f"{{{name}...}} is a list of words and must stand alone",
                             f"write it as its own word: {{{name}...}}")
        elif name in VARIABLES:
            if dots:
                raise _error(where, f"{{{name}}} is one value, not a list",
                             f"write {{{name}}} without the dots")
        else:
            raise _error(where, f"unknown variable {{{name}}}",
                         "use one of: " + ", ".join(sorted(VARIABLES) + [f"{n}..." for n in
                                                                         sorted(LIST_VARIABLES)])
                         + " (see docs/templates.md)")
    stripped = _PLACEHOLDER.sub("", text)
    if "{" in stripped or "}" in stripped:
        raise _error(where, f"stray brace in {_unescaped(text)!r}",
                     "write a literal brace as {{ or }}")


def parse_template(text: str, name: str) -> Template:
    spawn = "node"
    words: List[Word] = []
    env: List[Tuple[str, str, int]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        where = f"{name}:{lineno}"
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            key, _, value = line[1:].partition(" ")
            value = value.strip()
            if key == "spawn":
                if value not in ("node", "rank", "ps"):
                    raise _error(where, f"@spawn {value!r} is not node or rank (or ps)",
                                 "write @spawn node (a launcher starts the ranks) or @spawn rank")
                spawn = value
            elif key == "env":
                env_name, eq, env_value = value.partition("=")
                if not eq or not _ENV_NAME.match(env_name):
                    raise _error(where, f"@env {value!r} is not NAME=value", "write @env NAME=value")
                _check_word(env_value, where, in_env=True)
                env.append((env_name, env_value, lineno))
            else:
                raise _error(where, f"unknown directive @{key}", "directives are @spawn and @env")
            continue
        try:
            parts = shlex.split(line, comments=True)
        except ValueError as exc:
            raise _error(where, f"cannot split the line: {exc}", "close the quote") from None
        for part in parts:
            optional = len(part) > 2 and part.startswith("[") and part.endswith("]")
            body = part[1:-1] if optional else part
            _check_word(body, where)
            words.append(Word(body, lineno, optional))
    if not words:
        raise _error(name, "the template has no command", "write the launcher's command line")
    template = Template(name, spawn, tuple(words), tuple(env))
    if spawn in ("rank", "ps") and "rank_log" in template.variables():
        raise _error(name, "{rank_log...} is for @spawn node templates",
                     "remove it: under @spawn rank multihost writes every rank's log itself")
    return template


def load_template(spec: str = DEFAULT_TEMPLATE) -> Template:
    """A built-in template by name, or a user's template file."""
    if spec in BUILTIN:
        from importlib import resources

        text = (resources.files("multihost.templates") / f"{spec}.tmpl").read_text()
        return parse_template(text, spec)
    path = Path(spec).expanduser()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read launcher template {spec}: {exc.strerror}",
                          fix=f"give a template file or one of: {', '.join(BUILTIN)}") from None
    return parse_template(text, str(path))


def _substitute(text: str, values: Mapping[str, Value]) -> str:
    def one(match: "re.Match[str]") -> str:
        return str(values[match.group(1)])

    return _unescaped(_PLACEHOLDER.sub(one, _escaped(text)))


def render(template: Template, values: Mapping[str, Value]) -> List[str]:
    """The argv of one node. ``values`` holds every variable (lists for list variables)."""
    argv: List[str] = []
    for word in template.words:
        text = _escaped(word.text)
        whole = _PLACEHOLDER.fullmatch(text)
        if whole and whole.group(2):
            argv.extend(str(v) for v in values[whole.group(1)])
            continue
        if word.optional and any(values[m.group(1)] in ("", None)
                                 for m in _PLACEHOLDER.finditer(text)):
            continue
        argv.append(_substitute(word.text, values))
    return argv


def render_env(template: Template, values: Mapping[str, Value]) -> Dict[str, str]:
    return {name: _substitute(value, values) for name, value, _ in template.env}


def program_words(python: str, command: Sequence[str], no_python: bool) -> List[str]:
    """What the user asked to run: ``python train.py -c cfg.yml`` (torchrun's default),
    or the command alone with --no-python (a shell script, a binary)."""
    return list(command) if no_python else [python, *command]


def rank_log_words(python: str, run_dir: str) -> List[str]:
    return [python, "-S", f"{run_dir}/rankwrap.py", run_dir]


def display_argv(argv: Sequence[str], run_dir: str = "") -> str:
    """A command for people: the rank wrapper folded to one word, shell-quoted."""
    words = list(argv)
    if run_dir:
        marker = f"{run_dir}/rankwrap.py"
        for i, word in enumerate(words):
            if word == marker and i >= 2 and words[i - 1] == "-S":
                words[i - 2:i + 2] = ["<rank-log>"]
                break
    return " ".join(w if w == "<rank-log>" else shlex.quote(w) for w in words)
