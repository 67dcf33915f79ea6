"""The host side of GPUs in view (remote/run/gpus.py), driven as the supervisor's loop
drives it, with a stand-in nvidia-smi in a temporary directory."""
import os
import shutil
import stat
import time
from pathlib import Path

from multihost.remote.run.gpus import GpuSampler

HERE = Path(__file__).resolve().parent
STANDIN = HERE.parent.parent / "lab" / "nvidia_smi_standin.py"
REPLAY = HERE.parent / "data" / "check" / "nvidia-smi-use-a100x8.csv"


def standin(directory: Path, script: str = "") -> Path:
    """nvidia-smi in ``directory``: the lab's replaying stand-in, or ``script``."""
    directory.mkdir(exist_ok=True)
    smi = directory / "nvidia-smi"
    if script:
        smi.write_text("#!/bin/sh\n" + script)
    else:
        shutil.copy(STANDIN, smi)
        shutil.copy(REPLAY, directory / "replay.csv")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return directory


def drive(sampler: GpuSampler, seconds: float) -> None:
    """The supervisor's loop: tick, and reap what exited (only the sampler's child here)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        sampler.tick(time.time())
        if sampler.proc is not None:
            pid, status = os.waitpid(sampler.proc.pid, os.WNOHANG)
            if pid:
                sampler.exited(status)
        time.sleep(0.02)


def drive_until(sampler: GpuSampler, done, limit: float = 30.0) -> None:
    """The loop driven until ``done()`` (a loaded machine may take long), at most ``limit`` s."""
    deadline = time.time() + limit
    while not done():
        assert time.time() < deadline, "the sampler never got there"
        drive(sampler, 0.05)


def env(path: Path, **more):
    return dict({"PATH": f"{path}:/usr/bin:/bin"}, **more)


def test_samples_go_to_gpu_log_with_their_time_and_only_the_runs_gpus(tmp_path):
    bin_dir = standin(tmp_path / "bin")
    run = tmp_path / "run"
    run.mkdir()
    sampler = GpuSampler(str(run), env(bin_dir, CUDA_VISIBLE_DEVICES="2,3"), 0.2)
    log = run / "gpu.log"
    drive_until(sampler, lambda: log.exists() and len(log.read_text().splitlines()) >= 5)
    sampler.stop()
    lines = (run / "gpu.log").read_text().splitlines()
    assert lines[0].startswith("# time, index,uuid,utilization.gpu")
    rows = [line.split(", ") for line in lines[1:]]
    assert len(rows) >= 4 and {row[1] for row in rows} == {"2", "3"}
    assert all(float(row[0]) > 1e9 for row in rows)
    assert oct((run / "gpu.log").stat().st_mode & 0o777) == "0o600"
    assert not (run / ".gpu.sample").exists()


def test_no_nvidia_smi_no_sampler_no_file(tmp_path):
    sampler = GpuSampler(str(tmp_path), env(tmp_path / "nothing"), 0.1)
    drive(sampler, 0.5)
    assert sampler.command is None and not (tmp_path / "gpu.log").exists()


def test_an_interval_of_zero_never_asks(tmp_path):
    bin_dir = standin(tmp_path / "bin")
    sampler = GpuSampler(str(tmp_path), env(bin_dir), 0)
    drive(sampler, 0.3)
    assert not (tmp_path / "gpu.log").exists() and not (bin_dir / "calls").exists()


def test_a_hung_nvidia_smi_is_killed_and_stop_leaves_none_running(tmp_path, monkeypatch):
    import multihost.remote.run.gpus as run_gpus

    monkeypatch.setattr(run_gpus, "TIMEOUT", 0.3)
    bin_dir = standin(tmp_path / "bin", "exec sleep 600\n")
    sampler = GpuSampler(str(tmp_path), env(bin_dir), 0.05)
    drive_until(sampler, lambda: sampler.proc is not None)
    first = sampler.proc.pid
    # killed past TIMEOUT and reaped (then a new one may have started)
    drive_until(sampler, lambda: not os.path.exists(f"/proc/{first}"))
    assert sampler.proc is None or sampler.proc.pid != first
    drive(sampler, 0.1)
    sampler.stop()
    assert sampler.proc is None and sampler.command is None
    assert not (tmp_path / "gpu.log").exists()


def test_an_nvidia_smi_that_keeps_failing_is_no_longer_asked(tmp_path):
    bin_dir = standin(tmp_path / "bin", "echo 'NVIDIA-SMI has failed because it couldn't "
                                        "communicate with the NVIDIA driver.'; exit 9\n")
    sampler = GpuSampler(str(tmp_path), env(bin_dir), 0.05)
    drive_until(sampler, lambda: sampler.command is None)
    assert not (tmp_path / "gpu.log").exists()
