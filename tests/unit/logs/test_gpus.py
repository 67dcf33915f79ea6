"""GPUs in view: the sampler's rows parsed strictly, the idle rule, and how the samples
read in the dashboard, the plain lines, JSON lines and `status`, from recorded samples."""
import io
import json
from pathlib import Path

from rich.console import Console

from multihost.check.parsers import parse_gpus, parse_gpu_use
from multihost.events import GpuSample, NodeChanged, NodeState, RunStarted
from multihost.logs.gpus import GpuFeed, latest_sample, parse_gpu_log
from multihost.untrusted import is_log_name
from multihost.views.board import BoardModel
from multihost.views.dashboard import render
from multihost.views.jsonl import JsonView
from multihost.views.plain import PlainView

DATA = Path(__file__).resolve().parent.parent / "data" / "check"
REPLAY = (DATA / "nvidia-smi-use-a100x8.csv").read_text()
SAMPLES = [block.strip() for block in "\n".join(l for l in REPLAY.splitlines() if not l.startswith("#"))
           .split("\n\n") if block.strip()]
HOSTS = ("198.18.0.11", "198.18.0.12")
T0 = 1_700_000_000.0


def gpu_log(samples, start=T0, every=5.0):
    """A host's gpu.log as the sampler writes it: a header, then time-stamped rows."""
    lines = ["# time, index,uuid,... (nvidia-smi --format=csv,noheader,nounits)"]
    for n, sample in enumerate(samples):
        lines += [f"{start + n * every:.3f}, {row}" for row in sample.strip().splitlines()]
    return ("\n".join(lines) + "\n").encode()


def test_a_recorded_sample_parses_into_eight_gpus():
    gpus = parse_gpu_use(SAMPLES[0])
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0].uuid == "GPU-2b4bd3d5-1b2c-4f6c-8d1e-0a1b2c3d4e50"
    assert gpus[3].util == 0 and gpus[3].total_mib == 81920 and gpus[3].power_w == 61.27
    assert all(g.temp_c and g.used_mib for g in gpus)


def test_not_available_values_are_unknown_not_a_failure():
    gpus = parse_gpu_use("0, GPU-8f1e0c7a-3d55-11ee-be56-0242ac120000, [N/A], [N/A], 32768, 41, "
                         "[Not Supported]")
    assert len(gpus) == 1 and gpus[0].util is None and gpus[0].power_w is None
    assert gpus[0].total_mib == 32768 and gpus[0].temp_c == 41


def test_bad_sample_rows_from_a_host_are_dropped_without_harm():
    good = SAMPLES[0].splitlines()[0]
    text = "\n".join([
        good,
        "1, GPU-x\x1b]52;c;cGF3bmVk\x07, 90, 1, 2, 3, 4",       # an escape in the uuid
        "², GPU-2b4bd3d5-1b2c-4f6c-8d1e-0a1b2c3d4e51, 90, 1, 2, 3, 4",  # a digit int() refuses
        "2, GPU-2b4bd3d5-1b2c-4f6c-8d1e-0a1b2c3d4e52, 90, 1, 2",          # too few fields
        "3, GPU-2b4bd3d5-1b2c-4f6c-8d1e-0a1b2c3d4e53, 90, 1, 2, 3, 4, 5",  # too many
        "4, ../../etc/passwd, 90, 1, 2, 3, 4",
        "5, GPU-2b4bd3d5-1b2c-4f6c-8d1e-0a1b2c3d4e55, 4000, 99999999999999, 2, 9999, 1e9",
        "x" * 100_000,
    ])
    gpus = parse_gpu_use(text)
    assert [g.index for g in gpus] == [0, 5]
    # check's own parser refuses that digit too (it raised ValueError before).
    assert parse_gpus("², NVIDIA A100-SXM4-80GB, 81920, 4, 535.104.05, GPU-2b4bd3d5") == ()
    # Out of range is unknown, never a huge number in a view.
    assert (gpus[1].util, gpus[1].used_mib, gpus[1].temp_c, gpus[1].power_w) == (None, None, None, None)
    # In a gpu.log, a bad time or a repeated index is dropped too; one sample keeps its GPUs.
    log = (b"1700000000.000, " + good.encode() + b"\n" + b"nan, " + good.encode() + b"\n"
           + b"1700000000.000, " + good.replace(" 94,", " 1,").encode() + b"\n")
    samples = parse_gpu_log(log.decode())
    assert len(samples) == 1 and len(samples[0][1]) == 1 and samples[0][1][0].util == 94


