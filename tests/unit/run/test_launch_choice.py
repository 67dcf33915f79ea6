"""Without --launcher, the launcher follows the framework the script imports."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from multihost.errors import ConfigError
from multihost.host_parsing import parse_hostfile
from multihost.hosts import load_hosts
from multihost.run.launcher_choice import choose_launcher


def write(root: Path, name: str, text: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def test_a_paddle_script_runs_under_paddles_launcher_and_says_why(tmp_path):
    write(tmp_path, "tools/train.py", "import paddle\nimport paddle.distributed as dist\n")
    choice = choose_launcher(["tools/train.py", "-c", "cfg.yml"], str(tmp_path))
    assert choice.name == "paddle"
    assert choice.line() == ("launcher paddle: tools/train.py imports paddle, not torch "
                             "(--launcher NAME to choose another)")


def test_a_suite_imported_through_local_modules_counts_as_paddle(tmp_path):
    # PaddleDetection style: tools/train.py imports ppdet (a package of the code dir),
    # whose modules import paddle.
    write(tmp_path, "tools/train.py", """\
        import os, sys
        sys.path.insert(0, os.path.abspath(os.path.join(__file__, '../../')))
        from ppdet.engine import Trainer
        """)
    write(tmp_path, "ppdet/__init__.py", "")
    write(tmp_path, "ppdet/engine/__init__.py", "from .trainer import Trainer\n")
    write(tmp_path, "ppdet/engine/trainer.py", "import paddle.nn as nn\nclass Trainer: pass\n")
    assert choose_launcher(["tools/train.py"], str(tmp_path)).name == "paddle"


@pytest.mark.parametrize("imports, expected, words", [
    ("import torch\n", "torchrun", "imports torch"),
    ("import torch\nimport paddle\n", "torchrun", "both torch and paddle"),
    ("import numpy\n", "torchrun", "neither torch nor paddle"),
    ("def broken(:\n", "torchrun", "neither torch nor paddle"),
])
def test_anything_but_paddle_alone_keeps_torchrun(tmp_path, imports, expected, words):
    write(tmp_path, "train.py", imports)
    choice = choose_launcher(["train.py"], str(tmp_path))
    assert choice.name == expected and words in choice.reason


def test_the_flag_and_the_hostfile_win_over_the_imports(tmp_path):
    write(tmp_path, "train.py", "import paddle\n")
    assert choose_launcher(["train.py"], str(tmp_path), given="python").name == "python"
    assert choose_launcher(["train.py"], str(tmp_path), hostfile="torchrun").name == "torchrun"


def test_a_module_run_with_dash_m_is_read_too(tmp_path):
    write(tmp_path, "pkg/__init__.py", "")
    write(tmp_path, "pkg/train.py", "from paddle import distributed\n")
    assert choose_launcher(["-m", "pkg.train"], str(tmp_path)).name == "paddle"


def test_the_hostfile_names_one_launcher_for_the_job(tmp_path):
    hosts = tmp_path / "hosts.ini"
    hosts.write_text("[defaults]\nlauncher = paddle\n[10.0.0.1]\n[10.0.0.2]\n")
    assert {h.launcher for h in load_hosts(None, str(hosts))} == {"paddle"}
    hosts.write_text("[10.0.0.1]\nlauncher = paddle\n")
    with pytest.raises(ConfigError, match="launcher is set for the whole job"):
        parse_hostfile(hosts)
