#!/usr/bin/env /usr/bin/python3
"""Reference values for examples/extending/test_moe.cpp (PyTorch 1.13, f64): a sparse
mixture-of-experts feed-forward written the way the open implementations write it (torch.topk
over the router logits, the weights softmaxed over the k kept logits as Mixtral does, or the full
softmax's as the Switch Transformer does, each expert a SwiGLU run on the tokens routed to it and
added back with index_add_), and the Switch Transformer's load-balancing loss. Inputs and weights
are the formula vals(shape, phase)[k] = 0.5 sin(1.3 k + phase) the C++ test computes the same way.
Run:  /usr/bin/python3 tools/make_moe_reference.py
"""
import torch
import torch.nn.functional as F

from reference_values import vals  # tools/reference_values.py

torch.set_default_dtype(torch.float64)

DIM, HIDDEN, E, N = 3, 2, 3, 4


def moe(x, router, experts, k, renormalize):
    logits = x @ router.T                                   # (N, E)
    probs = logits.softmax(-1)
    top_logits, top = torch.topk(logits, k, dim=-1)         # (N, k)
    weights = top_logits.softmax(-1) if renormalize else probs.gather(1, top)
    y = torch.zeros_like(x)
    for e, (w1, w2, w3) in enumerate(experts):
        token, slot = torch.where(top == e)
        h = (F.silu(x[token] @ w1.T) * (x[token] @ w3.T)) @ w2.T
        y.index_add_(0, token, h * weights[token, slot, None])
    share = torch.bincount(top.flatten(), minlength=E).to(x.dtype) / (N * k)
    aux = E * (share * probs.mean(0)).sum()
    return y, aux


def cpp(values):
    return ", ".join(f"{v:.17g}" for v in values)


x = vals((N, DIM), 0)
router = vals((E, DIM), 5)
experts = [(vals((HIDDEN, DIM), 10 * e + 1), vals((DIM, HIDDEN), 10 * e + 3), vals((HIDDEN, DIM), 10 * e + 2))
           for e in range(E)]
for name, k, renormalize in (("top2", 2, True), ("top1", 1, False)):
    y, aux = moe(x, router, experts, k, renormalize)
    print(f"// {name}: top_k {k}, renormalize {renormalize}, routes {torch.topk(x @ router.T, k).indices.tolist()}")
    print(f"y   {{{cpp(y.flatten().tolist())}}}")
    print(f"aux {aux.item():.17g}")
