"""A rank stuck in a CUDA synchronisation, for bench/gpu_truth.sh: it queues long
matrix products and waits in torch.cuda.synchronize, over and over, until stopped, so
`multihost stacks` finds it there.

Without CUDA (the script's dry run) it waits in time.sleep in the same function, so the
dry run goes through the same stacks path.
"""
import os
import time

import torch

MARKER = "gpu_stuck: waiting in torch.cuda.synchronize"


def spin_in_cuda_sync():
    x = torch.randn(8192, 8192, device="cuda")
    print("%s on cuda:%d (CUDA_VISIBLE_DEVICES=%s)"
          % (MARKER, torch.cuda.current_device(), os.environ.get("CUDA_VISIBLE_DEVICES")),
          flush=True)
    while True:
        for _ in range(50):
            y = x @ x
        torch.cuda.synchronize()
        del y


def spin_without_cuda():
    print("%s (rehearsal: no CUDA, in time.sleep)" % MARKER, flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    if torch.cuda.is_available():
        spin_in_cuda_sync()
    else:
        spin_without_cuda()
