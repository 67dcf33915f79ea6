"""The Python half of bench/gpu_truth.sh: records nvidia-smi as multihost calls it, turns
a run's gpu.log into a replay file (bench/gpu_truth_judge.py writes the summary).

    python bench/gpu_truth.py record DIR [--load]     every nvidia-smi query, into DIR
    python bench/gpu_truth.py replay DIR GPU_LOG...   DIR/nvidia-smi-use-<machine>.csv

The argv's come from the code that runs them (check's GPU_QUERY and APPS_QUERY, the run
sampler's command and environment), so the recording follows the code, not a copy of it.
The recorded files have the formats of the test data in tests/unit/data/check/: the raw
answer of a query (nvidia-smi-gpus-*.csv, nvidia-smi-apps-*.csv), and the stand-in's
replay (nvidia-smi-use-*.csv: `#` comment lines, samples apart by blank lines).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from multihost.check.parsers import parse_gpu_use, parse_gpus  # noqa: E402
from multihost.remote.check import ops as ops_check  # noqa: E402
from multihost.remote.run import gpus as run_gpus  # noqa: E402

SAMPLES = 3             # idle samples of the sampler's query, SAMPLE_GAP s apart
SAMPLE_GAP = 1.0
QUERY_TIMEOUT = 10      # check's own default for nvidia-smi (gpu_timeout)


def queries():
    """(name, argv, env, cwd) of every nvidia-smi call multihost makes, as it makes it."""
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as run_dir:
        sampler = run_gpus.GpuSampler(run_dir, env, interval=1)
    yield "gpus", list(ops_check.GPU_QUERY), None, None        # check: the GPUs
    yield "apps", list(ops_check.APPS_QUERY), None, None       # check: who uses them
    if sampler.command:                                         # run: gpu.log's samples
        yield "use", list(sampler.command), dict(sampler.env), "/"


def call(argv, env=None, cwd=None, timeout=QUERY_TIMEOUT):
    """(exit code, stdout, stderr, seconds); 127 when the program is missing, 124 on timeout."""
    started = time.monotonic()
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, env=env, cwd=cwd, timeout=timeout)
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired:
        code, out, err = 124, b"", b"timed out after %ds\n" % timeout
    except OSError as exc:
        code, out, err = 127, b"", (str(exc) + "\n").encode()
    return (code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
            time.monotonic() - started)


def machine(directory: Path) -> str:
    """A short name for the recording's files: h100x8, or standin without a GPU list."""
    gpus = parse_gpus(_read(directory / "gpus.out"))
    if not gpus:
        return "standin"
    words = [w for w in re.split(r"[^A-Za-z0-9]+", gpus[0].name) if w and w.upper() != "NVIDIA"]
    model = next((w for w in words if re.search(r"[0-9]", w)), words[0] if words else "gpu")
    return "%sx%d" % (model.lower(), len(gpus))


def record(directory: Path, load: bool) -> int:
    """Every query, its stdout/stderr/exit code/seconds/argv; the header of the machine.
    With --load (while a rank works on the GPU): the check's and the sampler's answers
    under load, beside the idle ones."""
    directory.mkdir(parents=True, exist_ok=True)
    suffix = "-load" if load else ""
    table = []
    for name, argv, env, cwd in queries():
        rounds = 1 if (load or name != "use") else SAMPLES
        for turn in range(rounds):
            if turn:
                time.sleep(SAMPLE_GAP)
            code, out, err, seconds = call(argv, env, cwd)
            stem = name + suffix + ("" if turn == 0 else ".%d" % turn)
            (directory / (stem + ".out")).write_text(out)
            (directory / (stem + ".err")).write_text(err)
            (directory / (stem + ".rc")).write_text("%d\n" % code)
            table.append("%s\t%d\t%.3f\t%s" % (stem, code, seconds, json.dumps(argv)))
    with open(directory / "calls.tsv", "a") as handle:
        handle.write("".join(line + "\n" for line in table))
    if not load:
        header(directory)
        name = machine(directory)
        for kind in ("gpus", "apps"):
            shutil.copyfile(directory / (kind + ".out"),
                            directory / ("nvidia-smi-%s-%s.csv" % (kind, name)))
    return 0


