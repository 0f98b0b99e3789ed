#!/usr/bin/env /usr/bin/python3
"""Writes the PyTorch parity files tests/nn/test_parity.cpp loads: tests/golden/parity_*.safetensors.

    /usr/bin/python3 tools/make_golden.py        # PyTorch 1.13; only needed to regenerate

Each case stores, under "<case>.", everything the C++ test needs to redo it and compare:

    <case>.in.<name>      inputs (random, from a fixed torch seed)
    <case>.param.<name>   parameters, named as attograd's state_dict names them, so the test
                          loads them with model.load_state_dict() straight from the file
    <case>.dy             the upstream gradient fed to backward (absent for scalar losses: 1)
    <case>.out.<name>     forward outputs
    <case>.grad.<name>    the gradient of every input and parameter

Everything is computed in float32, the dtype the test compares in. The twins below are written
the way attograd computes (pre-LN block, fused qkv whose rows are [q | k | v], exact erf GELU);
where PyTorch has a module of its own (Linear, Embedding, LayerNorm, MultiheadAttention) it is
used as is, so the parity is checked against an independent implementation.

Files:
    parity_ops.safetensors     gelu, softmax, log_softmax, cross_entropy, scaled_dot_product_attention
    parity_layers.safetensors  Linear, Embedding, LayerNorm, RMSNorm, MultiHeadAttention, TransformerBlock
    parity_optim.safetensors   3 steps of SGD (momentum, nesterov), Adam, AdamW; clip_grad_norm
    parity_train.safetensors   a 20-step AdamW run of a 2-block GPT: initial parameters, data, losses
    parity_modern.safetensors  the same run for GPTs of current small models' parts: RMSNorm, SwiGLU,
                               grouped-query heads, rope (modern_rope.*) or ALiBi (modern_alibi.*)
"""
import math
import os

import torch
import torch.nn.functional as F

from reference_values import write_safetensors  # noqa: E402  (tools/reference_values.py)

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden")

# ---- a minimal safetensors writer (torch 1.13 has no safetensors package) --------------------
# 8 bytes little-endian header length N, N bytes of JSON (padded with spaces to a multiple of 8),
# then each tensor's raw little-endian row-major bytes, back to back in header order.


def write_golden(path, tensors):
    size = write_safetensors(path, tensors)
    print("wrote %s: %d tensors, %d bytes" % (os.path.basename(path), len(tensors), size))


# ---- helpers ------------------------------------------------------------------------------------
def leaf(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).requires_grad_(True)


def run_case(out, case, fn, inputs, params=None, scalar=False):
    """y = fn(); backward with a random dy (or 1 for a scalar); store inputs, params, y, grads."""
    params = params or {}
    y = fn()
    for k, v in inputs.items():
        out["%s.in.%s" % (case, k)] = v
    for k, v in params.items():
        out["%s.param.%s" % (case, k)] = v
    out["%s.out.y" % case] = y
    if scalar:
        y.backward()
    else:
        dy = torch.randn_like(y)
        out["%s.dy" % case] = dy
        y.backward(dy)
    for k, v in list(inputs.items()) + list(params.items()):
        if v.dtype.is_floating_point and v.requires_grad:
            out["%s.grad.%s" % (case, k)] = v.grad


