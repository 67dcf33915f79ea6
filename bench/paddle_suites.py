"""PaddleDetection's and PaddleOCR's own `tools/train.py -c configs/...yml` through
multihost, the way their distributed-training docs run them: their real code, unmodified,
from checkouts you provide; a tiny synthetic dataset in the format their configs read;
CPU; 2 lab hosts x 2 ranks; each suite's reference command line through `multihost
fleetrun` and the headline `multihost run` form.

    sudo .venv/bin/python bench/paddle_suites.py --detection DIR --ocr DIR [--python PY]

--detection / --ocr (or MULTIHOST_PADDLEDETECTION / MULTIHOST_PADDLEOCR): a checkout of
PaddlePaddle/PaddleDetection (release/2.7.1 measured) or PaddlePaddle/PaddleOCR (the code of
release 2.8.0 measured); a suite without one is skipped, saying so. --python (or
MULTIHOST_PADDLE_SUITES_PYTHON): a python with paddlepaddle and the suites' requirements;
without it a venv is made once from PyPI at /var/cache/multihost-tests/paddle-suites-venv.
Nothing is downloaded at run time: the lab has no route out, pretrain_weights is empty,
and the data is made here.

A run passes when multihost exits 0, every rank 0-3 wrote lines (0-1 on the first host),
the suite's own count of iterations per epoch is the samples divided by a data-parallel
group of 4 (its DistributedBatchSampler splits by world size), its last iteration's loss
is logged, and no process of the run is left on either host. Prints each command line
and its wall time.
"""
from __future__ import annotations

import argparse
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from multihost.lab import Lab, host_address  # noqa: E402

VENV_DEFAULT = Path("/var/cache/multihost-tests/paddle-suites-venv")
# paddle 3.3.1 runs both; the rest is their requirements.txt as it installs today
# (`sklearn==0.0` there is the retired stub: scikit-learn), numpy<2 for opencv 4.6.
PACKAGES = ["paddlepaddle==3.3.1", "numpy<2", "opencv-python<=4.6.0.66",
            "opencv-contrib-python<=4.6.0.66", "requests", "tqdm", "typeguard", "PyYAML",
            "shapely", "scipy", "terminaltables", "Cython", "pycocotools", "setuptools",
            "Pillow", "pyclipper", "lmdb", "rapidfuzz", "scikit-image", "imgaug", "lapx",
            "scikit-learn", "motmetrics"]
NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
DET_IMAGES, DET_BATCH = 8, 1
REC_WORDS, REC_BATCH = 16, 2

# Run by the suites' python: COCO json + JPEGs of coloured boxes, and an LMDB of word
# images (the OCR config's LMDBDataSet), training and validation alike.
MAKE_DATA = textwrap.dedent("""\
    import json, os, random, shutil, sys
    import cv2, lmdb, numpy as np
    root, images_n, words_n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(0)
    coco = os.path.join(root, "coco")
    images, anns = [], []
    for split in ("train2017", "val2017", "annotations"):
        os.makedirs(os.path.join(coco, split), exist_ok=True)
    for i in range(1, images_n + 1):
        img = np.full((96, 96, 3), 200, np.uint8)
        for _ in range(rng.randint(1, 2)):
            x, y, w, h = (rng.randint(0, 50), rng.randint(0, 50), rng.randint(16, 40),
                          rng.randint(16, 40))
            img[y:y + h, x:x + w] = [rng.randint(0, 255) for _ in range(3)]
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": 1,
                         "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0})
        name = "%012d.jpg" % i
        for split in ("train2017", "val2017"):
            cv2.imwrite(os.path.join(coco, split, name), img)
        images.append({"id": i, "file_name": name, "width": 96, "height": 96})
    doc = {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "box"}]}
    for split in ("train2017", "val2017"):
        with open(os.path.join(coco, "annotations", "instances_%s.json" % split), "w") as f:
            json.dump(doc, f)
    training = os.path.join(root, "rec_lmdb", "training")
    os.makedirs(training)
    env = lmdb.open(training, map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i in range(1, words_n + 1):
            word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789")
                           for _ in range(rng.randint(3, 6)))
            img = np.full((32, 100, 3), 255, np.uint8)
            cv2.putText(img, word, (4, 24), cv2.FONT_HERSHEY_SIMPLEX, 0.7, (0, 0, 0), 2)
            txn.put(b"image-%09d" % i, cv2.imencode(".png", img)[1].tobytes())
            txn.put(b"label-%09d" % i, word.encode())
        txn.put(b"num-samples", str(words_n).encode())
    env.close()
    # a second environment: one process may not open the same LMDB twice
    shutil.copytree(training, os.path.join(root, "rec_lmdb", "validation"))
""")

