"""Which files of the code directory travel: git's ignore rules, plus ``.multihostignore``.

The syntax is gitignore's, read from the same places git reads (``.git/info/exclude``
and a ``.gitignore`` in any directory), plus a ``.multihostignore`` in any directory,
which is read after every ``.gitignore`` and so has the last word: ``!weights.pt`` in
``.multihostignore`` syncs a file that ``.gitignore`` keeps out of git. As in git, the
last matching pattern wins, a deeper file beats a shallower one of the same kind, and a
file inside an excluded directory cannot be re-included (the directory is not entered).

``.git`` and ``.multihost-share`` are always skipped, and so is any directory holding a
``.multihost-mirror`` marker (the controller's mirror of run logs must not travel back to
the hosts).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

GITIGNORE = ".gitignore"
MULTIHOSTIGNORE = ".multihostignore"
# .multihost-share: the tokens that tell shared directories (sync/shared.py), per host.
ALWAYS_SKIPPED = frozenset({".git", ".multihost-share"})
MIRROR_MARKER = ".multihost-mirror"


@dataclass(frozen=True)
class Rule:
    pattern: str         # as written, for messages
    regex: "re.Pattern[str]"
    negate: bool
    dir_only: bool
    base: str            # the directory of the file that holds the rule ('' = root)
    source: str          # file:line, for `multihost sync --explain`-style messages

    def matches(self, path: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.base:
            if not path.startswith(self.base + "/"):
                return False
            path = path[len(self.base) + 1:]
        return self.regex.match(path) is not None


def _translate_segment(segment: str) -> str:
    """One path segment of a glob into a regex: * and ? never match '/'."""
    out, i, n = [], 0, len(segment)
    while i < n:
        ch = segment[i]
        if ch == "\\" and i + 1 < n:
            out.append(re.escape(segment[i + 1]))
            i += 2
            continue
        if ch == "*":
            while i < n and segment[i] == "*":
                i += 1
            out.append("[^/]*")
            continue
        if ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = i + 1
            if end < n and segment[end] in "!^":
                end += 1
            if end < n and segment[end] == "]":
                end += 1
            while end < n and segment[end] != "]":
                end += 1
            if end >= n:
                out.append(re.escape(ch))  # no closing bracket: a literal '['
            else:
                body = segment[i + 1:end]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                body = body.replace("\\", "\\\\")
                out.append(f"(?!/)[{body}]")
                i = end + 1
                continue
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def parse_line(line: str, base: str = "", source: str = "") -> Optional[Rule]:
    """One gitignore line into a Rule; None for blanks and comments."""
    line = line.rstrip("\n").rstrip("\r")
    # Trailing spaces are dropped unless escaped with a backslash.
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        stripped += " "
    line = stripped
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate:
        line = line[1:]
    elif line.startswith("\\!") or line.startswith("\\#"):
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    body = line.lstrip("/")
    segments = body.split("/")
    regex = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            regex.append(".*" if last else "(?:.*/)?")
            continue
        regex.append(_translate_segment(segment))
        if not last:
            regex.append("/")
    text = "".join(regex)
    if not anchored:
        text = "(?:.*/)?" + text
    return Rule(line if not negate else "!" + line, re.compile(text + r"\Z", re.DOTALL),
                negate, dir_only, base, source)


def parse_file(text: str, base: str, source: str) -> List[Rule]:
    rules = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        rule = parse_line(line, base, f"{source}:{lineno}")
        if rule is not None:
            rules.append(rule)
    return rules


def _read_rules(path: str, base: str, source: str) -> List[Rule]:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            return parse_file(handle.read(), base, source)
    except OSError:
        return []


class IgnoreRules:
    """The rules of one code directory, loaded directory by directory as a walk enters
    them (``enter``), then asked about each entry (``included``)."""

    def __init__(self, root: str):
        self.root = root
        self.exclude = tuple(_read_rules(os.path.join(root, ".git", "info", "exclude"), "",
                                         ".git/info/exclude"))
        # Per directory: the .gitignore rules and the .multihostignore rules in force
        # there (its own and its ancestors', shallowest first).
        self._git: Dict[str, Tuple[Rule, ...]] = {}
        self._mine: Dict[str, Tuple[Rule, ...]] = {}
        self._active: Dict[str, Tuple[Rule, ...]] = {}

    def enter(self, rel_dir: str, abs_dir: str) -> None:
        parent = rel_dir.rpartition("/")[0] if rel_dir else None
        git = self._git.get(parent, ()) if parent is not None else ()
        mine = self._mine.get(parent, ()) if parent is not None else ()
        prefix = rel_dir + "/" if rel_dir else ""
        git += tuple(_read_rules(os.path.join(abs_dir, GITIGNORE), rel_dir, prefix + GITIGNORE))
        mine += tuple(_read_rules(os.path.join(abs_dir, MULTIHOSTIGNORE), rel_dir,
                                  prefix + MULTIHOSTIGNORE))
        self._git[rel_dir] = git
        self._mine[rel_dir] = mine
        # Checked last-first: the first match decides.
        self._active[rel_dir] = tuple(reversed(self.exclude + git + mine))

    def _rules_for(self, rel_dir: str) -> Tuple[Rule, ...]:
        """The rules in force in rel_dir; a directory no walk entered is entered now (one
        that is gone has no ignore files: its parent's rules hold), so a question about
        any path gets the answer a walk would give."""
        active = self._active.get(rel_dir)
        if active is None:
            if rel_dir:
                self._rules_for(rel_dir.rpartition("/")[0])
            self.enter(rel_dir, os.path.join(self.root, rel_dir) if rel_dir else self.root)
            active = self._active[rel_dir]
        return active

    def deciding_rule(self, rel: str, is_dir: bool) -> Optional[Rule]:
        for rule in self._rules_for(rel.rpartition("/")[0]):
            if rule.matches(rel, is_dir):
                return rule
        return None

    def included(self, rel: str, is_dir: bool) -> bool:
        """Whether an entry of an entered directory travels (its parents were checked)."""
        name = rel.rpartition("/")[2]
        if name in ALWAYS_SKIPPED:
            return False
        if is_dir and os.path.lexists(os.path.join(self.root, rel, MIRROR_MARKER)):
            return False
        rule = self.deciding_rule(rel, is_dir)
        return rule is None or rule.negate

    def ignored(self, rel: str, is_dir: bool = False) -> bool:
        """Whether any path is left out, checking every parent directory too (for paths
        that may no longer exist here, such as files the hosts still hold)."""
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            if not self.included("/".join(parts[:depth]), True):
                return True
        return not self.included(rel, is_dir)
