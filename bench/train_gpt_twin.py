"""Train apps/gpt's char-level GPT in PyTorch: the same config, data, split, steps and optimizer.

The issue's target for the gpt app is "validation loss within 2% of PyTorch's for the same config,
steps and data". This script is the PyTorch side of that comparison:

  data       the same text file (default: the Bible text apps/gpt caches,
             ~/.cache/attograd/bible-kjv.txt), read as UTF-8 codepoints; the first
             floor(0.9 n) codepoints train, the rest validate (contiguous); vocabulary: id 0 <unk>,
             ids 1.. the distinct codepoints of the training part, ascending (CharTokenizer's
             codepoint mode)
  model      bench/torch_models.py GPT (the twin of apps/gpt/model.h GPT, GPT-2 init)
  batches    B random windows of T characters per step, starts uniform from torch's own RNG
             (the app draws them from Philox: same distribution, other numbers)
  optimizer  AdamW (betas 0.9, 0.999, eps 1e-8, decoupled weight decay on every parameter),
             lr linear warmup over round(warmup * steps) steps then cosine to min_lr
             (optim/schedule.h WarmupCosineLR), global gradient norm clipped to --clip
  evaluation the mean next-character cross-entropy over --eval-windows windows of T at the
             evenly spaced starts i * (len - T - 1) // (n - 1) of the validation text
             (apps/gpt/lib.h eval_starts), in eval mode without gradients

Usage (the app's defaults; compare the last line with `build/gpt` on the same numbers):
  /usr/bin/python3 bench/train_gpt_twin.py --steps 200 --threads 2
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import GPT  # noqa: E402


def load_data(path, valid_fraction):
    with open(path, encoding="utf-8", newline="") as f:  # newline="": keep \r as the app does
        text = f.read()
    n = len(text)
    k = int(math.floor(n * (1.0 - valid_fraction)))
    train_text, valid_text = text[:k], text[k:]
    vocab = sorted(set(train_text))
    ids = {c: i + 1 for i, c in enumerate(vocab)}
    train = torch.tensor([ids[c] for c in train_text], dtype=torch.long)
    valid = torch.tensor([ids.get(c, 0) for c in valid_text], dtype=torch.long)
    return train, valid, len(vocab) + 1


def lr_at(step, a):  # optim/schedule.h WarmupCosineLR
    warmup = int(round(a.warmup * a.steps))
    if step < warmup:
        return a.lr * step / warmup
    progress = min(1.0, (step - warmup) / max(1, a.steps - warmup))
    return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def eval_starts(length, T, n):  # apps/gpt/lib.h eval_starts
    last = length - T - 1
    return [0] * n if n == 1 else [i * last // (n - 1) for i in range(n)]


@torch.no_grad()
def lm_loss(model, ids, starts, T, batch):
    was = model.training
    model.eval()
    total = 0.0
    for b0 in range(0, len(starts), batch):
        s = torch.tensor(starts[b0:b0 + batch])
        offs = torch.arange(T + 1)
        w = ids[s[:, None] + offs[None, :]]  # (b, T + 1)
        logits = model(w[:, :-1])
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum").item()
    model.train(was)
    return total / (len(starts) * T)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text-file", default=os.path.expanduser("~/.cache/attograd/bible-kjv.txt"),
                    help="UTF-8 text (default: the Bible text cached by build/gpt)")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=float, default=0.05)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--mlp", type=int, default=512)
    ap.add_argument("--eval-windows", type=int, default=256)
    ap.add_argument("--eval-every", type=int, default=0, help="0: ten evaluations per run")
    ap.add_argument("--threads", type=int, default=0, help="0: torch's default")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if not os.path.isfile(a.text_file):
        sys.exit(f"{a.text_file} does not exist: run build/gpt once (it caches the Bible text) or pass --text-file")

    torch.manual_seed(a.seed)
    train, valid, V = load_data(a.text_file, 0.1)
    T = a.context
    model = GPT(vocab=V, context=T, d_model=a.d_model, n_heads=a.heads, n_layers=a.layers, mlp_hidden=a.mlp)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=a.weight_decay)
    starts = eval_starts(len(valid), T, a.eval_windows)
    every = a.eval_every if a.eval_every > 0 else max(1, a.steps // 10)
    print(f"twin: {a.text_file}: {len(train)} train / {len(valid)} validation characters, vocabulary {V}, "
          f"{sum(p.numel() for p in model.parameters())} parameters, {torch.get_num_threads()} threads")

    offs = torch.arange(T + 1)
    t0, train_time, val, losses = time.time(), 0.0, float("nan"), []
    for step in range(a.steps):
        ts = time.time()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        s = torch.randint(0, len(train) - T, (a.batch,))
        w = train[s[:, None] + offs[None, :]]
        logits = model(w[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        train_time += time.time() - ts
        losses.append(loss.item())
        if (step + 1) % every == 0 or step + 1 == a.steps:
            val = lm_loss(model, valid, starts, T, a.batch)
            print(f"step {step + 1}/{a.steps}: train_loss {sum(losses) / len(losses):.4f} val_loss {val:.4f} "
                  f"lr {lr_at(step, a):.4g} ({1000 * train_time / (step + 1):.0f} ms/step)", flush=True)
            losses = []
    print(f"twin final validation loss {val:.4f} after {a.steps} steps "
          f"({1000 * train_time / max(1, a.steps):.0f} ms/step, {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
