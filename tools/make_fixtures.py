#!/usr/bin/env python3
"""Writes the PyTorch reference values that tests/ops/test_nn.cpp compares attograd against.

    /usr/bin/python3 tools/make_fixtures.py        # needs torch; writes tests/golden/*.txt

Every input is a literal below; torch computes in float64. For each op, a projection r (also a
literal) gives the loss L = sum(r * y), and the fixtures hold dL/dx (and dL/dw, dL/db).

File format, one tensor a line (blank lines and lines starting with '#' are comments):

    key: d0 d1 ... | v0 v1 v2 ...

the shape before '|' (nothing for a 0-dim tensor), the values in row-major order after it,
written with Python's repr (17 significant digits; 'nan', 'inf', '-inf'). Integer tensors
(class targets) are written as floats.
"""
import os

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden")

# [2, 3, 4]: mixed signs, a repeated value, and one row far from 0 (stability of max-subtraction)
X3 = [[[0.5, -1.25, 2.0, 0.0], [1.5, 1.5, -0.75, 3.25], [-2.0, 0.25, 1.0, -0.5]],
      [[40.0, 41.5, 39.25, 40.75], [0.125, -3.0, 2.5, -1.0], [0.75, 0.75, 0.75, 0.75]]]
R3 = [[[0.3, -1.1, 0.7, 2.0], [-0.4, 0.9, 1.3, -0.6], [1.2, -0.8, 0.1, 0.5]],
      [[-1.5, 0.6, 0.2, -0.3], [0.8, 1.7, -0.9, 0.4], [-0.2, 1.0, -1.3, 0.6]]]


def fmt(t):
    t = torch.as_tensor(t).detach().to(torch.float64)
    shape = " ".join(str(d) for d in t.shape)
    return f"{shape} | " + " ".join(repr(float(v)) for v in t.reshape(-1).tolist())


def write(name, entries, note):
    path = os.path.join(OUT, f"{name}.txt")
    with open(path, "w") as f:
        f.write(f"# {name}: {note}\n# torch {torch.__version__}, float64; written by tools/make_fixtures.py\n")
        for key, t in entries:
            f.write(f"{key}: {fmt(t)}\n")
    print("wrote", os.path.relpath(path))


def leaf(v):
    return torch.tensor(v, requires_grad=True)


def grads(y, r, *inputs):
    """d sum(r * y) / d inputs."""
    return torch.autograd.grad((y * torch.as_tensor(r)).sum(), inputs)


def softmax_family(name, fn):
    entries = [("x", X3), ("r", R3)]
    for dim in (0, 1, 2):
        x = leaf(X3)
        y = fn(x, dim)
        (dx,) = grads(y, R3, x)
        entries += [(f"y_dim{dim}", y), (f"dx_dim{dim}", dx)]
    write(name, entries, f"y = {name}(x, dim) and dx = d sum(r * y) / dx for dim 0, 1, 2")


def layer_norm():
    W1, B1 = [1.5, -0.5, 0.75, 2.0], [0.1, -0.2, 0.3, 0.0]
    W2 = [[1.0, 0.5, -1.0, 2.0], [0.25, 1.5, 1.0, -0.5], [0.8, 1.2, 0.6, 1.1]]
    B2 = [[0.0, 0.1, -0.1, 0.2], [0.3, -0.3, 0.05, 0.0], [-0.2, 0.4, 0.0, 0.15]]
    entries = [("x", X3), ("r", R3), ("w1", W1), ("b1", B1), ("w2", W2), ("b2", B2)]
    # (case, normalized_shape, weight, bias)
    cases = [("last1_wb", [4], W1, B1), ("last1_none", [4], None, None), ("last2_wb", [3, 4], W2, B2),
             ("last2_w", [3, 4], W2, None)]
    for case, ns, w, b in cases:
        x = leaf(X3)
        wt = leaf(w) if w is not None else None
        bt = leaf(b) if b is not None else None
        y = F.layer_norm(x, ns, wt, bt, eps=1e-5)
        named = [(k, t) for k, t in (("dx", x), ("dw", wt), ("db", bt)) if t is not None]
        gs = grads(y, R3, *[t for _, t in named])
        entries.append((f"y_{case}", y))
        entries += [(f"{k}_{case}", g) for (k, _), g in zip(named, gs)]
    write("layer_norm", entries, "layer_norm over the last 1 or 2 dims, eps 1e-5, with and without w, b")


def gelu():
    xs = [-4.0, -2.5, -1.0, -0.5, -0.125, 0.0, 0.25, 0.7, 1.0, 1.8, 3.0, 5.5]
    r = [0.5, -1.0, 1.5, 0.25, -0.75, 2.0, 1.0, -0.5, 0.3, -1.2, 0.8, 0.6]
    entries = [("x", xs), ("r", r)]
    for approx in ("none", "tanh"):
        x = leaf(xs)
        y = F.gelu(x, approximate=approx)
        (dx,) = grads(y, r, x)
        entries += [(f"y_{approx}", y), (f"dx_{approx}", dx)]
    write("gelu", entries, "gelu(x, approximate) for \"none\" and \"tanh\", and d sum(r * y) / dx")


def cross_entropy():
    logits = [[1.0, 2.0, 0.5, -1.0], [0.0, 0.0, 0.0, 0.0], [3.0, -2.0, 1.5, 0.25], [-0.5, 0.75, 2.5, 1.0],
              [10.0, 9.0, 11.5, 8.0]]
    target = [1, -100, 0, 2, 3]      # row 1 has the default ignore_index
    target_ig2 = [1, 2, 0, 2, 3]     # rows 1 and 3 are ignored with ignore_index = 2
    r_rows = [0.7, -1.3, 1.1, 0.4, -0.6]  # projection of the "none" outputs
    r_scalar = 0.7                         # projection of the "mean"/"sum" outputs
    entries = [("logits", logits), ("target", target), ("target_ig2", target_ig2), ("r_rows", r_rows),
               ("r_scalar", r_scalar)]
    # (case, target, reduction, ignore_index, label_smoothing)
    cases = [("mean", target, "mean", -100, 0.0), ("sum", target, "sum", -100, 0.0),
             ("none", target, "none", -100, 0.0), ("mean_ls", target, "mean", -100, 0.1),
             ("sum_ls", target, "sum", -100, 0.25), ("none_ls", target, "none", -100, 0.1),
             ("mean_ig2", target_ig2, "mean", 2, 0.0), ("mean_ig2_ls", target_ig2, "mean", 2, 0.3)]
    for case, t, red, ig, ls in cases:
        x = leaf(logits)
        y = F.cross_entropy(x, torch.tensor(t), reduction=red, ignore_index=ig, label_smoothing=ls)
        (dx,) = grads(y, r_rows if red == "none" else r_scalar, x)
        entries += [(f"loss_{case}", y), (f"dlogits_{case}", dx)]
    write("cross_entropy", entries,
          "cross_entropy(logits, target, reduction, ignore_index, label_smoothing); see the cases in make_fixtures.py")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    softmax_family("softmax", lambda x, d: torch.softmax(x, d))
    softmax_family("log_softmax", lambda x, d: torch.log_softmax(x, d))
    layer_norm()
    gelu()
    cross_entropy()
