#!/usr/bin/env python3
"""Writes tests/golden/reference.safetensors, the file tests/core/test_serialize.cpp loads.

    /usr/bin/python3 tools/make_safetensors_fixture.py      # needs torch (1.13 has no safetensors)

The safetensors package is not installed here, so the file is written by hand with struct and json,
the way the reference writer (huggingface/safetensors, `serialize`) lays it out:

  * 8 bytes: the header length N, little-endian u64;
  * N bytes: compact JSON (no spaces), "__metadata__" first, then one entry per tensor with its keys
    in the order dtype, shape, data_offsets; padded with spaces so that N is a multiple of 8;
  * the tensors' raw little-endian bytes, row-major, back to back in header order, which is the
    reference's order: larger dtypes first (I64, F64, F32, BOOL), then by name.

The test checks the names, shapes and values below, and that save_safetensors writes the same
tensors (in this order, with this metadata) to the identical bytes.
"""
import json
import os
import struct

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden",
                   "reference.safetensors")

# Every value is exact in its dtype, so the C++ test can compare with ==.
TENSORS = {
    "w.weight": torch.tensor([[0.5, -1.25, 2.0], [3.0, -0.0, 1e-3]], dtype=torch.float32),
    "w.bias": torch.tensor([0.25, -8.0, 1024.5], dtype=torch.float32),
    # transposed in torch (non-contiguous): stored row-major, as [[1, 3, 5], [2, 4, 6]]
    "t.transposed": torch.arange(1, 7, dtype=torch.float32).reshape(3, 2).t(),
    "s.scalar": torch.tensor(-3.5, dtype=torch.float32),          # 0-dim: shape []
    "e.empty": torch.zeros(0, 3, dtype=torch.float32),             # no bytes: data_offsets [k, k]
    "d.double": torch.tensor([1.0 / 3.0, -2.5, 1e-300], dtype=torch.float64),
    "i.index": torch.tensor([-1, 0, 2**40, 7], dtype=torch.int64),
    "m.mask": torch.tensor([[True, False], [False, True]]),
}
METADATA = {"format": "pt", "step": "42"}

DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.bool: "BOOL"}
RANK = {"BOOL": 0, "F32": 1, "F64": 2, "I64": 3}  # the reference sorts larger dtypes first


def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bool:
        return bytes(int(v) for v in t.reshape(-1).tolist())
    fmt = {torch.float32: "f", torch.float64: "d", torch.int64: "q"}[t.dtype]
    vals = t.reshape(-1).tolist()
    return struct.pack("<%d%s" % (len(vals), fmt), *vals)


def main():
    order = sorted(TENSORS, key=lambda n: (-RANK[DTYPES[TENSORS[n].dtype]], n))
    header, blobs, offset = {"__metadata__": METADATA}, [], 0
    for name in order:
        t = TENSORS[name]
        b = tensor_bytes(t)
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(OUT, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    print("wrote", OUT, "tensor order:", order)


if __name__ == "__main__":
    main()
