"""What `multihost sync` loads to find nothing to do: start-up is most of what such a
sync costs, and a user notices it on every edit-sync-run loop. Modules of other
commands (run, dashboard, check), rich, paramiko, the comparison by content, the node
sets (only --include/--exclude need them), and stdlib modules the sync never uses must
not be imported by it."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

NEVER = ("rich", "paramiko", "cryptography", "dotenv", "argcomplete", "multihost.run",
         "multihost.views.dashboard", "multihost.views.board", "multihost.check",
         "multihost.sync.session", "multihost.sync.deliver", "ipaddress", "multihost.nodeset")

# -S: as a regular install starts (an editable install's `site` hook imports pathlib
# before multihost runs); the sync needs nothing from site-packages.
SYNC = """
import json, sys
sys.path.insert(0, sys.argv[3])
from multihost.cli import main
code = main(["sync", "--ips", "127.0.0.1", "--code", sys.argv[1], "--workdir", sys.argv[2],
             "--plain"])
print(json.dumps([code, sorted(sys.modules)]))
"""


def sync_modules(tmp_path):
    env = dict(os.environ, HOME=str(tmp_path / "home"))
    done = subprocess.run([sys.executable, "-S", "-c", SYNC, str(tmp_path / "code"),
                           str(tmp_path / "work"), REPO], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    code, modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 0
    return modules


@pytest.mark.parametrize("edit", [False, True], ids=["no change", "one file changed"])
def test_a_sync_with_little_to_do_imports_nothing_it_does_not_use(tmp_path, edit):
    (tmp_path / "code" / "pkg").mkdir(parents=True)
    for i in range(3):
        (tmp_path / "code" / "pkg" / f"m{i}.py").write_text(f"x = {i}\n")
    sync_modules(tmp_path)   # the first sync: the full path, whatever it needs
    if edit:
        with open(tmp_path / "code" / "pkg" / "m1.py", "a") as handle:
            handle.write("y = 1\n")
    modules = sync_modules(tmp_path)
    loaded = [m for m in modules if m.startswith(NEVER)]
    assert loaded == []
    assert "multihost.sync.pipeline" in modules   # it did sync
