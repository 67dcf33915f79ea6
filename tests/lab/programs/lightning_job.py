"""A small PyTorch Lightning job as its users write it: DDP on CPU (gloo) across the
nodes torchrun gives it, the default progress bar unless ``--bar tqdm``, a step every
``--nap`` seconds so that a follower sees the bar move."""
import argparse
import os
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self, nap):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.nap = nap

    def training_step(self, batch, index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, prog_bar=True)
        time.sleep(self.nap)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--nap", type=float, default=0.3)
    parser.add_argument("--bar", choices=["default", "tqdm"], default="default")
    parser.add_argument("--devices", type=int, default=int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    parser.add_argument("--num_nodes", type=int,
                        default=int(os.environ.get("WORLD_SIZE", 1)) // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8 * args.steps * args.devices * args.num_nodes, 8),
                         torch.randn(8 * args.steps * args.devices * args.num_nodes, 1))
    callbacks = []
    if args.bar == "tqdm":
        from lightning.pytorch.callbacks import TQDMProgressBar
        callbacks.append(TQDMProgressBar())
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=args.devices,
                        num_nodes=args.num_nodes, strategy="ddp", callbacks=callbacks,
                        enable_checkpointing=False, logger=False, enable_model_summary=False)
    trainer.fit(Tiny(args.nap), DataLoader(data, batch_size=8))
    # Lightning leaves gloo's group open: a rank that exits while its peer still tears
    # its group down can die of SIGABRT in gloo's destructor. End it together.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    print("done", flush=True)


if __name__ == "__main__":
    main()
