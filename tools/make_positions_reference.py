#!/usr/bin/env /usr/bin/python3
"""Reference values for tests/ops/test_rope.cpp (PyTorch 1.13, f64): rotary embeddings in the two
layouts, written the way the open models' code writes them (rotate_half of GPT-NeoX and LLaMA, the
complex-number form of RoFormer / GPT-J for the interleaved pairs), and ALiBi attention with its
bias as an explicit tensor (the paper's code, get_slopes included). Inputs are the formula
vals(shape, phase)[k] = 0.5 sin(1.3 k + phase) the C++ tests compute the same way.
Run:  /usr/bin/python3 tools/make_positions_reference.py
"""
import math
import torch

torch.set_default_dtype(torch.float64)

from reference_values import show, vals  # noqa: E402  (tools/reference_values.py)


def angles(T, D, offset, base):
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float64) / D))  # (D/2)
    return torch.outer(torch.arange(offset, offset + T, dtype=torch.float64), inv_freq)  # (T, D/2)


def rope_half(x, offset=0, base=10000.0):
    T, D = x.shape[-2], x.shape[-1]
    a = angles(T, D, offset, base)
    cos, sin = torch.cat([a.cos(), a.cos()], -1), torch.cat([a.sin(), a.sin()], -1)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def rope_interleaved(x, offset=0, base=10000.0):
    T, D = x.shape[-2], x.shape[-1]
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], D // 2, 2).contiguous())
    z = z * torch.polar(torch.ones(T, D // 2), angles(T, D, offset, base))
    return torch.view_as_real(z).reshape(x.shape)


x = vals((1, 2, 3, 8), 0.0).requires_grad_()
y = rope_half(x, offset=5)
y.backward(vals((1, 2, 3, 8), 1.0))
show("rope half, x vals((1,2,3,8),0), offset 5, base 1e4", y)
show("rope half x.grad for g = vals((1,2,3,8),1)", x.grad)
x.grad = None
y = rope_interleaved(x, offset=5, base=500.0)
y.backward(vals((1, 2, 3, 8), 1.0))
show("rope interleaved, offset 5, base 500", y)
show("rope interleaved x.grad for g = vals((1,2,3,8),1)", x.grad)


def get_slopes(n):  # the ALiBi paper's code
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    c = 2 ** math.floor(math.log2(n))
    return power_of_2(c) + get_slopes(2 * c)[0::2][: n - c]


for n in (1, 3, 4, 6, 8, 12):
    show(f"alibi slopes, {n} heads", torch.tensor(get_slopes(n)))

# ALiBi attention: B 1, H 3, Tq 3, Tk 5 (queries at the last 3 positions), d 4, causal and not
q, k, v = vals((1, 3, 3, 4), 2.0), vals((1, 3, 5, 4), 3.0), vals((1, 3, 5, 4), 4.0)
m = torch.tensor(get_slopes(3), dtype=torch.float32).double()
pos_q = torch.arange(2, 5).view(3, 1)
dist = (pos_q - torch.arange(5).view(1, 5)).abs()
bias = -m.view(3, 1, 1) * dist  # (H, Tq, Tk)
for causal in (False, True):
    s = q @ k.transpose(-1, -2) / 2.0 + bias
    if causal:
        s = s.masked_fill(torch.arange(5).view(1, 5) > pos_q, float("-inf"))
    show(f"alibi attention out, causal {causal}", torch.softmax(s, -1) @ v)