def test_a_gpu_idle_for_two_samples_is_flagged_not_after_one():
    feed = GpuFeed()
    first = feed.events(0, HOSTS[0], gpu_log(SAMPLES[:1]))
    assert first[0].idle == ()           # one low sample is a pause
    second = feed.events(0, HOSTS[0], gpu_log(SAMPLES[1:2], start=T0 + 5))
    assert second[0].idle == (3,)
    # A sample that shows it busy again clears the flag.
    busy = SAMPLES[2].replace("GPU-2b4bd3d5-1b2c-4f6c-8d1e-0a1b2c3d4e53, 0,",
                              "GPU-2b4bd3d5-1b2c-4f6c-8d1e-0a1b2c3d4e53, 88,")
    assert feed.events(0, HOSTS[0], gpu_log([busy], start=T0 + 10))[0].idle == ()


def test_a_block_of_many_samples_gives_the_newest_only():
    events = GpuFeed().events(1, HOSTS[1], gpu_log(SAMPLES))
    assert len(events) == 1 and events[0].time == T0 + 15 and events[0].idle == (3,)
    # A new controller streams a week of them at once: the newest, read from the end.
    week = GpuFeed().events(1, HOSTS[1], gpu_log(SAMPLES * 1000))
    assert week[0].time == T0 + 5 * 3999 and len(week[0].gpus) == 8 and week[0].idle == (3,)


def test_gpu_log_is_a_name_a_log_frame_may_carry_and_nothing_near_it_is():
    assert is_log_name("gpu.log")
    for name in ("gpu.log/../x", "../gpu.log", "log/gpu.log", "gpu.logs", "log/workerlog.٣"):
        assert not is_log_name(name)


def sample_of(node, samples=SAMPLES[:2]):
    return GpuFeed().events(node, HOSTS[node], gpu_log(samples))[-1]


def screen(model):
    console = Console(file=io.StringIO(), width=200, color_system=None, force_terminal=True)
    console.print(render(model.snapshot(), now=T0 + 75))
    return console.file.getvalue()


def running_board():
    model = BoardModel()
    model.apply(RunStarted("20261122-000000-abcd", HOSTS, 8, "train.py", T0))
    for node, host in enumerate(HOSTS):
        model.apply(NodeChanged(node, host, NodeState.RUNNING, time=T0))
    return model


def test_the_dashboard_shows_each_hosts_gpus_and_an_idle_gpu_while_it_runs():
    model = running_board()
    model.apply(sample_of(0))
    text = screen(model)
    row = next(l for l in text.splitlines() if HOSTS[0] in l)
    assert "gpu 85% (min 0%) 27/80G 60C 284W, gpu 3 idle" in row
    header = next(l for l in text.splitlines() if "last line" in l)
    assert header.index(" speed ") < header.index(" gpu ") < header.index(" last line ")
    # The host without a sample shows nothing in the column; once finished, no idle flag.
    assert "gpu" not in next(l for l in text.splitlines() if HOSTS[1] in l)
    model.apply(NodeChanged(0, HOSTS[0], NodeState.SUCCEEDED, exit_code=0, time=T0 + 60))
    assert "idle" not in screen(model)


def test_no_sample_from_any_host_no_gpu_column():
    text = screen(running_board())
    assert "gpu" not in text


def test_plain_lines_say_the_first_sample_then_each_change_of_idle_gpus():
    err = io.StringIO()
    view = PlainView(io.StringIO(), err)
    feed = GpuFeed()
    for n, sample in enumerate(SAMPLES[:3]):
        for event in feed.events(0, HOSTS[0], gpu_log([sample], start=T0 + 5 * n)):
            view(event)
    lines = err.getvalue().splitlines()
    assert lines[0].startswith("multihost: 198.18.0.11 (node 0): gpu 85% (min 0%) 27/80G 59C 291W")
    assert lines[1].endswith("gpu 3 idle") and len(lines) == 2  # the third said nothing new


def test_json_lines_carry_the_sample_as_an_event():
    out = io.StringIO()
    JsonView(out)(sample_of(1))
    record = json.loads(out.getvalue())
    assert record["event"] == "gpu" and record["host"] == HOSTS[1] and record["idle"] == [3]
    assert record["gpus"][3]["util"] == 0 and record["gpus"][0]["total_mib"] == 81920


def test_status_reads_the_latest_sample_of_a_mirrored_gpu_log(tmp_path):
    path = tmp_path / "gpu.log"
    path.write_bytes(gpu_log(SAMPLES * 200))  # longer than the tail that is read
    sample = latest_sample(path, 0, HOSTS[0])
    assert isinstance(sample, GpuSample) and sample.time == T0 + 5 * (len(SAMPLES) * 200 - 1)
    assert len(sample.gpus) == 8 and sample.idle == (3,)
    assert latest_sample(tmp_path / "none.log", 0, HOSTS[0]) is None
