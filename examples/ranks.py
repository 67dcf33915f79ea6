"""Who is who in a multihost run: every rank prints its host, RANK, LOCAL_RANK,
WORLD_SIZE and FLAGS_START_PORT, then an all_reduce of (rank + 1) checks that every
rank took part (the sum must be WORLD_SIZE * (WORLD_SIZE + 1) / 2).

    multihost run --hostfile hosts.ini --nproc_per_node 2 -- examples/ranks.py
    multihost run --hostfile hosts.ini --launcher paddle -- examples/ranks.py

Works under torchrun and the python template (torch.distributed: gloo on CPU, nccl on
GPU) and under paddle.distributed.launch (PADDLE_* variables, paddle's collective).
Options make it misbehave on purpose, to see how a run ends:
    --fail-rank 3 --exit-code 3 --after 2    rank 3 exits 3 two seconds in
    --sleep 600                              every rank stays up (to try Ctrl-C, stop)
"""
import argparse
import os
import socket
import sys
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fail-rank", type=int, default=None, help="this global rank fails")
    parser.add_argument("--exit-code", type=int, default=3, help="with this status")
    parser.add_argument("--after", type=float, default=0.0, help="this many seconds in")
    parser.add_argument("--sleep", type=float, default=0.0,
                        help="seconds every rank stays up after the all_reduce")
    return parser.parse_args(argv)


def identity():
    env = os.environ
    rank = env.get("RANK", env.get("PADDLE_TRAINER_ID", "0"))
    local = env.get("LOCAL_RANK", env.get("PADDLE_LOCAL_RANK", "0"))
    world = env.get("WORLD_SIZE", env.get("PADDLE_TRAINERS_NUM", "1"))
    return int(rank), int(local), int(world)


def all_reduce_torch(rank, local, world):
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    value = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(value)
    total = value.item()
    return total, lambda: dist.destroy_process_group()


def all_reduce_paddle(rank, local, world):
    import paddle
    import paddle.distributed as dist

    dist.init_parallel_env()
    value = paddle.to_tensor([rank + 1.0])
    dist.all_reduce(value)
    return float(value.numpy()[0]), lambda: None


def main(argv=None):
    args = parse_args(argv)
    rank, local, world = identity()
    env = os.environ
    print("host=%s rank=%d local_rank=%d world_size=%d FLAGS_START_PORT=%s node_rank=%s "
          "run_id=%s" % (socket.gethostname(), rank, local, world, env.get("FLAGS_START_PORT"),
                         env.get("MULTIHOST_NODE_RANK"), env.get("MULTIHOST_RUN_ID")),
          flush=True)
    if "PADDLE_TRAINER_ID" in env:
        print("paddle trainer_id=%s endpoint=%s endpoints=%s" % (
            env.get("PADDLE_TRAINER_ID"), env.get("PADDLE_CURRENT_ENDPOINT"),
            env.get("PADDLE_TRAINER_ENDPOINTS")), flush=True)
    if args.fail_rank == rank:
        time.sleep(args.after)
        print("rank %d exits %d on purpose (--fail-rank)" % (rank, args.exit_code), flush=True)
        sys.exit(args.exit_code)
    reduce = all_reduce_paddle if "PADDLE_TRAINER_ID" in env else all_reduce_torch
    total, close = reduce(rank, local, world)
    expected = world * (world + 1) / 2
    ok = total == expected
    print("all_reduce sum=%g expected=%g %s" % (total, expected, "ok" if ok else "WRONG"),
          flush=True)
    if args.sleep:
        time.sleep(args.sleep)
    close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
