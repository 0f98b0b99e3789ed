#!/usr/bin/env /usr/bin/python3
"""Reference values for tests/nn/test_layers.cpp and tests/ops/test_loss.cpp (PyTorch 1.13).

Every weight and input is a fixed formula, vals(n, phase)[k] = 0.5 * sin(1.3 k + phase), which
the C++ tests compute the same way, so no weights need pasting: only the outputs (and some
gradients) printed here. Run:  /usr/bin/python3 tools/make_layers_reference.py
"""
import math
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)

from reference_values import show, vals  # noqa: E402  (tools/reference_values.py)


x = vals((2, 3), 0.0)

lin = torch.nn.Linear(3, 2)
with torch.no_grad():
    lin.weight.copy_(vals((2, 3), 1.0)); lin.bias.copy_(vals((2,), 2.0))
show("linear: x vals((2,3),0), weight vals((2,3),1), bias vals((2,),2)", lin(x))

seq = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
with torch.no_grad():
    seq[0].weight.copy_(vals((4, 3), 1.0)); seq[0].bias.copy_(vals((4,), 2.0))
    seq[2].weight.copy_(vals((2, 4), 3.0)); seq[2].bias.copy_(vals((2,), 4.0))
show("sequential(linear(3,4), relu, linear(4,2)): phases 1,2,3,4", seq(x))

emb = torch.nn.Embedding(5, 3, padding_idx=1)
with torch.no_grad():
    emb.weight.copy_(vals((5, 3), 1.0))
idx = torch.tensor([[0, 1, 4], [3, 1, 0]])
y = emb(idx)
y.backward(vals((2, 3, 3), 2.0))
show("embedding(5,3,padding_idx=1): weight vals((5,3),1), idx [[0,1,4],[3,1,0]]", y)
show("embedding weight.grad for dy = vals((2,3,3),2)", emb.weight.grad)

x4 = vals((2, 4), 0.0) * 3
ln = torch.nn.LayerNorm(4)
with torch.no_grad():
    ln.weight.copy_(vals((4,), 1.0)); ln.bias.copy_(vals((4,), 2.0))
show("layernorm(4): x 3*vals((2,4),0), weight vals((4,),1), bias vals((4,),2)", ln(x4))

w = vals((4,), 1.0)
rms = x4 / torch.sqrt((x4 * x4).mean(-1, keepdim=True) + 1e-6) * w
show("rmsnorm(4, eps 1e-6): x 3*vals((2,4),0), weight vals((4,),1)", rms)

a = torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0])
show("gelu none", F.gelu(a)); show("gelu tanh", F.gelu(a, approximate="tanh")); show("silu", F.silu(a))

mlp_fc1 = torch.nn.Linear(4, 6); mlp_fc2 = torch.nn.Linear(6, 4)
with torch.no_grad():
    mlp_fc1.weight.copy_(vals((6, 4), 1.0)); mlp_fc1.bias.copy_(vals((6,), 2.0))
    mlp_fc2.weight.copy_(vals((4, 6), 3.0)); mlp_fc2.bias.copy_(vals((4,), 4.0))
show("mlp(4,6): fc1 phases 1,2; fc2 phases 3,4; x 3*vals((2,4),0)", mlp_fc2(F.gelu(mlp_fc1(x4))))

T, d = 4, 6
pos = torch.arange(T).unsqueeze(1)
freq = torch.pow(10000.0, -torch.arange(0, d, 2) / d)
pe = torch.zeros(T, d); pe[:, 0::2] = torch.sin(pos * freq); pe[:, 1::2] = torch.cos(pos * freq)
show("sinusoidal_positions(4, 6)", pe)

# losses
xi = torch.tensor([0.5, -1.0, 2.0, 0.3, -0.7, 1.5], requires_grad=True)
ti = torch.tensor([0.0, -0.5, 1.0, 1.0, -0.2, 2.5])
for red in ["mean", "sum"]:
    l = F.mse_loss(xi, ti, reduction=red); xi.grad = None; l.backward()
    show(f"mse_loss {red}", l.reshape(1)); show(f"mse_loss {red} dx", xi.grad)
show("mse_loss none", F.mse_loss(xi, ti, reduction="none"))

xl = torch.tensor([-30.0, -2.0, -0.5, 0.0, 0.7, 3.0, 25.0], requires_grad=True)
tl = torch.tensor([0.0, 1.0, 0.3, 1.0, 0.0, 1.0, 0.5], requires_grad=True)
for red in ["mean", "sum"]:
    l = F.binary_cross_entropy_with_logits(xl, tl, reduction=red); xl.grad = None; tl.grad = None; l.backward()
    show(f"bce_with_logits {red}", l.reshape(1)); show(f"bce {red} dx", xl.grad); show(f"bce {red} dt", tl.grad)
show("bce_with_logits none", F.binary_cross_entropy_with_logits(xl, tl, reduction="none"))

# SwiGLU (nn/mlp.h), LLaMA's FeedForward: w2(silu(w1 x) * w3 x), no biases
w1, w2, w3 = vals((6, 4), 1.0), vals((4, 6), 2.0), vals((6, 4), 3.0)
xs = vals((2, 3, 4), 0.0).requires_grad_()
ys = F.linear(F.silu(F.linear(xs, w1)) * F.linear(xs, w3), w2)
ys.backward(vals((2, 3, 4), 4.0))
show("swiglu(4, 6): x vals((2,3,4),0), w1 vals((6,4),1), w2 vals((4,6),2), w3 vals((6,4),3)", ys)
show("swiglu x.grad for dy = vals((2,3,4),4)", xs.grad)
