# The collective check's job: run by `multihost check --collective` on every host with
# the job's own python, one process per rank, started the way the `python` launcher
# starts ranks (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the
# environment). It times all_reduce and all_gather over growing sizes, as nccl-tests
# does, and rank 0 prints one line: MULTIHOST-COLLECTIVE {json}.
#
# Every rank must run the same number of collectives, so every decision (how many
# iterations, whether to stop growing) is taken from figures all ranks agreed on (the
# slowest rank's time, through a MAX all_reduce).
import argparse
import json
import os
import sys
import time

STARTED = time.perf_counter()

import torch  # noqa: E402 (after the clock: the report says how long the import took)
import torch.distributed as dist  # noqa: E402

MARK = "MULTIHOST-COLLECTIVE "
TARGET_S = 0.15        # timed work per size
MIN_ITERS, MAX_ITERS = 3, 100


def agreed_max(value, device):
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(name, nbytes, world, device):
    """Seconds per operation (the slowest rank's), and the bytes it moved by
    nccl-tests' convention (all_gather: the whole gathered buffer)."""
    if name == "all_reduce":
        data = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        size = data.numel() * 4

        def once():
            dist.all_reduce(data)
    else:
        piece = torch.ones(max(1, nbytes // 4 // world), dtype=torch.float32, device=device)
        out = [torch.empty_like(piece) for _ in range(world)]
        size = piece.numel() * 4 * world

        def once():
            dist.all_gather(out, piece)
    began = time.perf_counter()
    once()                                           # warm-up: connections, buffers
    sync(device)
    start = time.perf_counter()
    once()
    sync(device)
    first = agreed_max(time.perf_counter() - start, device)
    iters = int(min(MAX_ITERS, max(MIN_ITERS, TARGET_S / max(first, 1e-6))))
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        once()
    sync(device)
    per_op = agreed_max((time.perf_counter() - start) / iters, device)
    spent = agreed_max(time.perf_counter() - began, device)
    return size, per_op, iters, spent


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", required=True)       # bytes, comma separated, growing
    parser.add_argument("--ops", default="all_reduce,all_gather")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--cap", type=float, default=2.0)  # stop growing past this (s)
    args = parser.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    imported = time.perf_counter()
    dist.init_process_group(args.backend)
    world, rank = dist.get_world_size(), dist.get_rank()
    report = {"world_size": world, "backend": args.backend, "torch": torch.__version__,
              "import_s": agreed_max(imported - STARTED, device),
              "init_s": agreed_max(time.perf_counter() - imported, device), "ops": {}}
    measured = time.perf_counter()
    sizes = [int(s) for s in args.sizes.split(",")]
    for name in args.ops.split(","):
        rows, capped = [], None
        for k, nbytes in enumerate(sizes):
            size, per_op, iters, spent = measure(name, nbytes, world, device)
            rows.append({"bytes": size, "seconds": per_op, "iters": iters})
            # The next size takes about per_op x its growth x (MIN_ITERS + 2 untimed
            # runs): past the cap, the series stops here (the same on every rank).
            grow = sizes[k + 1] / float(nbytes) if k + 1 < len(sizes) else 0
            if spent > args.cap or per_op * grow * (MIN_ITERS + 2) > args.cap:
                capped = size if grow else None
                break
        report["ops"][name] = {"rows": rows, "capped_at": capped}
    report["measure_s"] = time.perf_counter() - measured
    dist.barrier()
    if rank == 0:
        sys.stdout.write(MARK + json.dumps(report) + "\n")
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
