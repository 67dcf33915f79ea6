"""No import cycle among multihost's modules.

The imports are read with ``ast`` (nothing is imported or run), so the graph holds every
import statement wherever it is: at the top of a module, and inside a function too. A
lazy import inside a function still ties the two modules together (move one and the
other breaks), and a cycle through one only waits for the first call to fail half
initialised; so it counts. The package a module lives in is not an edge (Python runs a
package's ``__init__`` before any of its modules by itself; that order cannot loop).
Imports under ``if TYPE_CHECKING:`` are never executed, so they cannot fail at run time;
but a type one module names from another still ties the two, and a circle of them is
one that only the type checker walks: a second test proves there is none either.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

ROOT = Path(__file__).resolve().parent.parent.parent / "multihost"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> Dict[str, Path]:
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _import_nodes(tree: ast.AST, type_only: bool = False) -> Iterator[ast.AST]:
    """Every import statement; those under ``if TYPE_CHECKING:`` only with ``type_only``."""
    stack: List[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child) and not type_only:
                stack.extend(child.orelse)
            else:
                stack.append(child)


def _resolve_from(node: ast.ImportFrom, name: str, is_package: bool) -> Optional[str]:
    """The module a ``from X import ...`` names (absolute), or None for another library."""
    if node.level == 0:
        return node.module
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, modules: Dict[str, Path],
               type_only: bool = False) -> Set[str]:
    """The multihost modules that ``name`` imports, anywhere in its body (and, with
    ``type_only``, for the type checker alone)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: Set[str] = set()
    for node in _import_nodes(tree, type_only):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            source = _resolve_from(node, name, is_package)
            if source is None:
                continue
            # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules
                       else source for alias in node.names]
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name in a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(type_only: bool = False) -> Dict[str, Set[str]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules, type_only) for name, path in modules.items()}


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle for each strongly connected group of modules (Tarjan), shortest first."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    groups: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted((_one_cycle(graph, group) for group in groups), key=len)


def _one_cycle(graph: Dict[str, Set[str]], group: List[str]) -> List[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    members = set(group)
    start = group[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    return group


def test_the_graph_sees_the_modules_and_their_imports():
    graph = import_graph()
    assert "multihost.sync.pipeline" in graph and "multihost.remote.main" in graph
    assert "multihost.sync.manifest" in graph["multihost.sync.pipeline"]  # from .manifest
    assert "multihost.helper" in graph["multihost.sync.session"]          # from .. import helper
    assert "multihost.sync.session" in graph["multihost.sync.pipeline"]   # inside a function
    assert "multihost.sync.pipeline" in graph["multihost.sync"]           # the package's face


def test_the_cycle_finder_finds_a_cycle_and_names_it():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_multihost_modules():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_type_checker_finds_no_circle_either():
    graph = import_graph(type_only=True)
    assert "multihost.check.model" in graph["multihost.check.registry"]  # under TYPE_CHECKING
    assert "multihost.check.model" not in import_graph()["multihost.check.registry"]
    cycles = find_cycles(graph)
    assert not cycles, "import cycles (types included): " + "; ".join(
        " -> ".join(c) for c in cycles)
