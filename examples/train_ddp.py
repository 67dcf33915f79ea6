"""A real, small DistributedDataParallel training on synthetic data: CPU (gloo) or GPU
(nccl), whatever the host has. It prints progress lines like the reference docs' fleet
example, which the dashboard reads:

    epoch: 0, step:20, train_loss: 0.912345, total time cost = 0.012000, speed: 2666.7

Run it on every host (rank 0 is on the first host):

    multihost run --hostfile hosts.ini --nproc_per_node 2 -- examples/train_ddp.py --epochs 3
    multihost run --hostfile hosts.ini --gpus 0,1,2,3 -- examples/train_ddp.py --batch-size 256

Restarts (`multihost run --max-restarts N`): with --checkpoint-dir, rank 0 saves the
model and the position every --checkpoint-every steps, and a restarted attempt
(MULTIHOST_RESTART_COUNT > 0) resumes from there instead of step 0:

    multihost run --hostfile hosts.ini --max-restarts 3 -- examples/train_ddp.py \
        --checkpoint-dir ckpt --checkpoint-every 20

--crash-at STEP makes one rank die there on the first attempt, to try it.

The data is a fixed random linear problem, generated from a seed on every rank: each
rank draws its own shard (DistributedSampler-style, by rank), so the loss falls the
same way on any number of hosts, and the final loss is checked to have dropped.
"""
import argparse
import os
import sys
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100, help="steps per epoch")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", help="save here, resume from here on restart "
                                                 "(relative to the workdir of rank 0's host)")
    parser.add_argument("--checkpoint-every", type=int, default=20, metavar="K",
                        help="save every K steps (default 20)")
    parser.add_argument("--crash-at", type=int, metavar="STEP",
                        help="the last rank exits 1 at this global step of the first attempt")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        # Which GPU this rank got: the first host's first GPU should be rank 0's.
        print("rank %d: torch.cuda.current_device %d, CUDA_VISIBLE_DEVICES=%s (%s)"
              % (rank, torch.cuda.current_device(), os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                 torch.cuda.get_device_name()), flush=True)
    dist.init_process_group("nccl" if cuda else "gloo")

    # The problem: y = x @ w_true + noise, identical on every rank (same seed).
    torch.manual_seed(args.seed)
    w_true = torch.randn(args.features, 1)
    model = torch.nn.Sequential(torch.nn.Linear(args.features, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    attempt = int(os.environ.get("MULTIHOST_RESTART_COUNT", "0"))
    done = resume(args, model, optimizer, attempt, rank, dist, torch)   # global steps done
    ddp = DistributedDataParallel(model, device_ids=[local] if cuda else None)
    loss_fn = torch.nn.MSELoss()
    shard = torch.Generator().manual_seed(args.seed * 100003 + rank + 1)   # this rank's data

    first_loss = last_loss = None
    for epoch in range(args.epochs):
        started = time.time()
        for step in range(1, args.steps + 1):
            global_step = epoch * args.steps + step
            if global_step <= done:
                continue          # done by an earlier attempt (its checkpoint holds it)
            if attempt == 0 and args.crash_at == global_step and rank == world - 1:
                print("rank %d crashes at step %d (--crash-at)" % (rank, global_step), flush=True)
                os._exit(1)
            x = torch.randn(args.batch_size, args.features, generator=shard)
            y = x @ w_true + 0.01 * torch.randn(args.batch_size, 1, generator=shard)
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()           # DDP all-reduces the gradients here
            optimizer.step()
            if step % args.log_every == 0 or step == args.steps:
                # The mean loss over all ranks, so every rank prints the same number.
                mean = loss.detach().clone()
                dist.all_reduce(mean)
                mean = mean.item() / world
                first_loss = mean if first_loss is None else first_loss
                last_loss = mean
                # The slowest rank's time: the job's speed, the same number on every rank
                # (the dashboard shows it once instead of adding it up per rank).
                cost = torch.tensor([(time.time() - started) / step], device=device)
                dist.all_reduce(cost, op=dist.ReduceOp.MAX)
                cost = cost.item()
                speed = args.batch_size * world / cost
                print("epoch: %d, step:%d, train_loss: %f, total time cost = %f, speed: %f"
                      % (epoch, step, mean, cost, speed), flush=True)
            if args.checkpoint_dir and rank == 0 and global_step % args.checkpoint_every == 0:
                save(args.checkpoint_dir, model, optimizer, global_step, torch)
    dist.barrier()
    # DDP's reducer holds the process group: drop it first, so that destroying the group
    # really ends gloo's threads here, not in the interpreter's teardown.
    del ddp
    dist.destroy_process_group()
    if rank == 0:
        print("done: %d ranks, loss %.4f -> %.4f" % (world, first_loss, last_loss), flush=True)
    if first_loss is None:     # resumed past the last step: nothing left to learn
        return 0
    return 0 if last_loss <= first_loss else 1


def save(directory, model, optimizer, step, torch):
    """Written beside, then renamed: a crash while saving leaves the previous checkpoint."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "checkpoint.pt")
    torch.save({"step": step, "model": model.state_dict(),
                "optimizer": optimizer.state_dict()}, path + ".tmp")
    os.replace(path + ".tmp", path)


def resume(args, model, optimizer, attempt, rank, dist, torch):
    """On a restart, rank 0 loads its checkpoint and every rank learns the step from it
    (DDP copies rank 0's weights to the others when it wraps the model)."""
    step = torch.zeros(1, dtype=torch.long)
    path = os.path.join(args.checkpoint_dir or "", "checkpoint.pt")
    if attempt > 0 and args.checkpoint_dir and rank == 0 and os.path.exists(path):
        state = torch.load(path, map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step[0] = state["step"]
    dist.broadcast(step, 0)
    if attempt > 0:
        print("attempt %d: resumed from the checkpoint at step %d" % (attempt, int(step[0])),
              flush=True)
    return int(step[0])


if __name__ == "__main__":
    code = main()
    # The training is over and its process group destroyed: leave without the
    # interpreter's teardown, in which a c10d thread still joinable at exit can turn a
    # finished run into SIGABRT ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
