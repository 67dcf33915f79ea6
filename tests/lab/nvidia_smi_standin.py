#!/usr/bin/env python3
"""A stand-in ``nvidia-smi`` for lab hosts, which have no GPU: installed as
``nvidia-smi`` beside a replay file (``replay.csv``: samples apart by blank lines,
``#`` lines are comments), it answers the GPU sampler's query with the next sample,
one per call, round and round. Any other question is refused, as a real nvidia-smi
refuses an unknown field.
"""
import os
import sys

QUERY = "--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"


def main():
    if QUERY not in sys.argv or "--format=csv,noheader,nounits" not in sys.argv:
        sys.stderr.write("stand-in nvidia-smi: only the GPU sampler's query is recorded\n")
        return 2
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "replay.csv")) as handle:
        lines = [line for line in handle.read().splitlines() if not line.startswith("#")]
    samples = [block.strip() for block in "\n".join(lines).split("\n\n") if block.strip()]
    calls = os.path.join(here, "calls")
    try:
        with open(calls) as handle:
            count = int(handle.read() or 0)
    except (OSError, ValueError):
        count = 0
    with open(calls, "w") as handle:
        handle.write(str(count + 1))
    sys.stdout.write(samples[count % len(samples)] + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
