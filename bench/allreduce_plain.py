"""The anchor of bench/collective.py: a plain torch all_reduce timing loop, the way a
user writes one by hand, started with torchrun on every host (one process per host,
gloo). Rank 0 prints one JSON line: {size: busbw in bytes/s}, by nccl-tests' formula
busbw = size / time x 2(n-1)/n.
"""
import argparse
import json
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    busbw = {}
    for size in (int(s) for s in args.sizes.split(",")):
        data = torch.ones(size // 4, dtype=torch.float32)
        iters = 20 if size <= (1 << 20) else 5
        for _ in range(2):
            dist.all_reduce(data)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(data)
        dist.barrier()
        seconds = (time.perf_counter() - start) / iters
        busbw[size] = size / seconds * 2 * (n - 1) / n
    if dist.get_rank() == 0:
        print("ANCHOR " + json.dumps(busbw), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
