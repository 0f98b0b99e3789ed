#!/usr/bin/env python3
"""Writes tests/golden/reference.safetensors and tests/golden/half.safetensors, the files
tests/core/test_serialize.cpp loads.

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

half.safetensors holds HALF_SOURCE rounded by torch to bfloat16 ("BF16") and to float16 ("F16"):
the C++ test reads them as f32 (the rounded values, exactly) and writes the f32 source values
with FloatStorage::bf16 / f16 to the identical bytes, so torch's rounding checks ours.
"""
import os

import torch

from reference_values import write_safetensors  # noqa: E402  (tools/reference_values.py)

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

RANK = {torch.bool: 0, torch.float32: 1, torch.float64: 2, torch.int64: 3}  # larger dtypes first

HALF_OUT = os.path.join(os.path.dirname(OUT), "half.safetensors")
# f32 values (the C++ test lists the same ones): ties both ways, a carry, small and large values,
# a bf16 subnormal, half's largest value and its smallest subnormal
HALF_SOURCE = {
    "b.bf16": torch.tensor([[1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -0.1], [3.0e38, 1e-40, 1.99999, 0.1]],
                           dtype=torch.float32),
    "h.f16": torch.tensor([1.0, 1.0 + 2**-11, -0.1, 65504.0, 2**-24, 1e-6, 0.1, -3.14159],
                          dtype=torch.float32),
}


def main():
    order = sorted(TENSORS, key=lambda n: (-RANK[TENSORS[n].dtype], n))
    write_safetensors(OUT, {n: TENSORS[n] for n in order}, METADATA)
    print("wrote", OUT, "tensor order:", order)
    half = {"b.bf16": HALF_SOURCE["b.bf16"].to(torch.bfloat16), "h.f16": HALF_SOURCE["h.f16"].to(torch.float16)}
    write_safetensors(HALF_OUT, half)
    print("wrote", HALF_OUT)
    for name, t in half.items():
        print(name, [f"{v:.9g}" for v in t.float().reshape(-1).tolist()])


if __name__ == "__main__":
    main()