def sdpa_reference(q, k, v, causal=False, lengths=None, window=-1):
    """attograd's scaled_dot_product_attention (autograd/ops.h) in explicit math:
    S = q k^T / sqrt(d); key j hidden from query i when causal and j > i + Tk - Tq, when
    |i + Tk - Tq - j| > window (window >= 0), or when j >= lengths[b]; P = softmax(S); out = P v."""
    Tq, Tk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s = q @ k.transpose(-2, -1) / math.sqrt(d)
    i = torch.arange(Tq).view(Tq, 1) + (Tk - Tq)   # query i sits at key position i + Tk - Tq
    j = torch.arange(Tk).view(1, Tk)
    hidden = torch.zeros(Tq, Tk, dtype=torch.bool)
    if causal:
        hidden |= j > i
    if window >= 0:
        hidden |= (i - j).abs() > window
    hidden = hidden.view(1, 1, Tq, Tk).expand(q.shape[0], 1, Tq, Tk)
    if lengths is not None:
        hidden = hidden | (j.view(1, 1, 1, Tk) >= lengths.view(-1, 1, 1, 1))
    s = s.masked_fill(hidden, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


# ---- parity_ops ---------------------------------------------------------------------------------
def make_ops():
    out = {}
    x = leaf(3, 4, 7, scale=2.0)
    run_case(out, "gelu", lambda: F.gelu(x), {"x": x})
    x = leaf(3, 4, 7, scale=2.0)
    run_case(out, "gelu_tanh", lambda: F.gelu(x, approximate="tanh"), {"x": x})
    x = leaf(3, 5, 9, scale=3.0)
    run_case(out, "softmax", lambda: torch.softmax(x, dim=-1), {"x": x})
    x = leaf(3, 5, 9, scale=3.0)
    run_case(out, "softmax_dim1", lambda: torch.softmax(x, dim=1), {"x": x})
    x = leaf(3, 5, 9, scale=3.0)
    run_case(out, "log_softmax", lambda: torch.log_softmax(x, dim=-1), {"x": x})

    # cross_entropy: N 12 rows of C 10 classes, some rows ignored
    logits = leaf(12, 10, scale=2.0)
    target = torch.randint(0, 10, (12,))
    target[[2, 7, 8]] = -100
    run_case(out, "ce_smooth", lambda: F.cross_entropy(logits, target, ignore_index=-100, label_smoothing=0.1),
             {"logits": logits, "target": target}, scalar=True)
    logits = leaf(12, 10, scale=2.0)
    target = torch.randint(0, 10, (12,))
    target[[0, 5]] = 3  # ignore_index may be a class index: rows with target 3 are skipped
    run_case(out, "ce_ignore3_sum", lambda: F.cross_entropy(logits, target, ignore_index=3, reduction="sum"),
             {"logits": logits, "target": target}, scalar=True)

    # scaled_dot_product_attention: B 2, H 2, d 8
    B, H, d = 2, 2, 8
    cases = [("sdpa", 6, 6, {}),
             ("sdpa_cross", 5, 7, {}),
             ("sdpa_causal", 7, 7, {"causal": True}),
             ("sdpa_causal_rect", 4, 7, {"causal": True}),        # bottom-right aligned
             ("sdpa_padding", 6, 6, {"lengths": torch.tensor([6, 3])}),
             ("sdpa_window", 7, 7, {"window": 2}),
             ("sdpa_causal_window", 7, 7, {"causal": True, "window": 2})]
    for case, Tq, Tk, opt in cases:
        q, k, v = leaf(B, H, Tq, d), leaf(B, H, Tk, d), leaf(B, H, Tk, d)
        inputs = {"q": q, "k": k, "v": v}
        if "lengths" in opt:
            inputs["lengths"] = opt["lengths"]
        run_case(out, case, lambda: sdpa_reference(q, k, v, **opt), inputs)
    return out


# ---- parity_layers ------------------------------------------------------------------------------
class TorchBlock(torch.nn.Module):
    """attograd's TransformerBlock (nn/transformer.cpp) with its parameter names:
    x = x + proj(attn(qkv(ln1(x)))),  x = x + fc2(gelu(fc1(ln2(x)))), exact GELU, dropout 0."""

    def __init__(self, d, n_heads, hidden, causal):
        super().__init__()
        self.n_heads, self.causal = n_heads, causal
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.Module()
        self.attn.qkv = torch.nn.Linear(d, 3 * d)
        self.attn.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Module()
        self.mlp.fc1 = torch.nn.Linear(d, hidden)
        self.mlp.fc2 = torch.nn.Linear(hidden, d)
        with torch.no_grad():  # LayerNorm starts at 1 / 0; move it so its gradients matter
            for ln in (self.ln1, self.ln2):
                ln.weight.add_(0.1 * torch.randn_like(ln.weight))
                ln.bias.add_(0.1 * torch.randn_like(ln.bias))

    def forward(self, x):
        B, T, d = x.shape
        H = self.n_heads
        qkv = self.attn.qkv(self.ln1(x)).view(B, T, 3, H, d // H).permute(2, 0, 3, 1, 4)
        o = sdpa_reference(qkv[0], qkv[1], qkv[2], causal=self.causal)
        x = x + self.attn.proj(o.transpose(1, 2).reshape(B, T, d))
        return x + self.mlp.fc2(F.gelu(self.mlp.fc1(self.ln2(x))))


def named(module):
    return dict(module.named_parameters())


def make_layers():
    out = {}
    B, T, d = 2, 6, 16

    lin = torch.nn.Linear(d, 8)
    x = leaf(B, T, d)
    run_case(out, "linear", lambda: lin(x), {"x": x}, named(lin))

    emb = torch.nn.Embedding(10, d, padding_idx=0)
    idx = torch.tensor([[1, 4, 0, 4, 9, 2], [0, 7, 7, 3, 1, 8]])
    run_case(out, "embedding", lambda: emb(idx), {"idx": idx}, named(emb))

    ln = torch.nn.LayerNorm(d)
    with torch.no_grad():
        ln.weight.add_(0.2 * torch.randn(d))
        ln.bias.add_(0.2 * torch.randn(d))
    x = leaf(B, T, d, scale=2.0)
    run_case(out, "layer_norm", lambda: ln(x), {"x": x}, named(ln))

    # RMSNorm (torch 1.13 has none): y = x / sqrt(mean(x^2) + eps) * weight, eps 1e-6 as ours
    w = (1 + 0.2 * torch.randn(d)).requires_grad_(True)
    x = leaf(B, T, d, scale=2.0)
    run_case(out, "rms_norm", lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
             {"x": x}, {"weight": w})

    # MultiHeadAttention: torch's own module; in_proj = our qkv, out_proj = our proj
    H = 4
    mha = torch.nn.MultiheadAttention(d, H, batch_first=True)
    with torch.no_grad():
        mha.in_proj_bias.copy_(0.1 * torch.randn(3 * d))
        mha.out_proj.bias.copy_(0.1 * torch.randn(d))
    ours = {"qkv.weight": mha.in_proj_weight, "qkv.bias": mha.in_proj_bias,
            "proj.weight": mha.out_proj.weight, "proj.bias": mha.out_proj.bias}
    x = leaf(B, T, d)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    run_case(out, "mha_self", lambda: mha(x, x, x, attn_mask=causal, need_weights=False)[0], {"x": x}, ours)
    for p in mha.parameters():
        p.grad = None
    Tk = 8
    x, ctx = leaf(B, 5, d), leaf(B, Tk, d)
    pad = torch.zeros(B, Tk, dtype=torch.bool)
    pad[1, 5:] = True  # the second sequence has 5 valid keys
    run_case(out, "mha_cross", lambda: mha(x, ctx, ctx, key_padding_mask=pad, need_weights=False)[0],
             {"x": x, "context": ctx, "lengths": torch.tensor([Tk, 5])}, ours)

    block = TorchBlock(d, H, 4 * d, causal=True)
    x = leaf(B, T, d)
    run_case(out, "block", lambda: block(x), {"x": x}, named(block))
    return out


# ---- parity_optim -------------------------------------------------------------------------------
OPTIMIZERS = {  # the same hyper-parameters are written in tests/nn/test_parity.cpp
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1),
}


def make_optim():
    out = {}
    for case, make in OPTIMIZERS.items():
        ps = {"a": torch.randn(3, 4).requires_grad_(True), "b": torch.randn(5).requires_grad_(True)}
        for k, p in ps.items():
            out["%s.init.%s" % (case, k)] = p.detach().clone()
        opt = make(list(ps.values()))
        for t in range(3):
            for k, p in ps.items():
                p.grad = torch.randn_like(p)
                out["%s.grad%d.%s" % (case, t, k)] = p.grad.clone()
            opt.step()
            for k, p in ps.items():
                out["%s.step%d.%s" % (case, t, k)] = p.detach().clone()

    # clip_grad_norm over three gradients, 2-norm (clips) and inf-norm (clips)
    for case, norm_type, max_norm in (("clip2", 2.0, 1.0), ("clip_inf", math.inf, 0.5)):
        ps = [torch.zeros(3, 4, requires_grad=True), torch.zeros(5, requires_grad=True),
              torch.zeros(2, 2, 2, requires_grad=True)]
        for i, p in enumerate(ps):
            p.grad = torch.randn_like(p)
            out["%s.grad.%d" % (case, i)] = p.grad.clone()
        norm = torch.nn.utils.clip_grad_norm_(ps, max_norm, norm_type=norm_type)
        out["%s.norm" % case] = norm.double()
        for i, p in enumerate(ps):
            out["%s.clipped.%d" % (case, i)] = p.grad.clone()
    return out


# ---- parity_train -------------------------------------------------------------------------------
class TorchGPT(torch.nn.Module):
    """Token embedding + learned positions + causal TransformerBlocks + final LayerNorm + head
    (no bias), with the names of ag::apps::GPT (apps/gpt/model.h)."""

    def __init__(self, vocab, T, d, n_heads, n_blocks):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, d)
        self.wpe = torch.nn.Module()
        self.wpe.weight = torch.nn.Parameter(torch.randn(T, d))
        self.blocks = torch.nn.ModuleList([TorchBlock(d, n_heads, 4 * d, causal=True) for _ in range(n_blocks)])
        self.ln_f = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def make_train():
    out = {}
    V, T, d, H, B, steps = 16, 8, 16, 2, 4, 20
    model = TorchGPT(V, T, d, H, 2)
    for k, p in model.named_parameters():
        out["train.param." + k] = p.detach().clone()
    seq = torch.randint(0, V, (B, T + 1))
    idx, target = seq[:, :T].contiguous(), seq[:, 1:].contiguous()
    out["train.in.idx"], out["train.in.target"] = idx, target
    train_twin(out, "train", model, idx, target, V, steps)
    return out


