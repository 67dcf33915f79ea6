"""The summary of bench/gpu_truth.sh: each step, its exit codes, and whether it did what
issue 30 expects of it on a real GPU.

    python bench/gpu_truth_judge.py OUT --cuda 0|1

Every command of a step left OUT/NAME.cmd, .out, .err and .rc (or NAME.skipped with the
reason). Without CUDA (the dry run), a step that needs it is "skipped: no CUDA"; where
the script rehearsed it on the CPU instead (the stand-in nvidia-smi, gloo, a raised
out-of-memory error, a rank in time.sleep), its verdict is the rehearsal's note, so the
dry run proves the script's own plumbing before a GPU is at hand.
Writes OUT/summary.txt and OUT/summary.json; exits 1 when a step or a rehearsal failed.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from multihost.check.parsers import parse_gpu_use, parse_gpus  # noqa: E402
from multihost.logs.gpus import parse_gpu_log  # noqa: E402


class Step:
    def __init__(self, out: Path, names):
        self.out, self.names = out, names

    def rc(self, name):
        text = self.read(name + ".rc").strip()
        return int(text) if text.lstrip("-").isdigit() else None

    def read(self, suffix):
        try:
            return (self.out / suffix).read_text(errors="replace")
        except OSError:
            return ""

    def ran(self):
        return any(self.rc(name) is not None for name in self.names)

    def skipped(self):
        return next((self.read(n + ".skipped").strip() for n in self.names
                     if (self.out / (n + ".skipped")).exists()), None)


def _expect(problems, condition, text):
    if not condition:
        problems.append(text)


def judge_record(step: Step, cuda: bool):
    """Every query answered; the GPU list and the sampler's rows parse as multihost reads them."""
    problems = []
    smi = step.out / "nvidia-smi"
    calls = [line.split("\t") for line in step.read("nvidia-smi/calls.tsv").splitlines()]
    codes = {row[0]: int(row[1]) for row in calls if len(row) == 4}
    _expect(problems, step.rc("1-nvidia-smi") == 0, "the recording did not finish")
    _expect(problems, (smi / "header.txt").exists(), "no header.txt")
    uses = parse_gpu_use(step.read("nvidia-smi/use.out"))
    _expect(problems, codes.get("use") == 0 and uses, "the sampler's query gave no row")
    gpus = parse_gpus(step.read("nvidia-smi/gpus.out"))
    if cuda:
        _expect(problems, codes and all(code == 0 for code in codes.values()),
                "a query failed: %s" % codes)
        _expect(problems, gpus, "check's GPU query gave no GPU")
    seconds = [float(row[2]) for row in calls if len(row) == 4]
    note = "%d calls (%s), %d GPU(s) listed, %d sampler row(s), slowest call %.2fs" % (
        len(codes), ", ".join("%s %d" % item for item in codes.items()), len(gpus), len(uses),
        max(seconds or [0]))
    return problems, note


def judge_check(step: Step, cuda: bool):
    problems = []
    for name in step.names:
        _expect(problems, step.rc(name) == 0, "%s: exit %s" % (name, step.rc(name)))
    for name in ("2-check-json", "2-collective-json"):
        try:
            doc = json.loads(step.read(name + ".out"))
        except ValueError:
            problems.append("%s: not JSON" % name)
            continue
        _expect(problems, doc.get("ok") is True, "%s: ok is not true" % name)
        if "collective" in name:
            _expect(problems, doc.get("collective"), "%s: no collective figures" % name)
    plain = step.read("2-check.out")
    _expect(problems, re.search(r"NVIDIA|GPU", plain), "2-check: no GPU in the table")
    _expect(problems, "busbw" in step.read("2-collective.out"), "2-collective: no busbw table")
    return problems, "GPU column: %s" % _cell(plain, "GPUS")


def _cell(table: str, column: str) -> str:
    lines = table.splitlines()
    if not lines or column not in lines[0]:
        return "?"
    start = lines[0].index(column)
    return lines[1][start:start + 24].split("  ")[0].strip() if len(lines) > 1 else "?"


def judge_run(step: Step, cuda: bool):
    """The run succeeded, gpu.log was written and parsed, the plain lines carry the gpu
    column; on CUDA: the rank on GPU 0, and the GPU busy while it trained."""
    problems = []
    _expect(problems, step.rc("3-run") == 0, "exit %s" % step.rc("3-run"))
    samples = parse_gpu_log(step.read("3-gpu.log"))
    _expect(problems, samples, "no sample parsed from gpu.log")
    rows = [gpu for _, gpus in samples for gpu in gpus]
    busy = [gpu for gpu in rows if (gpu.util or 0) > 0 and (gpu.used_mib or 0) > 0]
    _expect(problems, busy, "no sample with utilisation and memory above zero")
    said = [line for line in step.read("3-run.err").splitlines() if "(node 0): gpu " in line]
    _expect(problems, said, "no gpu line among the plain lines")
    if cuda:
        placed = re.search(r"rank 0: torch.cuda.current_device (\d+), CUDA_VISIBLE_DEVICES=(\S*)",
                           step.read("3-run.out"))
        _expect(problems, placed and placed.groups() == ("0", "0"),
                "the rank did not say it is on device 0 with CUDA_VISIBLE_DEVICES=0")
    top = max((gpu.util or 0 for gpu in rows), default=0)
    return problems, "%d sample(s), utilisation up to %d%%, %s" % (
        len(samples), top, said[-1].split(": ", 1)[-1] if said else "no gpu line")


