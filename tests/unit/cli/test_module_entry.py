"""`python -m multihost` run from a code directory never imports the user's files: a
training script named like a standard module (numbers.py) once took the place of the
standard one in the controller and killed every run started from that directory."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_a_script_named_like_a_standard_module_is_not_imported_by_the_controller(tmp_path):
    for name in ("numbers", "statistics", "argparse", "json", "random"):
        (tmp_path / f"{name}.py").write_text("raise SystemExit('the controller imported me')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # `import multihost` (before its __main__) imports json and random; the CLI argparse;
    # the straggler judge and the scale table statistics, which imports numbers.
    done = subprocess.run([sys.executable, "-m", "multihost", "status", "--help"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([sys.executable, "-c", "import statistics"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert "imported me" in done.stderr      # the trap works: -c has the directory first too
