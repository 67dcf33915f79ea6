"""Pure parsers of what hosts report: nvidia-smi CSV, torch and paddle version files, pip
metadata names. No host involved: each is unit-tested with recorded outputs
(tests/unit/data/check/).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: Optional[int]
    used_mib: Optional[int]
    driver: str
    uuid: str


@dataclass(frozen=True)
class GpuApp:
    uuid: str
    pid: int
    name: str
    used_mib: Optional[int]


@dataclass(frozen=True)
class Software:
    """What the job's interpreter will find: versions, or None when absent."""

    python: str
    executable: str
    torch: Optional[str] = None
    torch_cuda: Optional[str] = None
    paddle: Optional[str] = None
    paddle_cuda: Optional[str] = None
    nccl: Optional[str] = None

    def describe(self) -> str:
        parts = [f"Python {self.python}"]
        for name, version, cuda in (("torch", self.torch, self.torch_cuda),
                                    ("paddle", self.paddle, self.paddle_cuda)):
            if version:
                extras = [f"CUDA {cuda}"] if cuda else []
                if cuda and self.nccl:
                    extras.append(f"NCCL {self.nccl}")
                parts.append(f"{name} {version}" + (f" ({', '.join(extras)})" if extras else ""))
        return ", ".join(parts)


def _number(text: str) -> Optional[int]:
    text = text.strip()  # "[N/A]", "[Not Supported]"; never "²" (a digit int() refuses)
    return int(text) if re.fullmatch(r"[0-9]{1,15}", text) else None


def _csv_rows(text: str, width: int, name_at: Optional[int]) -> Iterable[list]:
    """Rows of ``width`` fields; a query without a name column (``name_at`` None) keeps
    only rows of exactly that width."""
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        extra = len(fields) - width
        if extra > 0 and name_at is not None:  # a name with commas in it: join it back
            end = name_at + extra + 1
            fields = fields[:name_at] + [", ".join(fields[name_at:end])] + fields[end:]
        if len(fields) == width:
            yield fields


def parse_gpus(text: str) -> Tuple[Gpu, ...]:
    """``nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version,uuid
    --format=csv,noheader,nounits``."""
    gpus = []
    for index, name, total, used, driver, uuid in _csv_rows(text, 6, 1):
        if re.fullmatch(r"[0-9]{1,3}", index):
            gpus.append(Gpu(int(index), name, _number(total), _number(used), driver, uuid))
    return tuple(gpus)


@dataclass(frozen=True)
class GpuUse:
    """One GPU in one sample of a run's GPU sampler; None where nvidia-smi says [N/A]."""

    index: int
    uuid: str
    util: Optional[int]          # utilization.gpu, %
    used_mib: Optional[int]
    total_mib: Optional[int]
    temp_c: Optional[int]
    power_w: Optional[float]


GPU_USE_QUERY = "index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"
_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z/-]{1,120}")


def _bounded(text: str, high: int) -> Optional[int]:
    value = _number(text)
    return value if value is not None and value <= high else None


def _watts(text: str) -> Optional[float]:
    if not re.fullmatch(r"[0-9]{1,5}(\.[0-9]{1,3})?", text):
        return None  # [N/A], [Not Supported], or not a plain number
    return float(text)


def parse_gpu_use(text: str) -> Tuple[GpuUse, ...]:
    """``nvidia-smi --query-gpu=GPU_USE_QUERY --format=csv,noheader,nounits``, read
    strictly (it may come from an untrusted host): a row that is not 7 fields, an index
    that is not a small number or a uuid that is not one is dropped; a value out of
    range is unknown (None)."""
    uses = []
    for index, uuid, util, used, total, temp, power in _csv_rows(text, 7, None):
        if not (re.fullmatch(r"[0-9]{1,3}", index) and _UUID.fullmatch(uuid)):
            continue
        uses.append(GpuUse(int(index), uuid, _bounded(util, 100), _bounded(used, 1 << 24),
                           _bounded(total, 1 << 24), _bounded(temp, 200), _watts(power)))
    return tuple(uses)


def parse_gpu_apps(text: str) -> Tuple[GpuApp, ...]:
    """``nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory
    --format=csv,noheader,nounits``."""
    apps = []
    for uuid, pid, name, used in _csv_rows(text, 4, 2):
        if re.fullmatch(r"[0-9]{1,10}", pid):
            apps.append(GpuApp(uuid, int(pid), name, _number(used)))
    return tuple(apps)


def _assignment(text: str, name: str) -> Optional[str]:
    """The string value of ``name = '...'`` (an annotation allowed) in generated code."""
    match = re.search(rf"^{name}\s*(?::[^=\n]*)?=\s*['\"]([^'\"]*)['\"]", text, re.MULTILINE)
    return match.group(1) if match else None


def parse_torch_version(text: str) -> Tuple[Optional[str], Optional[str]]:
    """torch/version.py: (version, CUDA version or None for a CPU build)."""
    return _assignment(text, "__version__"), _assignment(text, "cuda")


def nccl_code(code: Optional[str]) -> Optional[str]:
    """NCCL's version code (21804, or 2708 before 2.9) as 2.18.4."""
    if not code or not code.isdigit() or int(code) == 0:
        return None
    value = int(code)
    if value >= 10000:
        return f"{value // 10000}.{value // 100 % 100}.{value % 100}"
    return f"{value // 1000}.{value // 100 % 10}.{value % 100}"


def parse_paddle_version(text: str) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """paddle/version/__init__.py: (version, CUDA or None, NCCL or None)."""
    cuda = _assignment(text, "cuda_version")
    if cuda in (None, "", "False", "false"):
        cuda = None
    return _assignment(text, "full_version"), cuda, nccl_code(_assignment(text, "nccl_version"))


def nccl_from_dists(names: Iterable[str]) -> Optional[str]:
    """The NCCL wheel's version from dist-info names: nvidia_nccl_cu12-2.21.5.dist-info."""
    for name in names:
        match = re.match(r"^nvidia_nccl_cu\d+-([0-9.]+)\.dist-info$", name)
        if match:
            return match.group(1)
    return None


def parse_software(probe: Dict[str, object]) -> Software:
    """The python probe's reply (see remote/check/ops.PYTHON_PROBE) as versions."""
    torch = probe.get("torch") or {}
    paddle = probe.get("paddle") or {}
    torch_version, torch_cuda = parse_torch_version(str(torch.get("version_py", ""))) \
        if torch else (None, None)
    if torch and not torch_version:
        torch_version = "(unknown version)"
    paddle_version, paddle_cuda, paddle_nccl = parse_paddle_version(
        str(paddle.get("version_py", ""))) if paddle else (None, None, None)
    if paddle and not paddle_version:
        paddle_version = "(unknown version)"
    nccl = nccl_from_dists(probe.get("dists") or []) or paddle_nccl
    return Software(str(probe.get("version", "?")), str(probe.get("executable", "?")),
                    torch_version, torch_cuda, paddle_version, paddle_cuda, nccl)


def gib(n_bytes: float) -> str:
    value = n_bytes / 2 ** 30
    return f"{value:.0f} GiB" if value >= 10 else f"{value:.1f} GiB"


def fold_ranges(numbers: Iterable[int]) -> str:
    """0,1,2,3,5 -> 0-3,5."""
    ordered = sorted(set(numbers))
    parts = []
    start = prev = None
    for n in ordered + [None]:  # type: ignore[list-item]
        if n is not None and prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    return ",".join(parts)
