#!/usr/bin/env /usr/bin/python3
"""Reference values for tests/nn/test_attention_layers.cpp (PyTorch 1.13).

Weights and inputs are the formula vals(shape, phase)[k] = 0.5 * sin(1.3 k + phase), which the C++
tests compute the same way; only outputs are printed. Computed in f64, compared in f32.
MultiHeadAttention: our qkv.weight/bias = torch's in_proj_weight/bias, proj = out_proj.
PatchEmbedding: our proj.weight = conv.weight.reshape(d, -1), proj.bias = conv.bias.
Run:  /usr/bin/python3 tools/make_attention_reference.py
"""
import math
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)

from reference_values import show, vals  # noqa: E402  (tools/reference_values.py)


d, H, B, T = 4, 2, 2, 3
mha = torch.nn.MultiheadAttention(d, H, batch_first=True)
with torch.no_grad():
    mha.in_proj_weight.copy_(vals((3 * d, d), 1.0)); mha.in_proj_bias.copy_(vals((3 * d,), 2.0))
    mha.out_proj.weight.copy_(vals((d, d), 3.0)); mha.out_proj.bias.copy_(vals((d,), 4.0))
x = vals((B, T, d), 0.0) * 2

y, w = mha(x, x, x, average_attn_weights=False)
show("mha self: x 2*vals((2,3,4),0)", y)
show("mha self: per-head weights", w)
causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
y, _ = mha(x, x, x, attn_mask=causal)
show("mha causal", y)
kpm = torch.tensor([[False, False, False], [False, True, False]])
y, _ = mha(x, x, x, key_padding_mask=kpm)
show("mha key_padding_mask [[F,F,F],[F,T,F]]", y)
ctx = vals((B, 2, d), 7.0) * 2
y, _ = mha(x, ctx, ctx)
show("mha cross: context 2*vals((2,2,4),7)", y)

C, p, dm = 2, 2, 3
conv_w = vals((dm, C, p, p), 5.0); conv_b = vals((dm,), 6.0)
img = vals((1, C, 4, 6), 0.0)
out = F.conv2d(img, conv_w, conv_b, stride=p).flatten(2).transpose(1, 2)
show("patch: conv2d(vals((1,2,4,6),0), weight vals((3,2,2,2),5), bias vals((3,),6), stride 2)", out)