def header(directory: Path) -> None:
    """What machine made the recording: nvidia-smi -L, driver, CUDA, host, date, torch."""
    smi = shutil.which("nvidia-smi") or "nvidia-smi"
    listed = call([smi, "-L"])
    plain = call([smi])
    (directory / "nvidia-smi.txt").write_text(plain[1] + plain[2])
    driver = re.search(r"Driver Version:\s*(\S+)", plain[1])
    cuda = re.search(r"CUDA Version:\s*(\S+)", plain[1])
    job_python = os.environ.get("JOB_PYTHON") or sys.executable
    torch = call([job_python, "-c", "import torch; print(torch.__version__, "
                  "torch.version.cuda, torch.cuda.is_available())"], timeout=120)
    lines = ["host: %s" % socket.gethostname(),
             "date: %s" % time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
             "nvidia-smi: %s" % smi,
             "driver: %s" % (driver.group(1) if driver else "unknown (nvidia-smi: exit %d)"
                             % plain[0]),
             "cuda (driver): %s" % (cuda.group(1) if cuda else "unknown"),
             "torch (version, cuda, cuda available): %s"
             % (torch[1].strip() or "none: " + torch[2].strip()[-200:]),
             "nvidia-smi -L (exit %d):" % listed[0]]
    lines += ["  " + line for line in (listed[1] + listed[2]).splitlines()]
    (directory / "header.txt").write_text("\n".join(lines) + "\n")


def replay(directory: Path, logs) -> int:
    """The stand-in's replay file: the idle samples, then those of the runs' gpu.log."""
    name = machine(directory)
    said = _read(directory / "header.txt").splitlines()
    title = next((line for line in said if line.startswith("nvidia-smi -L")), None)
    listed = said[said.index(title) + 1:] if title else []
    blocks = []
    for turn in range(SAMPLES):
        answer = _read(directory / ("use.out" if turn == 0 else "use.%d.out" % turn))
        if parse_gpu_use(answer):
            blocks.append(answer)
    idle = len(blocks)
    for log in logs:
        blocks += samples_of(_read(Path(log)))
    comment = ["A recording of `nvidia-smi --query-gpu=%s --format=csv,noheader,nounits`"
               % run_gpus.QUERY,
               "(the run sampler's query) on %s, made by bench/gpu_truth.sh on %s;"
               % (name, _first(said, "date: ")),
               "%d idle samples, then %d from gpu.log while a rank trained, one per block."
               % (idle, len(blocks) - idle),
               "driver %s, CUDA %s, %s" % (_first(said, "driver: "),
                                           _first(said, "cuda (driver): "),
                                           "; ".join(gpu.strip() for gpu in listed) or "no GPU list")]
    text = "".join("# " + line + "\n" for line in comment) + "\n"
    text += "\n\n".join(block.strip("\n") for block in blocks) + "\n"
    (directory / ("nvidia-smi-use-%s.csv" % name)).write_text(text)
    return 0


def _first(lines, prefix):
    return next((line[len(prefix):] for line in lines if line.startswith(prefix)), "unknown")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def samples_of(gpu_log: str):
    """gpu.log's samples as nvidia-smi printed them: its rows without their time, one
    block per time; the rows multihost cannot parse are dropped, as it drops them."""
    blocks = {}
    for line in gpu_log.splitlines():
        stamp, _, row = line.partition(",")
        if not line.startswith("#") and parse_gpu_use(row.strip()):
            blocks.setdefault(stamp.strip(), []).append(row.strip())
    return ["\n".join(rows) for rows in blocks.values()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("directory", type=Path)
    rec.add_argument("--load", action="store_true")
    rep = sub.add_parser("replay")
    rep.add_argument("directory", type=Path)
    rep.add_argument("logs", nargs="*")
    args = parser.parse_args(argv)
    if args.what == "record":
        return record(args.directory, args.load)
    return replay(args.directory, args.logs)


if __name__ == "__main__":
    sys.exit(main())
