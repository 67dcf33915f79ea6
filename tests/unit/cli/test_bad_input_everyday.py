"""Bad input of job files, host subsets and other launchers' hostfiles: the real CLI, one
line naming the file, flag or line and the fix, exit 2, nothing created (the rules of
test_bad_input.py, whose sandbox this reuses)."""
from __future__ import annotations

import pytest

from test_bad_input import Sandbox, assert_refused, sandbox  # noqa: F401 (a fixture)

CASES = [
    ("job-unknown-key", ["run", "-f", "{files}/job.toml"], {"job.toml": 'code = "."\ngpu = "0"\n'},
     ["job.toml", "unknown key 'gpu'", "known keys are"]),
    ("job-not-toml", ["run", "-f", "{files}/job.toml"], {"job.toml": "code = \n"},
     ["job.toml", "not valid TOML"]),
    ("job-wrong-type", ["run", "-f", "{files}/job.toml"], {"job.toml": 'nproc_per_node = "two"\n'},
     ["job.toml", "nproc_per_node is 'two'"]),
    ("job-bad-port", ["run", "-f", "{files}/job.toml"], {"job.toml": "port = 70000\n"},
     ["job.toml", "--port", "70000"]),
    ("job-missing", ["run", "-f", "{files}/none.toml"], {}, ["none.toml", "No such file"]),
    ("include-unknown-host", ["run", "--ips=127.0.0.1,127.0.0.2", "--include", "127.0.0.[2-3]",
                              "--", "train.py"], {}, ["--include", "127.0.0.3", "not one of"]),
    ("exclude-typo", ["exec", "--ips=127.0.0.1,127.0.0.2", "--exclude", "127.0.0.9", "--", "true"],
     {}, ["--exclude", "127.0.0.9"]),
    ("exclude-everything", ["run", "--ips=127.0.0.1,127.0.0.2", "--exclude", "127.0.0.[1-2]",
                            "--", "train.py"], {}, ["leave no host"]),
    ("include-bad-nodeset", ["run", "--ips=127.0.0.1", "--include", "127.0.0.[1-", "--",
                             "train.py"], {}, ["--include", "'[' without ']'"]),
    ("hostfile-max-slots", ["run", "--hostfile", "{files}/hostfile", "--", "train.py"],
     {"hostfile": "127.0.0.1 slots=2 max_slots=4\n"}, ["hostfile:1", "NAME slots=N"]),
    ("hostfile-slots-zero", ["run", "--hostfile", "{files}/hostfile", "--", "train.py"],
     {"hostfile": "127.0.0.1 slots=0\n"}, ["hostfile:1", "slots '0'"]),
    ("gpus-range-backwards", ["run", "--ips=127.0.0.1", "--gpus", "3-0", "--", "train.py"], {},
     ["--gpus", "'3-0'", "backwards"]),
    ("env-file-no-value", ["run", "--ips=127.0.0.1", "--env-file", "{files}/e.env", "--",
                           "train.py"], {"e.env": "export A=1\nAPI_TOKEN hunter22\n"},
     ["e.env:2", "API_TOKEN"]),
    ("rerun-no-runs", ["rerun"], {}, ["no run has been started"]),
]


@pytest.mark.parametrize("argv,files,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_in_one_line(sandbox: Sandbox, argv, files, words):  # noqa: F811
    sandbox.write(files)
    line = assert_refused(sandbox, argv, *words)
    assert "hunter22" not in line
