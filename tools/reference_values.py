"""Shared by the tools/make_*_reference.py scripts: the formula weights and inputs the C++ tests
rebuild with ag::test::vals (tests/helpers.h), and the printer of C++ initialiser lists."""
import math

import torch


def vals(shape, phase):
    """vals(shape, phase)[k] = 0.5 sin(1.3 k + phase), k the row-major element index (f64)."""
    n = math.prod(shape)
    return torch.tensor([0.5 * math.sin(1.3 * k + phase) for k in range(n)], dtype=torch.float64).reshape(shape)


def show(name, t):
    """Prints t as a commented C++ initialiser list, 9 significant digits."""
    flat = ", ".join(f"{v:.9g}" for v in t.detach().flatten().tolist())
    print(f"// {name} {list(t.shape)}\n{{{flat}}}")