def train_twin(out, case, model, idx, target, V, steps):
    """AdamW (lr 1e-2, weight decay 0.01), gradients clipped to norm 1: <case>.losses and
    <case>.grad_norms (before each clip), as the C++ test repeats it."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    losses, norms = [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(idx).view(idx.numel(), V), target.view(idx.numel()))
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
        losses.append(loss.item())
    out[case + ".losses"] = torch.tensor(losses, dtype=torch.float64)
    out[case + ".grad_norms"] = torch.tensor(norms, dtype=torch.float64)
    print(case, "losses", " ".join("%.4f" % v for v in losses))


# ---- parity_modern -------------------------------------------------------------------------------
def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rope_reference(x, base=10000.0):
    """Rotary positions as GPT-NeoX and LLaMA apply them: x cos + rotate_half(x) sin."""
    T, D = x.shape[-2], x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    a = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    cos, sin = torch.cat([a.cos(), a.cos()], -1).float(), torch.cat([a.sin(), a.sin()], -1).float()
    return x * cos + rotate_half(x) * sin


def alibi_slopes(n):  # the ALiBi paper's get_slopes, for n a power of two
    start = 2 ** (-2 ** -(math.log2(n) - 3))
    return torch.tensor([start * start ** i for i in range(n)])


class TorchModernBlock(torch.nn.Module):
    """LLaMA's block with attograd's names: x = x + proj(attn(qkv(rmsnorm1(x)))) with kv_heads
    key/value heads (repeat_interleave) and rope on q, k or an ALiBi bias on the scores, then
    x = x + w2(silu(w1(h)) * w3(h)), h = rmsnorm2(x)."""

    def __init__(self, d, n_heads, kv_heads, hidden, pos):
        super().__init__()
        self.H, self.Hkv, self.pos = n_heads, kv_heads, pos
        hs = d // n_heads
        self.ln1, self.ln2 = torch.nn.Module(), torch.nn.Module()
        self.ln1.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(d))
        self.ln2.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(d))
        self.attn = torch.nn.Module()
        self.attn.qkv = torch.nn.Linear(d, d + 2 * kv_heads * hs)
        self.attn.proj = torch.nn.Linear(d, d)
        self.mlp = torch.nn.Module()
        self.mlp.w1 = torch.nn.Linear(d, hidden, bias=False)
        self.mlp.w2 = torch.nn.Linear(hidden, d, bias=False)
        self.mlp.w3 = torch.nn.Linear(d, hidden, bias=False)

    @staticmethod
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def forward(self, x):
        B, T, d = x.shape
        H, Hkv, hs = self.H, self.Hkv, d // self.H
        q, k, v = self.attn.qkv(self.rms(x, self.ln1.weight)).split([d, Hkv * hs, Hkv * hs], dim=-1)
        q = q.view(B, T, H, hs).transpose(1, 2)
        k = k.view(B, T, Hkv, hs).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        v = v.view(B, T, Hkv, hs).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        s_bias = 0
        if self.pos == "rope":
            q, k = rope_reference(q), rope_reference(k)
        else:
            dist = (torch.arange(T).view(T, 1) - torch.arange(T).view(1, T)).abs()
            s_bias = -alibi_slopes(H).view(H, 1, 1) * dist
        s = q @ k.transpose(-2, -1) / math.sqrt(hs) + s_bias
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.softmax(s, -1) @ v
        x = x + self.attn.proj(o.transpose(1, 2).reshape(B, T, d))
        h = self.rms(x, self.ln2.weight)
        return x + self.mlp.w2(F.silu(self.mlp.w1(h)) * self.mlp.w3(h))


class TorchModernGPT(torch.nn.Module):
    """ag::apps::GPT with pos rope or alibi, kv_heads, mlp_kind swiglu, norm rmsnorm: no wpe."""

    def __init__(self, vocab, d, n_heads, kv_heads, n_blocks, pos):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(
            [TorchModernBlock(d, n_heads, kv_heads, 3 * d, pos) for _ in range(n_blocks)])
        self.ln_f = torch.nn.Module()
        self.ln_f.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(d))
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.wte(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(TorchModernBlock.rms(x, self.ln_f.weight))


def make_modern():
    out = {}
    V, T, d, H, Hkv, B, steps = 16, 8, 16, 4, 2, 4, 20
    for pos in ("rope", "alibi"):
        c = "modern_" + pos
        model = TorchModernGPT(V, d, H, Hkv, 2, pos)
        for k, p in model.named_parameters():
            out[c + ".param." + k] = p.detach().clone()
        seq = torch.randint(0, V, (B, T + 1))
        idx, target = seq[:, :T].contiguous(), seq[:, 1:].contiguous()
        out[c + ".in.idx"], out[c + ".in.target"] = idx, target
        train_twin(out, c, model, idx, target, V, steps)
    return out


def main():
    torch.manual_seed(1234)
    write_golden(os.path.join(GOLDEN, "parity_ops.safetensors"), make_ops())
    write_golden(os.path.join(GOLDEN, "parity_layers.safetensors"), make_layers())
    write_golden(os.path.join(GOLDEN, "parity_optim.safetensors"), make_optim())
    write_golden(os.path.join(GOLDEN, "parity_train.safetensors"), make_train())
    torch.manual_seed(4321)  # a stream of its own: the files above stay as they were
    write_golden(os.path.join(GOLDEN, "parity_modern.safetensors"), make_modern())


if __name__ == "__main__":
    main()
