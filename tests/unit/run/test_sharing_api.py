"""`Cluster.run(name=...)`: a named run from Python, found again by its name."""
import sys

import pytest

import multihost
from multihost.errors import ConfigError
from multihost.run import records


def test_a_run_named_from_python_is_found_by_its_name(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    code = tmp_path / "code"
    code.mkdir()
    (code / "hi.py").write_text("print('hi')\n")
    cluster = multihost.Cluster.local(python=sys.executable, workdir=str(tmp_path / "w"))
    run = cluster.run(["hi.py"], launcher="python", code=str(code), check=False,
                      log_dir=str(tmp_path / "log"), name="hello")
    assert run.wait().exit_code == 0
    assert records.load_run("hello").name == "hello"
    with pytest.raises(ConfigError, match="not a plain word"):
        cluster.run(["hi.py"], launcher="python", code=str(code), name="two words")
