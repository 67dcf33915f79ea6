"""docs/reliability.md lists every fault and bad input tried, with the test that proves
each row. These tests keep that table true: every test it names must exist (read with
ast, nothing imported or run), every row must name one, and every fault, security and
bad input test must have its row, so a test cannot be added, renamed or dropped without
the table following."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Set, Tuple

REPO = Path(__file__).resolve().parent.parent.parent
DOC = REPO / "docs" / "reliability.md"

# `tests/x/test_y.py::test_name` or `...::test_name[param-id]`, inside backticks.
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)(?:\[([^\]`]+)\])?`")

# Files whose every test is a fault or a security case and must have a row.
EVERY_TEST_LISTED = ["tests/lab/test_faults.py", "tests/lab/test_silent.py",
                     "tests/lab/test_security.py", "tests/lab/test_hostile.py", "tests/lab/test_hostile_ssh.py",
                     "tests/unit/test_hostile_input.py", "tests/unit/cli/test_bad_input.py",
                     "tests/unit/cli/test_cli_messy.py", "tests/lab/test_cousers.py"]


def table_rows(text: str) -> List[List[str]]:
    """The cells of each body row of the doc's table (header and rule skipped)."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if cells[0] in ("kind", "") or set("".join(cells)) <= set("-: "):
            continue
        rows.append(cells)
    return rows


def references(text: str) -> List[Tuple[str, str, str]]:
    return [(m.group(1), m.group(2), m.group(3) or "") for m in REFERENCE.finditer(text)]


def defined_tests(path: Path) -> Set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.startswith("test_")}


def bad_input_case_ids(path: Path) -> List[str]:
    """The ids of ``CASES`` in test_bad_input.py: the first string of each tuple."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CASES" for t in node.targets):
            return [element.elts[0].value for element in node.value.elts]  # type: ignore
    raise AssertionError(f"no CASES in {path}")


def test_the_table_has_rows_and_each_names_a_test():
    rows = table_rows(DOC.read_text())
    assert len(rows) >= 60
    for cells in rows:
        assert len(cells) == 4, cells
        kind, happens, does, proof = cells
        assert kind in ("fault", "security", "bad input"), cells
        assert happens and does, cells
        assert references(proof), f"no test named in row: {cells}"


def test_every_named_test_exists():
    text = DOC.read_text()
    cache: Dict[str, Set[str]] = {}
    missing = []
    for path, name, param in references(text):
        file = REPO / path
        if not file.is_file():
            missing.append(f"{path} (no such file)")
            continue
        if path not in cache:
            cache[path] = defined_tests(file)
        if name not in cache[path]:
            missing.append(f"{path}::{name}")
        elif param and path.endswith("test_bad_input.py") and \
                param not in bad_input_case_ids(file):
            missing.append(f"{path}::{name}[{param}] (no such case)")
    assert not missing, "docs/reliability.md names tests that do not exist:\n" + "\n".join(missing)


def test_every_fault_security_and_bad_input_test_has_a_row():
    named = {(path, name, param) for path, name, param in references(DOC.read_text())}
    named_tests = {(path, name) for path, name, _ in named}
    absent = []
    for path in EVERY_TEST_LISTED:
        file = REPO / path
        if not file.is_file():
            continue  # a file not landed yet; its tests are checked once it exists
        for name in sorted(defined_tests(file)):
            if name.startswith("test_cases_") or name == "test_refused_in_one_line":
                continue  # the table's own bookkeeping, and the parametrized one below
            if (path, name) not in named_tests:
                absent.append(f"{path}::{name}")
    bad_input = "tests/unit/cli/test_bad_input.py"
    for case in bad_input_case_ids(REPO / bad_input):
        if (bad_input, "test_refused_in_one_line", case) not in named:
            absent.append(f"{bad_input}::test_refused_in_one_line[{case}]")
    assert not absent, "tests with no row in docs/reliability.md:\n" + "\n".join(absent)


def test_the_checker_catches_a_wrong_name(tmp_path):
    """The parser must see a typo: a doc naming a test that is not there is reported."""
    text = "| fault | x | y | `tests/unit/test_reliability_doc.py::test_no_such_thing` |\n"
    (path, name, _), = references(text)
    assert name not in defined_tests(REPO / path)
    assert references("| a | b | c | `tests/lab/test_run.py::test_x[with-id]` |") == \
        [("tests/lab/test_run.py", "test_x", "with-id")]