def judge_oom(step: Step, cuda: bool):
    problems = []
    code, err = step.rc("4-oom"), step.read("4-oom.err")
    _expect(problems, code not in (None, 0, 124, 126, 127, 137), "exit %s" % code)
    cause = err[err.find("root cause"):] if "root cause" in err else ""
    _expect(problems, cause, "no root cause")
    _expect(problems, re.search(r"CUDA out of memory", cause), "the root cause does not say "
                                                              "CUDA out of memory")
    _expect(problems, re.search(r"\brank 0\b", cause), "the root cause does not name rank 0")
    first = cause.splitlines()[0] if cause else ""
    return problems, first[:160]


def judge_refusal(step: Step, cuda: bool):
    problems = []
    code, err = step.rc("5-refusal"), step.read("5-refusal.err")
    _expect(problems, code not in (None, 0, 124, 126, 127, 137), "exit %s" % code)
    _expect(problems, "launching" not in err and not step.read("5-refusal.out").strip()
            .startswith("127.0.0.1 ["), "something started")
    if cuda:
        _expect(problems, re.search(r"GPU [0-9,-]+ requested", err), "no line naming the GPU")
    fails = [line for line in err.splitlines() if line.startswith(("FAIL ", "multihost:"))]
    _expect(problems, fails, "no line saying why")
    return problems, "exit %s; %s" % (code, fails[-1][:160] if fails else "no FAIL line")


def judge_stacks(step: Step, cuda: bool):
    problems = []
    for name in step.names:
        _expect(problems, step.rc(name) == 0, "%s: exit %s" % (name, step.rc(name)))
    _expect(problems, (step.out / "6-marker").exists(), "the rank never said it was stuck")
    shown = step.read("6-stacks.out")
    where = "spin_in_cuda_sync" if cuda else "spin_without_cuda"
    _expect(problems, where in shown, "the stack does not show %s" % where)
    if cuda:
        _expect(problems, "synchronize" in shown, "the stack does not show torch.cuda.synchronize")
    return problems, "stack shows %s: %s" % (where, "yes" if where in shown else "no")


STEPS = [  # number, what, the commands' names, needs CUDA, judge
    ("1", "nvidia-smi as multihost calls it", ["1-nvidia-smi"], False, judge_record),
    ("2", "check --gpus 0, check --collective --gpus 0",
     ["2-check", "2-check-json", "2-collective", "2-collective-json"], True, judge_check),
    ("3", "run --gpus 0 --plain -- examples/train_ddp.py", ["3-run"], True, judge_run),
    ("4", "a rank past the GPU's memory: the root cause", ["4-oom"], True, judge_oom),
    ("5", "--gpus beyond the GPUs: refused before start", ["5-refusal"], True, judge_refusal),
    ("6", "stacks of a rank in torch.cuda.synchronize",
     ["6-run", "6-stacks", "6-stacks-json", "6-stop"], True, judge_stacks),
]


def summarise(out: Path, cuda: bool):
    rows = []
    for number, what, names, needs_cuda, judge in STEPS:
        step = Step(out, names)
        codes = ",".join("-" if step.rc(n) is None else str(step.rc(n)) for n in names)
        skipped = step.skipped()
        row = {"step": number, "what": what, "exit": codes, "note": ""}
        if needs_cuda and not cuda:
            row["status"] = "skipped: no CUDA"
            if step.ran():
                problems, note = judge(step, False)
                row["rehearsal"] = "FAILED: " + "; ".join(problems) if problems else "ok"
                row["note"] = "rehearsal on CPU: %s (%s)" % (row["rehearsal"], note)
        elif skipped:
            row["status"] = "skipped: " + skipped
        else:
            problems, note = judge(step, cuda)
            row["status"] = "FAILED: " + "; ".join(problems) if problems else "ok"
            row["note"] = note
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--cuda", type=int, choices=(0, 1), required=True)
    args = parser.parse_args(argv)
    rows = summarise(args.out, bool(args.cuda))
    header = (args.out / "nvidia-smi" / "header.txt")
    lines = ["gpu truth (%s)" % ("CUDA" if args.cuda else "dry run: no CUDA, stand-in nvidia-smi")]
    lines += ["  " + line for line in (header.read_text().splitlines() if header.exists() else [])
              if not line.startswith("  ")]
    lines.append("")
    for row in rows:
        lines.append("step %s  exit %-9s %s  -- %s" % (row["step"], row["exit"], row["status"],
                                                       row["what"]))
        if row["note"]:
            lines.append("        " + row["note"])
    (args.out / "summary.txt").write_text("\n".join(lines) + "\n")
    (args.out / "summary.json").write_text(json.dumps({"cuda": bool(args.cuda), "steps": rows},
                                                      indent=2) + "\n")
    sys.stdout.write("\n".join(lines) + "\n")
    failed = [row for row in rows if row["status"].startswith("FAILED")
              or row.get("rehearsal", "ok") != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
