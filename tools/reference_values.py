"""Shared by the tools/make_*.py scripts: the formula weights and inputs the C++ tests rebuild
with ag::test::vals (tests/helpers.h), the printer of C++ initialiser lists, and a safetensors
writer (PyTorch 1.13 has no safetensors package)."""
import json
import math
import struct

import torch


def vals(shape, phase):
    """vals(shape, phase)[k] = 0.5 sin(1.3 k + phase), k the row-major element index (f64)."""
    n = math.prod(shape)
    return torch.tensor([0.5 * math.sin(1.3 * k + phase) for k in range(n)], dtype=torch.float64).reshape(shape)


def show(name, t):
    """Prints t as a commented C++ initialiser list, 9 significant digits."""
    flat = ", ".join(f"{v:.9g}" for v in t.detach().flatten().tolist())
    print(f"// {name} {list(t.shape)}\n{{{flat}}}")


SAFETENSORS_DTYPES = {torch.float32: ("F32", "f"), torch.float64: ("F64", "d"), torch.int64: ("I64", "q"),
                      torch.bool: ("BOOL", "?"), torch.bfloat16: ("BF16", "h"), torch.float16: ("F16", "h")}


def write_safetensors(path, tensors, metadata=None):
    """Writes `tensors` (name -> tensor, in that order) as the safetensors format lays them out:
    8 bytes: the header length N (u64 LE); N bytes: compact JSON ("__metadata__" first, then per
    tensor dtype, shape, data_offsets), padded with spaces to a multiple of 8; then the tensors'
    raw little-endian bytes, row-major, back to back in header order. Returns the file size."""
    header, blobs, offset = ({"__metadata__": metadata} if metadata else {}), [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        code, fmt = SAFETENSORS_DTYPES[t.dtype]
        flat = t.reshape(-1)
        # 16-bit floats as their bits (struct has no bfloat16)
        vals = (flat.view(torch.int16) if t.dtype in (torch.bfloat16, torch.float16) else flat).tolist()
        b = struct.pack("<%d%s" % (len(vals), fmt), *vals)
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    return 8 + len(text) + offset
