"""docs/design.md is the map a newcomer reads first, and its trust-boundary table is the
security contract: the gates every byte a host sends goes through. Each code name it
gives in backticks, ``package.module.name`` under ``multihost.`` (``logs.frames.read_frame``,
``run.outcome.parse_status``, ``remote.logs.frames.read_frame``), must exist, and each
file it names (``pipeline.py``, ``remote/run/ops.py``) must be there: a rename or a
removal cannot leave the map pointing at a gate, a function or a module that is gone."""
from __future__ import annotations

import pkgutil
import re
from pathlib import Path
from typing import List, Set

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
DOC = REPO / "docs" / "design.md"
PACKAGE = REPO / "multihost"

SPAN = re.compile(r"`([^`]+)`")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
FILE = re.compile(r"[\w./-]*\w\.py")
# the last part of a file's name, not an attribute: `run.json`, `gpu.log`, `workerlog.N`
FILE_SUFFIXES = {"py", "json", "log", "N", "md", "tmpl", "toml", "ini", "gz", "txt", "lock"}
NOT_CODE = {
    "FAMILY.verb",           # the pattern of helper operation names
    "remote/FAMILY/ops.py",  # and of their modules
    "package.module.name",   # the pattern of the names checked here
    "name.isascii",          # a method call on some string, as vermin cannot see it
}


def spans() -> List[str]:
    """What the doc puts in backticks, outside fenced blocks (pictures and file trees)."""
    text = re.sub(r"```.*?```", "", DOC.read_text(), flags=re.S)
    return SPAN.findall(text)


def helper_operations() -> Set[str]:
    """`run.launch`, `logs.tail`, ...: names of helper operations, not of Python code
    (read from the helper's @op registrations, nothing imported)."""
    names: Set[str] = set()
    for path in (PACKAGE / "remote").rglob("*.py"):
        names.update(re.findall(r"@op\(\s*[\"']([\w.]+)[\"']", path.read_text()))
    return names


def code_names() -> List[str]:
    operations = helper_operations()
    names = set()
    for span in spans():
        name = span.split("(")[0]          # `helper.call(transport, op, ...)` names helper.call
        if not DOTTED.fullmatch(name) or name in operations or name in NOT_CODE:
            continue
        if name.rsplit(".", 1)[1] in FILE_SUFFIXES:
            continue
        names.add(name)
    return sorted(names)


def file_names() -> List[str]:
    return sorted({span for span in spans() if FILE.fullmatch(span) and span not in NOT_CODE})


def resolve(name: str) -> object:
    """``multihost.<name>``: its modules imported in turn, then its attributes."""
    return pkgutil.resolve_name(f"multihost.{name}")


@pytest.mark.parametrize("name", code_names())
def test_every_code_name_in_the_design_resolves(name):
    try:
        resolve(name)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"docs/design.md names `{name}`, which is not multihost.{name} ({exc})")


@pytest.mark.parametrize("name", file_names())
def test_every_file_in_the_design_exists(name):
    candidates = [REPO / name, PACKAGE / name] + list(PACKAGE.rglob(Path(name).name))
    assert any(path.is_file() and path.as_posix().endswith(name) for path in candidates), \
        f"docs/design.md names {name}, which is not in the repository"


def packages() -> List[str]:
    """Every package of multihost, as the doc writes it: `remote/run/`, `check/checks/`."""
    return sorted(path.parent.relative_to(PACKAGE).as_posix() + "/"
                  for path in PACKAGE.rglob("__init__.py") if path.parent != PACKAGE)


@pytest.mark.parametrize("package", packages())
def test_the_design_names_every_package(package):
    assert package in spans(), f"docs/design.md does not name the package `{package}`"


def test_the_trust_boundary_gates_are_among_the_names_checked():
    table = DOC.read_text().split("## What hosts send: the trust boundary", 1)[1]
    table = table.split("\n\n", 2)[1]
    gates = [line.split("|")[2] for line in table.splitlines()
             if line.startswith("|") and not line.startswith("|---")][1:]
    checked = set(code_names())
    named = [name for cell in gates for name in SPAN.findall(cell) if name in checked]
    assert len(gates) >= 8 and len(named) >= 10, (gates, named)
    for must in ("logs.frames.read_frame", "run.outcome.parse_status", "check.calls.call"):
        assert must in named


def test_a_wrong_name_does_not_resolve():
    for wrong in ("run_outcome.parse_status", "logs.frames.read_frames", "check_calls.call"):
        with pytest.raises((ImportError, AttributeError)):
            resolve(wrong)
