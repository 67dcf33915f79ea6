"""GPUs in view end to end (issue 14): lab hosts have no GPU, so hosts 1 and 2 get a
stand-in nvidia-smi (nvidia_smi_standin.py) that replays recorded samples of an 8-GPU
A100 machine whose GPU 3 sits idle; host 3 has none.
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from test_run import hostfile, leftovers, run_id_in

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "nvidia_smi_standin.py"
REPLAY = HERE.parent / "unit" / "data" / "check" / "nvidia-smi-use-a100x8.csv"
BIN = "/root/gpu-standin"
JOB_PATH = f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

JOB = textwrap.dedent("""\
    import os, time
    for step in range(16):
        print("rank %s step %d" % (os.environ["RANK"], step), flush=True)
        time.sleep(0.5)
""")

# Anything of the sampler still running: the stand-in is a python script in BIN.
SAMPLERS = textwrap.dedent("""\
    import os
    for pid in os.listdir("/proc"):
        try:
            argv = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\\0")
        except OSError:
            continue
        if b"BIN/nvidia-smi" in argv:
            print(pid, b" ".join(argv).decode(errors="replace"))
""").replace("BIN", BIN)


def install_standin(lab, i: int) -> None:
    lab.host_run(i, ["sh", "-c", f"rm -rf {BIN} && mkdir -p {BIN}"], check=True)
    lab.host_run(i, ["sh", "-c", f"cat > {BIN}/nvidia-smi && chmod 700 {BIN}/nvidia-smi"],
                 input=STANDIN.read_text(), check=True)
    lab.host_run(i, ["sh", "-c", f"cat > {BIN}/replay.csv"], input=REPLAY.read_text(), check=True)


def test_a_run_shows_each_hosts_gpus_flags_the_idle_one_and_leaves_no_sampler(lab, tmp_path):
    for i in (1, 2):
        install_standin(lab, i)
    lab.host_run(3, ["rm", "-rf", BIN], check=True)   # host 3: no nvidia-smi at all
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(JOB)
    log_dir = tmp_path / "log"
    result = lab.multihost("run", "--hostfile", str(hostfile(lab, tmp_path, 3)),
                           "--launcher", "python", "--code", str(code), "--no-check",
                           "--plain", "--gpu-interval", "1", "--log_dir", str(log_dir),
                           "--env", f"PATH={JOB_PATH}", "--", "job.py", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run_id = run_id_in(result.stderr)
    h1, h2, h3 = lab.addresses[:3]
    said = result.stderr.splitlines()
    for host, node in ((h1, 0), (h2, 1)):
        gpu = [line for line in said if line.startswith(f"multihost: {host} (node {node}): gpu ")]
        assert gpu and "(min 0%)" in gpu[0] and "/80G" in gpu[0], result.stderr[-3000:]
        assert any(line.endswith(", gpu 3 idle") for line in gpu), result.stderr[-3000:]
    # The host without nvidia-smi: no gpu line, no gpu.log, no error.
    assert not any(line.startswith(f"multihost: {h3} (node 2): gpu") for line in said)
    assert not (log_dir / run_id / h3 / "gpu.log").exists()
    assert "rank 2 step 15" in result.stdout
    # gpu.log is mirrored beside the logs: a header, then time-stamped rows of 8 GPUs.
    mirrored = (log_dir / run_id / h1 / "gpu.log").read_text().splitlines()
    assert mirrored[0].startswith("# time, index,uuid,utilization.gpu")
    assert len(mirrored) >= 1 + 2 * 8 and mirrored[1].split(", ")[2].startswith("GPU-2b4bd3d5")
    # `status` shows the latest sample of each host that has one.
    status = lab.multihost("status", run_id, "--plain", timeout=60).stdout
    assert "gpus, latest sample:" in status
    assert f"  {h1}: gpu " in status and f"  {h2}: gpu " in status and f"  {h3}:" not in status
    # Nothing of the sampler is left: no supervisor, no rank, no nvidia-smi.
    assert leftovers(lab, 3, run_id) == {}
    for i in (1, 2):
        assert lab.host_run(i, [sys.executable, "-c", SAMPLERS], check=True).stdout == ""
