"""paddle's launcher echoes local rank 0's lines into its own output: each line is
shown once, as rank 0's, and the launcher's own messages stay."""
import json
import threading
import time

from multihost.hosts import Host
from multihost.logs.echo import LauncherEcho
from multihost.logs.mirror_layout import Node
from multihost.logs.mirror import read_node

from test_logs import RUN, follow, home, lines  # noqa: F401 (fixture)

LAUNCHER_OWN = ["LAUNCH INFO 2026-01-01 00:00:00,000 -----------  Configuration ----------",
                "LAUNCH INFO 2026-01-01 00:00:01,000 Waiting peer start..."]


def test_a_launcher_line_equal_to_the_next_rank0_line_is_its_copy():
    echo = LauncherEcho()
    echo.rank0("step 1\nstep 2")
    assert echo.launcher("LAUNCH INFO up\nstep 1") == "LAUNCH INFO up"
    assert echo.launcher("step 2") is None
    assert echo.launcher("step 2") == "step 2"     # said twice by the launcher: its own


def write_like_paddle(run_dir, steps):
    """Rank 0 writes a line; the launcher copies it a moment later, between its own."""
    worker = run_dir / "log" / "workerlog.0"
    launcher = run_dir / "launcher.log"
    with open(launcher, "ab") as out:
        out.write((LAUNCHER_OWN[0] + "\n").encode())
    for i in range(steps):
        with open(worker, "ab") as out:
            out.write(b"epoch 0 step %d loss 0.5\n" % i)
        time.sleep(0.002)
        with open(launcher, "ab") as out:
            out.write(b"epoch 0 step %d loss 0.5\n" % i)
            if i == steps // 2:
                out.write((LAUNCHER_OWN[1] + "\n").encode())
    (run_dir / "node.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0}))


def test_the_live_view_shows_rank0_lines_once_and_the_launchers_own(home, tmp_path):
    thread = threading.Thread(target=write_like_paddle, args=(home, 200))
    thread.start()
    seen = lines(follow(tmp_path, follow=True, nproc=1))
    thread.join()
    rank0 = [text for rank, text in seen if rank == 0]
    launcher = [text for rank, text in seen if rank == -1]
    assert rank0 == ["epoch 0 step %d loss 0.5" % i for i in range(200)]
    assert launcher == LAUNCHER_OWN
    # the mirror keeps the launcher's output byte for byte, copies included
    mirrored = (tmp_path / "mirror" / "127.0.0.1" / "launcher.log").read_text()
    assert mirrored.count("loss 0.5") == 200


def test_logs_from_the_mirror_show_each_line_once(home, tmp_path):
    write_like_paddle(home, 20)
    follow(tmp_path, nproc=1)
    node = Node(Host(name="127.0.0.1"), 1, 0)
    shown = [(b.rank, line) for b in read_node(tmp_path / "mirror", node)
             for line in b.text.split("\n")]
    assert [t for r, t in shown if r == -1] == LAUNCHER_OWN
    assert len([t for r, t in shown if r == 0]) == 20


def test_paddles_configuration_block_is_left_out_for_every_host_but_the_first():
    from multihost.logs.echo import ConfigBlock

    block = ["LAUNCH INFO 2026-01-01 00:00:00,000 -----------  Configuration ----------------------",
             "LAUNCH INFO 2026-01-01 00:00:00,000 devices: None",
             "LAUNCH INFO 2026-01-01 00:00:00,000 ips: 198.18.0.11,198.18.0.12",
             "LAUNCH INFO 2026-01-01 00:00:00,000 --------------------------------------------------"]
    config = ConfigBlock()
    # the block may arrive cut anywhere: what follows it is still shown
    assert config.strip("\n".join(["LAUNCH INFO up"] + block[:2])) == "LAUNCH INFO up"
    assert config.strip("\n".join(block[2:] + ["LAUNCH INFO Waiting peer start..."])) == \
        "LAUNCH INFO Waiting peer start..."
    assert config.strip("step 1 loss: 0.5") == "step 1 loss: 0.5"


TORCHRUN_STOPPED = """\
W1127 15:43:58.968000 21222 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, shutting down workers
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/v/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
  File "/v/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 923, in _invoke_run
    time.sleep(monitor_interval)
             ^^^^^^^^^^^^^^^^^^
  File "/v/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 21222 got signal: 15"""


def test_torchruns_traceback_for_the_stops_sigterm_is_one_line_and_the_mirror_keeps_it(home, tmp_path):
    (home / "launcher.log").write_text(TORCHRUN_STOPPED + "\n")
    (home / "node.json").write_text(json.dumps({"state": "stopped", "exit_code": 1}))
    launcher = [text for rank, text in lines(follow(tmp_path, nproc=1)) if rank == -1]
    assert launcher == [TORCHRUN_STOPPED.splitlines()[0],
                        "torchrun (pid 21222) stopped by SIGTERM; its 10-line traceback is in "
                        "the log mirror"]
    mirrored = (tmp_path / "mirror" / "127.0.0.1" / "launcher.log").read_text()
    assert mirrored == TORCHRUN_STOPPED + "\n"
    node = Node(Host(name="127.0.0.1"), 1, 0)        # `multihost logs`, from the mirror
    shown = [line for b in read_node(tmp_path / "mirror", node) if b.rank == -1
             for line in b.text.split("\n")]
    assert shown == launcher


def test_a_traceback_of_another_kind_is_shown_whole():
    from multihost.logs.echo import fold_signal_trace

    crash = TORCHRUN_STOPPED.replace("got signal: 15", "got signal: 6")
    assert fold_signal_trace(crash) == crash
    error = "Traceback (most recent call last):\n  File \"t.py\", line 1\nValueError: bad"
    assert fold_signal_trace(error) == error