# Every process of a run carries MULTIHOST_RUN_ID in its environment.
SCAN = textwrap.dedent("""\
    import os, sys
    marker = ("MULTIHOST_RUN_ID=" + sys.argv[1]).encode()
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) not in (os.getpid(), os.getppid()):
            try:
                env = open("/proc/%s/environ" % pid, "rb").read().split(b"\\0")
            except OSError:
                continue
            if marker in env:
                print(pid)
""")


@dataclass(frozen=True)
class Suite:
    name: str
    option: str
    env: str
    config: str
    overrides: Callable[[Path], List[str]]
    fleetrun_flags: Sequence[str]      # the reference doc's launcher flags, on CPU
    fleetrun_after: Sequence[str]      # what the reference doc passes the script
    per_epoch: re.Pattern              # the suite's own count of iterations per epoch
    iteration: re.Pattern              # one iteration's line: (index, loss)
    expected_per_epoch: int
    index_base: int                    # the index its last iteration prints: count - 1 + base


def detection_overrides(data: Path) -> List[str]:
    return ["-o", "use_gpu=false", "pretrain_weights=", "epoch=1", "worker_num=0",
            "log_iter=1", f"TrainReader.batch_size={DET_BATCH}",
            f"TrainDataset.dataset_dir={data}/coco", f"EvalDataset.dataset_dir={data}/coco"]


def ocr_overrides(data: Path) -> List[str]:
    return ["-o", "Global.use_gpu=false", "Global.epoch_num=1", "Global.print_batch_step=1",
            f"Train.dataset.data_dir={data}/rec_lmdb/training",
            f"Eval.dataset.data_dir={data}/rec_lmdb/validation",
            f"Train.loader.batch_size_per_card={REC_BATCH}", "Train.loader.num_workers=0",
            "Eval.loader.num_workers=0"]


