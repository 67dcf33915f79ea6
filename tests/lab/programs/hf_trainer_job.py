"""Hugging Face Transformers' Trainer on a tiny BERT built from a config (nothing is
downloaded), DDP on CPU across the nodes torchrun gives it; it logs every step, and
naps so that a follower sees its tqdm bar move."""
import argparse
import os
import time

import torch
from transformers import (BertConfig, BertForSequenceClassification, Trainer,
                          TrainerCallback, TrainingArguments)


class Nap(TrainerCallback):
    def __init__(self, seconds):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


class Random(torch.utils.data.Dataset):
    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 100, (size, 16), generator=generator)
        self.labels = torch.randint(0, 2, (size,), generator=generator)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--nap", type=float, default=0.3)
    parser.add_argument("--out", default="hf_out")
    args = parser.parse_args()
    config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
    model = BertForSequenceClassification(config)
    training = TrainingArguments(output_dir=args.out, max_steps=args.steps,
                                 per_device_train_batch_size=4, logging_steps=1,
                                 save_strategy="no", report_to=[], use_cpu=True,
                                 disable_tqdm=False,
                                 ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None)
    Trainer(model=model, args=training, train_dataset=Random(64 * args.steps),
            callbacks=[Nap(args.nap)]).train()
    # The Trainer leaves gloo's group open: a rank that exits while its peer still tears
    # its group down can die of SIGABRT in gloo's destructor. End it together.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    print("done", flush=True)


if __name__ == "__main__":
    main()
