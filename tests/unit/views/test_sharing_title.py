"""A named run's dashboard says its name first: what its users call it."""
import io

from rich.console import Console

from multihost.events import RunStarted
from multihost.cli import build_parser
from multihost.commands.jobargs import with_job_file
from multihost.views.board import BoardModel
from multihost.views.dashboard import render


def title(**named):
    model = BoardModel()
    model.apply(RunStarted("20260101-000000-abcd", ("198.18.0.11",), 1, "train.py", 0.0, **named))
    console = Console(file=io.StringIO(), width=120, color_system=None, force_terminal=True)
    console.print(render(model.snapshot(), now=1.0))
    return console.file.getvalue().splitlines()[0].strip()


def test_the_dashboard_title_names_the_run():
    assert title(name="bert-large") == "multihost run bert-large (20260101-000000-abcd)"
    assert title() == "multihost run 20260101-000000-abcd"
    assert title(name="bert-large", attempt="attempt 2 of 3") == \
        "multihost run bert-large (20260101-000000-abcd), attempt 2 of 3"


def test_a_job_file_may_name_the_run_and_ask_to_queue(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('hosts = "a,b"\nname = "bert-large"\nqueue = true\ncommand = ["t.py"]\n')
    args = with_job_file(build_parser("run").parse_args(["run", "-f", str(job)]))
    assert (args.name, args.queue) == ("bert-large", True)