SUITES = [
    # PaddleDetection's DistributedTraining doc: fleetrun --ips=... --selected_gpu 0,...,7
    #   tools/train.py -c configs/ppyoloe/ppyoloe_crn_s_300e_coco.yml --eval
    Suite("PaddleDetection", "detection", "MULTIHOST_PADDLEDETECTION",
          "configs/ppyoloe/ppyoloe_crn_s_300e_coco.yml", detection_overrides,
          fleetrun_flags=(), fleetrun_after=("--eval",),
          per_epoch=re.compile(r"ppdet\.engine INFO: Epoch: \[0\] \[\d+/(\d+)\]"),
          iteration=re.compile(r"ppdet\.engine INFO: Epoch: \[0\] \[(\d+)/\d+\].* loss: ([\d.]+) "),
          expected_per_epoch=DET_IMAGES // (WORLD * DET_BATCH), index_base=0),
    # PaddleOCR's distributed_training doc: python3 -m paddle.distributed.launch
    #   --log_dir=./log/ --ips="${ip_list}" --gpus="0,...,7" tools/train.py -c configs/rec/...
    Suite("PaddleOCR", "ocr", "MULTIHOST_PADDLEOCR",
          "configs/rec/rec_mv3_none_bilstm_ctc.yml", ocr_overrides,
          fleetrun_flags=("--log_dir=./log/",), fleetrun_after=(),
          per_epoch=re.compile(r"ppocr INFO: train dataloader has (\d+) iters"),
          iteration=re.compile(r"ppocr INFO: epoch: \[1/1\], global_step: (\d+),"
                               r".* loss: ([\d.]+),"),
          expected_per_epoch=REC_WORDS // (WORLD * REC_BATCH), index_base=1),
]


def commands(suite: Suite, ips: str, python: str, checkout: Path, data: Path) -> dict:
    """{form: argv after `multihost`}: the reference line with fleetrun replaced, and the
    headline form. --code and --python are multihost's own: the checkout stays as given."""
    script = ["tools/train.py", "-c", suite.config]
    own = ["--python", python, "--code", str(checkout), "--plain"]
    return {
        "fleetrun": ["fleetrun", *suite.fleetrun_flags, f"--ips={ips}",
                     f"--nproc_per_node={PER_NODE}", *own, *script, *suite.fleetrun_after,
                     *suite.overrides(data)],
        "run": ["run", f"--ips={ips}", "--nproc_per_node", str(PER_NODE), *own, "--",
                *script, *suite.overrides(data)],
    }


def judge(suite: Suite, lab: Lab, rc: int, out: str, err: str) -> str:
    """'' when the run passed, else what fell short."""
    run_id = re.search(r"run (\d{8}-\d{6}-[0-9a-f]{4})", err)
    if rc != 0 or not run_id or not re.search(r"run \S+ succeeded", err):
        return f"exit {rc}: {err.strip().splitlines()[-1] if err.strip() else ''}"
    ranks = {int(r): h for h, r in re.findall(r"(?m)^(\S+) \[(\d+)\]: ", out)}
    want = {r: host_address(r // PER_NODE + 1) for r in range(WORLD)}
    if ranks != want:
        return f"ranks seen {ranks}, wanted {want}"
    per_epoch = [int(n) for n in suite.per_epoch.findall(out)]
    if not per_epoch or set(per_epoch) != {suite.expected_per_epoch}:
        return (f"iterations per epoch {per_epoch}, wanted {suite.expected_per_epoch} "
                f"(world {WORLD})")
    iterations = suite.iteration.findall(out)
    last = suite.expected_per_epoch - 1 + suite.index_base
    if not iterations or int(iterations[-1][0]) != last:
        return f"last iteration {iterations[-1:]} (wanted index {last})"
    for i in range(1, NODES + 1):
        left = subprocess.run(lab.host_argv(i, [sys.executable, "-c", SCAN, run_id.group(1)]),
                              capture_output=True, text=True, check=True).stdout.split()
        if left:
            return f"{host_address(i)}: processes left: {left}"
    return ""


def suites_python(given: Optional[str]) -> str:
    if given:
        return given
    python = VENV_DEFAULT / "bin" / "python"
    probe = [str(python), "-c", "import paddle, cv2, lmdb, pycocotools, sklearn"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return str(python)
    print(f"bench: making {VENV_DEFAULT} (paddlepaddle and the suites' requirements, PyPI)")
    subprocess.run([str(Path(sys.base_prefix) / "bin" / "python3"), "-m", "venv",
                    str(VENV_DEFAULT)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PACKAGES], check=True,
                   timeout=1800)
    return str(python)


def prefixes(python: str) -> List[str]:
    """The venv and the interpreter it links to: shared into the lab hosts (like NFS)."""
    out = subprocess.run([python, "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"],
                         capture_output=True, text=True, check=True).stdout.split()
    return list(dict.fromkeys(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for suite in SUITES:
        parser.add_argument(f"--{suite.option}", default=os.environ.get(suite.env),
                            help=f"a {suite.name} checkout (default ${suite.env})")
    parser.add_argument("--python", default=os.environ.get("MULTIHOST_PADDLE_SUITES_PYTHON"),
                        help="python with paddle and the suites' requirements")
    parser.add_argument("--forms", default="fleetrun,run", help="fleetrun,run")
    args = parser.parse_args()
    chosen = []
    for suite in SUITES:
        checkout = getattr(args, suite.option)
        if not checkout or not (Path(checkout) / "tools" / "train.py").is_file():
            print(f"bench: {suite.name} skipped: no checkout with tools/train.py "
                  f"(--{suite.option} DIR or ${suite.env}; "
                  f"git clone --depth 1 https://github.com/PaddlePaddle/{suite.name})")
            continue
        chosen.append((suite, Path(checkout).resolve()))
    if not chosen:
        return 0
    if os.geteuid() != 0:
        raise SystemExit("bench: the lab needs root "
                         "(sudo .venv/bin/python bench/paddle_suites.py ...)")
    python = suites_python(args.python)
    scratch = Path(tempfile.mkdtemp(prefix="paddle-suites-"))
    failures = 0
    try:
        data = scratch / "data"
        subprocess.run([python, "-c", MAKE_DATA, str(data), str(DET_IMAGES), str(REC_WORDS)],
                       check=True)
        lab = Lab("mhps" + secrets.token_hex(2))
        lab.up(NODES, shares=[*prefixes(python), str(scratch)])
        try:
            ips = ",".join(host_address(i) for i in range(1, NODES + 1))
            env = dict(os.environ, PYTHONPATH=str(REPO))
            for suite, checkout in chosen:
                for form, argv in commands(suite, ips, python, checkout, data).items():
                    if form not in args.forms.split(","):
                        continue
                    work = scratch / f"{suite.option}-{form}"   # ./log of the command
                    work.mkdir()
                    started = time.monotonic()
                    done = subprocess.run(lab.exec_argv([sys.executable, "-m", "multihost", *argv]),
                                          cwd=work, env=env, capture_output=True, text=True,
                                          timeout=1200)
                    wall = time.monotonic() - started
                    verdict = judge(suite, lab, done.returncode, done.stdout, done.stderr)
                    loss = suite.iteration.findall(done.stdout)[-1:] or [("-", "-")]
                    print(f"{suite.name:16} {form:9} {wall:6.1f} s  last loss {loss[0][1]:>9}  "
                          f"{'ok' if not verdict else 'FAILED: ' + verdict}")
                    print("    multihost " + shlex.join(argv))
                    if verdict:
                        failures += 1
                        print(textwrap.indent(done.stdout[-3000:] + done.stderr[-2000:], "    | "))
        finally:
            lab.down()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
