"""`multihost run --slurm -N 2 --detach -- train.py`: the same run as a Slurm batch job
(slurm/batch.py). Here: the command line the job runs (this one less the Slurm flags and
--detach: inside the job the run takes the allocation's nodes), what the user is told,
and `status`, `logs` and `stop` of the job from the login node."""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional, Sequence, Tuple

# What the batch job's run must not see again: the request is sbatch's now, and the job
# ends when its run does.
DROPPED = {"slurm", "nodes", "partition", "time", "gres", "detach"}


def _option(parser: argparse.ArgumentParser, word: str) -> Tuple[Optional[argparse.Action], bool]:
    """The option a word names, as argparse reads it (``--opt=v``, ``-N2``, a unique
    prefix of a long option where the parser allows one), and whether the word holds
    its value."""
    known = parser._option_string_actions
    if word.startswith("--"):
        name, eq, _ = word.partition("=")
        if name in known:
            return known[name], bool(eq)
        if not parser.allow_abbrev:
            return None, False
        actions = {known[o] for o in known if o.startswith(name) and o.startswith("--")}
        return (actions.pop(), bool(eq)) if len(actions) == 1 else (None, False)
    if word.startswith("-") and len(word) > 1:
        if word in known:
            return known[word], False
        if word[:2] in known:   # -N2, -N=2
            return known[word[:2]], True
    return None, False


def batch_words(parser: argparse.ArgumentParser, words: Sequence[str],
                script: Sequence[str]) -> List[str]:
    """``words`` (what followed `run`) less the Slurm flags and --detach, in every
    spelling; only the flags before the script are looked at, the script is kept whole."""
    words, script = list(words), list(script)
    flags = words[:len(words) - len(script)] if script else words
    kept: List[str] = []
    i = 0
    while i < len(flags):
        action, inline = _option(parser, flags[i])
        width = 2 if action is not None and action.nargs != 0 and not inline else 1
        if action is None or action.dest not in DROPPED:
            kept += flags[i:i + width]
        i += width
    return kept + script


def batch_argv(args: argparse.Namespace) -> List[str]:
    """The batch job's command: this python, `-m multihost run`, the same flags less the
    Slurm ones, plain lines (the output is a file), the same script."""
    words = batch_words(args._parser, getattr(args, "_words", []), args.command)
    script = len(args.command)
    flags, tail = (words[:-script], words[-script:]) if script else (words, [])
    view = [] if args.plain or args.json else ["--plain"]
    return [sys.executable, "-m", "multihost", "run", *flags, *view, *tail]


def submit(args: argparse.Namespace, ask) -> int:
    from ..registry.entry import check_name
    from ..slurm import batch
    from ..slurm.submit import refuse_inside

    refuse_inside()
    check_name(args.name or "")  # a bad name: refused here, not in the job's output later
    record = batch.submit(ask, batch_argv(args), name=args.name or "multihost")
    job, output = record["job_id"], record["output"]
    if args.json:
        print(json.dumps({"state": "submitted", "slurm_job": job, "output": output}))
        return 0
    print(f"submitted as Slurm job {job} ({ask.nodes} nodes); output: {output}\n"
          "from this machine:\n"
          f"  multihost status            (or squeue -j {job})\n"
          "  multihost logs --follow\n"
          f"  multihost stop              (or scancel {job})")
    return 0


def batch_job(run: Optional[str]) -> Optional[dict]:
    """The batch submission that a command with no run id (or a Slurm job id) means, or
    None: then the command is about a run, as always."""
    from ..errors import MultihostError
    from ..run.records import load_run
    from ..slurm.batch import pick

    if run is not None and not run.isdigit():
        return None
    try:
        last = load_run(None).created
    except MultihostError:
        last = None
    return pick(run, last)


def status(job: dict, args: argparse.Namespace) -> int:
    from ..slurm import batch

    state = batch.job_state(job["job_id"])
    print(json.dumps(batch.to_json(job, state)) if args.json else batch.line(job, state))
    return 0


def stop(job: dict, args: argparse.Namespace) -> int:
    from ..slurm import batch

    state = batch.job_state(job["job_id"])
    if state.ended:
        said = f"{batch.ended_text(state)} before this stop"
    else:
        state = batch.cancel(job["job_id"])
        said = f"{batch.ended_text(state)} (scancel {job['job_id']})"
    if args.json:
        print(json.dumps(batch.to_json(job, state)))
    else:
        print(f"{said}; output: {batch.output_of(job, state)}")
    return 0


def logs(job: dict, args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..slurm import batch

    given = [f for f in ("rank", "host", "role", "tail", "grep", "since", "attempt")
             if getattr(args, f, None)]
    if given:
        raise ConfigError(f"--{given[0]} picks a run's ranks and lines, and Slurm job "
                          f"{job['job_id']} has one output file", fix="leave it out, or "
                          f"grep in the file: multihost status shows where it is")
    write = _json_lines(job["job_id"]) if args.json else _raw
    state = batch.job_state(job["job_id"])
    if state.queued and args.follow:
        print(f"multihost: {batch.line(job, state)}: its output starts when it runs",
              file=sys.stderr, flush=True)
    try:
        state = batch.follow(job, write, follow=args.follow)
    except KeyboardInterrupt:
        print(f"\nmultihost: stopped following; Slurm job {job['job_id']} goes on "
              "(multihost stop ends it)", file=sys.stderr)
        return 130
    write(b"")
    if args.json:
        print(json.dumps(batch.to_json(job, state)))
    else:
        print(batch.line(job, state), flush=True)
    return batch.exit_status(state) if args.follow and state.ended else 0


def _raw(chunk: bytes) -> None:
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()


def _json_lines(job_id: str):
    """One JSON object per whole line of the output; ``b""`` writes the unfinished one."""
    held = bytearray()

    def write(chunk: bytes) -> None:
        held.extend(chunk)
        *lines, rest = bytes(held).split(b"\n")
        if not chunk and rest:
            lines, rest = lines + [rest], b""
        held[:] = rest
        for text in lines:
            print(json.dumps({"event": "output", "slurm_job": job_id,
                              "line": text.decode("utf-8", "replace")}), flush=True)
    return write
