"""What `multihost fetch` says: a line per path and host, a failure as one line with its fix."""
from __future__ import annotations

from typing import List, Sequence, Tuple


def fetch_lines(results: Sequence["Fetched"]) -> List[Tuple[str, bool]]:
    """(line, is_failure) in the order asked."""
    lines = []
    for r in results:
        if r.ok:
            lines.append((f"{r.host}: {r.path} -> {r.dest}", False))
        else:
            lines.append((f"multihost: {r.host}: {r.error} (fix: {r.fix})", True))
    return lines
