"""A training loop written for Hugging Face Accelerate, as its examples are: the
Accelerator takes the ranks torchrun gives it (gloo on CPU), tqdm on the main process of
each node, a step every ``--nap`` seconds so that a follower sees the bar move."""
import argparse
import time

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--nap", type=float, default=0.3)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(8 * args.steps * accelerator.num_processes, 8),
                                          torch.randn(8 * args.steps * accelerator.num_processes, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    bar = tqdm(loader, disable=not accelerator.is_local_main_process)
    for x, y in bar:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        bar.set_postfix(loss=f"{loss.item():.4f}")
        time.sleep(args.nap)
    # As with the Trainer and Lightning: gloo's group ended together, not by each
    # interpreter's exit (SIGABRT in gloo's destructor when a peer tears down first).
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    accelerator.print("done")


if __name__ == "__main__":
    main()
