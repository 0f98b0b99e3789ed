#!/usr/bin/env python3
"""Reference values for tests/optim/test_optim.cpp, from PyTorch 1.13 (float32).

Two parameters, a (4 elements) and b (2 elements), start from fixed literals and are updated
3 times with literal gradients; b has no gradient at the second step (so it is skipped and its
step count falls behind a's). Printed: a after step 1, a and b after step 3, for each optimizer.
Then clip_grad_norm_ on literal gradients (norm returned and clipped grads) for norms 2, 1, inf.

Run: python3 tools/make_optim_reference.py
"""
import math

import torch

A0 = [0.5, -1.25, 2.0, 0.125]
B0 = [-0.75, 1.5]
GA = [[0.1, -0.2, 0.3, -0.4], [0.25, 0.5, -0.125, 1.0], [-0.3, 0.05, 0.2, -0.6]]
GB = [[0.6, -0.35], None, [-0.2, 0.45]]

CONFIGS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1),
    "sgd_nesterov_wd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, weight_decay=0.1, nesterov=True),
    "adam_wd": lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.02, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05),
}


def fmt(xs):
    return "{" + ", ".join(f"{x:.9g}" for x in xs) + "}"


def run(make):
    a = torch.tensor(A0, requires_grad=True)
    b = torch.tensor(B0, requires_grad=True)
    opt = make([a, b])
    out = {}
    for t in range(3):
        a.grad = torch.tensor(GA[t])
        b.grad = None if GB[t] is None else torch.tensor(GB[t])
        opt.step()
        if t == 0:
            out["a1"] = a.detach().tolist()
    out["a3"] = a.detach().tolist()
    out["b3"] = b.detach().tolist()
    return out


def main():
    print(f"// torch {torch.__version__}")
    for name, make in CONFIGS.items():
        r = run(make)
        print(f"// {name}")
        for k in ("a1", "a3", "b3"):
            print(f"  {k}: {fmt(r[k])}")
    G1 = [[3.0, -4.0], [1.0, 2.0, -2.0]]
    for norm_type, max_norm in ((2.0, 1.0), (1.0, 5.0), (math.inf, 2.5), (2.0, 100.0)):
        ps = [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True), torch.zeros(1, requires_grad=True)]
        ps[0].grad = torch.tensor(G1[0])
        ps[1].grad = torch.tensor(G1[1])  # ps[2] has no grad: skipped
        n = torch.nn.utils.clip_grad_norm_(ps, max_norm, norm_type)
        print(f"// clip_grad_norm_ norm_type {norm_type} max_norm {max_norm}: norm {n.item():.9g}")
        print(f"  grads {fmt(ps[0].grad.tolist() + ps[1].grad.tolist())}")


if __name__ == "__main__":
    main()
