"""A rank that allocates past its GPU's memory, 1 GiB at a time, for bench/gpu_truth.sh:
the run's root cause should say CUDA out of memory and name the rank.

Without CUDA (the script's dry run) it raises the error torch raises on a GPU, with
the same first words, so the dry run goes through the same root-cause path.
"""
import os

import torch

rank = os.environ.get("RANK", "0")
if torch.cuda.is_available():
    total = torch.cuda.get_device_properties(0).total_memory
    print("rank %s: allocating past %.1f GiB on cuda:%d"
          % (rank, total / 2**30, torch.cuda.current_device()), flush=True)
    blocks = []
    while True:
        blocks.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
else:
    print("rank %s: no CUDA, raising the out-of-memory error (rehearsal)" % rank, flush=True)
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB "
                                 "(rehearsal without CUDA: nothing was allocated)")
