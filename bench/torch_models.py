"""PyTorch twins of the sample models in apps/gpt, apps/vit, apps/textclf, apps/longseq and apps/imagetext (model.h), for checks and benchmarks only.

Same parameter names, shapes and math as the C++ models, so a state_dict (a safetensors file)
moves between the two unchanged:

  Block        ln1, attn.qkv, attn.proj, ln2, mlp.fc1, mlp.fc2      pre-LN, exact (erf) GELU
  GPT          wte, wpe, blocks.i, ln_f, head (no bias)             causal; pos learned | sinusoidal | rope |
                                                                    alibi (no wpe but for learned), kv_heads,
                                                                    mlp_kind swiglu (mlp.w1, w2, w3), norm rmsnorm
  ViT          patch.proj, patch.cls_token, pos_embed, blocks.i, norm, head
  TextClassifier tok (padding 0), [ngram (padding 0),] pos, blocks.i, norm, head
                                                                    key padding by lengths, masked mean;
                                                                    subword n-grams: a word's vector is tok plus
                                                                    the sum of its n-grams' rows
  ImageText    patch.proj, patch.cls_token, enc_pos, enc_blocks.i, enc_norm,
               wte, wpe, dec_blocks.i (ln1, attn, ln_cross, cross_attn, ln2, mlp), ln_f, head (no bias)
                                                                    decoder: causal self-attention, then
                                                                    cross-attention to the encoder's tokens
  LongSeqClassifier embed (padding 0), pos_embed, blocks.i (ln1, attn, ln2, mlp), norm, head
                                                                    attn by method: qkv/proj (full, window,
                                                                    sparse), + E/F (linformer), +
                                                                    compress_k/v (compressed), row/col (axial)

Attention is written out (q k^T / sqrt(hs), mask, softmax, dropout, @ v) so it runs on any
PyTorch version; with torch >= 2.0 the fused F.scaled_dot_product_attention is used instead
when no weights are requested (use_sdpa=True), which is what a PyTorch user would run.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def rope(x, base=10000.0):
    """Rotary positions, rotate-half layout (autograd/ops.h rope), positions 0 .. T-1 of x (..., T, D)."""
    T, D = x.shape[-2], x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D))
    a = torch.outer(torch.arange(T, dtype=torch.float64, device=x.device), inv)
    cos, sin = torch.cat([a.cos(), a.cos()], -1).to(x.dtype), torch.cat([a.sin(), a.sin()], -1).to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def alibi_slopes(n):
    """nn::alibi_slopes (nn/positional.h): the ALiBi paper's slopes."""
    p = 2 ** math.floor(math.log2(n))
    m = [2 ** (-8 * (h + 1) / p) for h in range(p)]
    return torch.tensor(m + [2 ** (-8 * (h + 1) / (2 * p)) for h in range(0, 2 * (n - p), 2)])


class RMSNorm(nn.Module):
    """nn::RMSNorm (nn/norm.h), eps 1e-6 (torch.nn.RMSNorm exists only from PyTorch 2.4)."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self, d, heads, dropout, kv_heads=0, pos="none"):
        super().__init__()
        self.heads, self.hs, self.dropout = heads, d // heads, dropout
        self.kv_heads, self.pos = kv_heads or heads, pos
        self.qkv = nn.Linear(d, d + 2 * self.kv_heads * self.hs)
        self.proj = nn.Linear(d, d)
        self.use_sdpa = HAS_SDPA
        self.weights = None  # (B, H, T, T) of the last forward when keep_weights
        if pos == "alibi":
            self.register_buffer("slopes", alibi_slopes(heads), persistent=False)

    def forward(self, x, causal=False, lengths=None, keep_weights=False, attn_mask=None):
        """attn_mask: bool (T, T) or broadcastable, True = may attend (a window or a sparse pattern)."""
        B, T, d = x.shape
        kvd = self.kv_heads * self.hs
        q, k, v = self.qkv(x).split([d, kvd, kvd], dim=-1)
        q = q.reshape(B, T, self.heads, self.hs).transpose(1, 2)
        k, v = (t.reshape(B, T, self.kv_heads, self.hs).transpose(1, 2) for t in (k, v))
        if self.kv_heads != self.heads:  # grouped-query: each key/value head serves heads/kv_heads queries
            k, v = (t.repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (k, v))
        if self.pos == "rope":
            q, k = rope(q), rope(k)
        mask = attn_mask  # True = may attend
        if causal:
            tril = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            mask = tril if mask is None else (mask & tril)
        if lengths is not None:
            keys = torch.arange(T, device=x.device)[None, :] < lengths[:, None]  # (B, T)
            keys = keys[:, None, None, :]
            mask = keys if mask is None else (mask & keys)
        p = self.dropout if self.training else 0.0
        if self.pos == "alibi":  # -m_h |i - j| on the scores, hidden keys at -inf: a float mask
            dist = (torch.arange(T, device=x.device)[:, None] - torch.arange(T, device=x.device)[None, :]).abs()
            bias = -self.slopes.to(x.dtype)[:, None, None] * dist
            mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        if self.use_sdpa and not keep_weights:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        else:
            s = (q @ k.transpose(-2, -1)) / math.sqrt(self.hs)
            if mask is not None and mask.dtype != torch.bool:
                s = s + mask
            elif mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            w = torch.softmax(s, dim=-1)
            self.weights = w.detach() if keep_weights else None
            o = F.dropout(w, p) @ v
        return self.proj(o.transpose(1, 2).reshape(B, T, d))


class MLP(nn.Module):
    def __init__(self, d, hidden, dropout):
        super().__init__()
        self.fc1, self.fc2, self.dropout = nn.Linear(d, hidden), nn.Linear(hidden, d), dropout

    def forward(self, x):
        return F.dropout(self.fc2(F.gelu(self.fc1(x))), self.dropout, self.training)


class SwiGLU(nn.Module):
    """nn::SwiGLU (nn/mlp.h): w2(silu(w1 x) * w3 x), no biases."""

    def __init__(self, d, hidden, dropout):
        super().__init__()
        self.w1, self.w2, self.w3 = (nn.Linear(a, b, bias=False) for a, b in ((d, hidden), (hidden, d), (d, hidden)))
        self.dropout = dropout

    def forward(self, x):
        return F.dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)), self.dropout, self.training)


def make_norm(norm, d):
    return RMSNorm(d) if norm == "rmsnorm" else nn.LayerNorm(d)


class Block(nn.Module):
    def __init__(self, d, heads, hidden, dropout=0.0, causal=False, kv_heads=0, pos="none", mlp_kind="gelu",
                 norm="layernorm"):
        super().__init__()
        self.causal = causal
        self.ln1, self.attn = make_norm(norm, d), Attention(d, heads, dropout, kv_heads, pos)
        self.ln2 = make_norm(norm, d)
        self.mlp = SwiGLU(d, hidden, dropout) if mlp_kind == "swiglu" else MLP(d, hidden, dropout)

    def forward(self, x, lengths=None, keep_weights=False):
        x = x + self.attn(self.ln1(x), self.causal, lengths, keep_weights)
        return x + self.mlp(self.ln2(x))


def init_gpt2_style(model, n_layers):
    """As init_gpt2_style in apps/common/gpt2_style.cpp."""
    std_resid = 0.02 / math.sqrt(2 * n_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                resid = name.endswith(("attn.proj.weight", "mlp.fc2.weight", "mlp.w2.weight"))
                p.normal_(0.0, std_resid if resid else 0.02)
            elif name.endswith("bias"):
                p.zero_()


def sinusoidal_positions(T, d, device=None):
    """nn::sinusoidal_positions (nn/positional.h): sin and cos pairs of frequency 1 / 10000^(2i/d)."""
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    two_i = (torch.arange(d) - torch.arange(d) % 2).to(torch.float64)[None, :]
    a = pos / 10000.0 ** (two_i / d)
    pe = torch.where(torch.arange(d)[None, :] % 2 == 0, a.sin(), a.cos())
    return pe.float().to(device)


class GPT(nn.Module):
    def __init__(self, vocab=96, context=128, d_model=128, n_heads=4, n_layers=4, mlp_hidden=512, dropout=0.0,
                 pos="learned", kv_heads=0, mlp_kind="gelu", norm="layernorm"):
        super().__init__()
        self.pos = pos
        self.wte = nn.Embedding(vocab, d_model)
        if pos == "learned":
            self.wpe = nn.Embedding(context, d_model)
        inner = pos if pos in ("rope", "alibi") else "none"
        self.blocks = nn.ModuleList(Block(d_model, n_heads, mlp_hidden, dropout, True, kv_heads, inner, mlp_kind, norm)
                                    for _ in range(n_layers))
        self.ln_f = make_norm(norm, d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        init_gpt2_style(self, n_layers)

    def forward(self, idx):
        h = self.wte(idx)
        if self.pos == "learned":
            h = h + self.wpe.weight[: idx.shape[1]]
        elif self.pos == "sinusoidal":  # the Transformer paper's sum: embeddings times sqrt(d), + PE
            h = h * math.sqrt(h.shape[-1]) + sinusoidal_positions(idx.shape[1], h.shape[-1], h.device)
        for b in self.blocks:
            h = b(h)
        return self.head(self.ln_f(h))


class PatchEmbedding(nn.Module):
    def __init__(self, channels, patch, d_model):
        super().__init__()
        self.patch = patch
        self.proj = nn.Linear(channels * patch * patch, d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))

    def forward(self, x):  # (B, C, H, W) -> (B, N + 1, d), patches row-major, (c, i, j) inside
        B, C, H, W = x.shape
        p = self.patch
        x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5).reshape(B, -1, C * p * p)
        t = self.proj(x)
        return torch.cat([self.cls_token.expand(B, -1, -1), t], dim=1)


class ViT(nn.Module):
    def __init__(self, image_size=28, channels=1, patch=7, classes=10, d_model=64, n_heads=4, n_layers=4,
                 mlp_hidden=256, dropout=0.0):
        super().__init__()
        n = (image_size // patch) ** 2
        self.patch = PatchEmbedding(channels, patch, d_model)
        self.pos_embed = nn.Parameter(torch.zeros(1, n + 1, d_model))
        self.blocks = nn.ModuleList(Block(d_model, n_heads, mlp_hidden, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)
        init_gpt2_style(self, n_layers)

    def forward(self, x):
        h = self.patch(x) + self.pos_embed
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h[:, 0]))


class CrossAttention(nn.Module):
    """nn::MultiHeadAttention's cross form: queries from x with rows [0, d) of the fused qkv weight (in_proj's
    q part), keys and values from the context with rows [d, 2d) and [2d, 3d); then proj (out_proj)."""

    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads, self.hs, self.dropout = heads, d // heads, dropout
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.weights = None  # (B, H, Tq, Tk) of the last forward when keep_weights

    def forward(self, x, context, keep_weights=False):
        B, Tq, d = x.shape
        Tk = context.shape[1]
        q = F.linear(x, self.qkv.weight[:d], self.qkv.bias[:d]).reshape(B, Tq, self.heads, self.hs).transpose(1, 2)
        k, v = F.linear(context, self.qkv.weight[d:], self.qkv.bias[d:]).split([d, d], dim=-1)
        k, v = (t.reshape(B, Tk, self.heads, self.hs).transpose(1, 2) for t in (k, v))
        w = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(self.hs), dim=-1)  # (B, H, Tq, Tk)
        self.weights = w.detach() if keep_weights else None
        o = F.dropout(w, self.dropout, self.training) @ v
        return self.proj(o.transpose(1, 2).reshape(B, Tq, d))


class DecoderBlock(nn.Module):
    """nn::TransformerBlock with causal = cross = true: pre-LN self-attention, cross-attention, MLP."""

    def __init__(self, d, heads, hidden, dropout=0.0):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), Attention(d, heads, dropout)
        self.ln_cross, self.cross_attn = nn.LayerNorm(d), CrossAttention(d, heads, dropout)
        self.ln2, self.mlp = nn.LayerNorm(d), MLP(d, hidden, dropout)

    def forward(self, x, memory, keep_weights=False):
        x = x + self.attn(self.ln1(x), True)
        x = x + self.cross_attn(self.ln_cross(x), memory, keep_weights)
        return x + self.mlp(self.ln2(x))


class ImageText(nn.Module):
    """apps/imagetext/model.h: a ViT encoder of the scene (patches + class token + enc_pos, blocks, enc_norm)
    and a causal decoder whose blocks cross-attend to the encoder's tokens."""

    def __init__(self, image_h=28, image_w=112, channels=1, patch=7, vocab=13, max_len=5, d_model=64, n_heads=4,
                 enc_layers=2, dec_layers=2, mlp_hidden=256, dropout=0.0):
        super().__init__()
        n = (image_h // patch) * (image_w // patch)
        self.patch = PatchEmbedding(channels, patch, d_model)
        self.enc_pos = nn.Parameter(torch.zeros(1, n + 1, d_model))
        self.enc_blocks = nn.ModuleList(Block(d_model, n_heads, mlp_hidden, dropout) for _ in range(enc_layers))
        self.enc_norm = nn.LayerNorm(d_model)
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(max_len, d_model)
        self.dec_blocks = nn.ModuleList(DecoderBlock(d_model, n_heads, mlp_hidden, dropout) for _ in range(dec_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        init_gpt2_style(self, enc_layers + dec_layers)

    def encode(self, images):  # (B, C, H, W) -> memory (B, N + 1, d)
        m = self.patch(images) + self.enc_pos
        for b in self.enc_blocks:
            m = b(m)
        return self.enc_norm(m)

    def forward(self, images, idx):  # -> logits (B, T, V)
        memory = self.encode(images)
        h = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
        for b in self.dec_blocks:
            h = b(h, memory)
        return self.head(self.ln_f(h))


class TextClassifier(nn.Module):
    def __init__(self, vocab=20000, max_len=256, classes=2, d_model=128, n_heads=4, n_layers=2, mlp_hidden=512,
                 dropout=0.1, ngram_buckets=0, ngram_min=2, ngram_max=5, ngrams_per_token=32, bag=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model, padding_idx=0)
        # hashed subword n-grams (ngram_min..ngram_max and ngrams_per_token only shape the ids, which
        # the caller computes, as data/tokenizer.h hashed_ngrams)
        self.ngram = nn.Embedding(ngram_buckets + 1, d_model, padding_idx=0) if ngram_buckets > 0 else None
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, mlp_hidden, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)
        self.dropout = dropout
        init_gpt2_style(self, n_layers)
        # the bag path: a linear model of the same features, zeros until set (the C++ side starts it
        # as naive Bayes on the training set: init_bag_from_naive_bayes)
        self.bag_tok = nn.Embedding(vocab, classes, padding_idx=0) if bag else None
        self.bag_ngram = nn.Embedding(ngram_buckets + 1, classes, padding_idx=0) if bag and ngram_buckets > 0 else None
        with torch.no_grad():
            self.tok.weight[0].zero_()
            if self.ngram is not None:
                self.ngram.weight[0].zero_()
            for t in (self.bag_tok, self.bag_ngram):
                if t is not None:
                    t.weight.zero_()

    def forward(self, tokens, lengths, ngrams=None):
        T = tokens.shape[1]
        e = self.tok(tokens)
        if self.ngram is not None:  # ngrams (B, T, G): the word's vector plus its n-grams' vectors
            e = e + self.ngram(ngrams).sum(2)
        h = e + self.pos.weight[:T]
        for b in self.blocks:
            h = b(h, lengths)
        valid = (torch.arange(T, device=tokens.device)[None, :] < lengths[:, None]).to(h.dtype).unsqueeze(2)
        count = lengths.clamp(min=1).to(h.dtype)[:, None]
        pooled = (self.norm(h) * valid).sum(1) / count
        logits = self.head(F.dropout(pooled, self.dropout, self.training))
        if self.bag_tok is not None:  # the mean over the valid tokens of their rows (and their n-grams')
            bag = self.bag_tok(tokens)
            if self.bag_ngram is not None:
                bag = bag + self.bag_ngram(ngrams).sum(2)
            logits = logits + (bag * valid).sum(1) / count
        return logits


# ---- efficient attention for long sequences: twins of nn/efficient_attention.h -------------------
# Same parameter names and math as LinformerAttention, MemoryCompressedAttention and AxialAttention,
# written out with an explicit mask (True = may attend) so a query that sees no key gets zeros.
# key_padding_mask: (B, T) bool, True = padded (PyTorch's convention).


def _attend(q, k, v, visible, dropout, training):
    """q (B, H, Tq, hs), k, v (B, H, Tk, hs), visible broadcast to (B, H, Tq, Tk) or None. The fused
    F.scaled_dot_product_attention when torch has it and every query sees a key (what a PyTorch user
    runs); the math otherwise, where a query that sees no key gets zeros rather than NaN."""
    if HAS_SDPA and (visible is None or bool(visible.any(-1).all())):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, dropout_p=dropout if training else 0.0)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    w = torch.softmax(s, dim=-1)
    if visible is not None:
        w = torch.nan_to_num(w, nan=0.0)  # a row that sees no key: zeros
    return F.dropout(w, dropout, training) @ v


def _heads(t, heads):  # (B, T, d) -> (B, H, T, hs)
    B, T, d = t.shape
    return t.reshape(B, T, heads, d // heads).transpose(1, 2)


def _merge(o):  # (B, H, T, hs) -> (B, T, d)
    B, H, T, hs = o.shape
    return o.transpose(1, 2).reshape(B, T, H * hs)


class LinformerAttention(nn.Module):
    """k' = E[:, :T] k, v' = F[:, :T] v (E, F (k, max_len), shared by the heads); softmax(q k'^T / sqrt(hs)) v'."""

    def __init__(self, d, heads, max_len, k, dropout=0.0, bias=True):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(d, 3 * d, bias=bias)
        self.proj = nn.Linear(d, d, bias=bias)
        bound = 1.0 / math.sqrt(max_len)
        self.E = nn.Parameter(torch.empty(k, max_len).uniform_(-bound, bound))
        self.F = nn.Parameter(torch.empty(k, max_len).uniform_(-bound, bound))

    def forward(self, x, key_padding_mask=None):
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        if key_padding_mask is not None:  # padded keys and values are zeroed before the projection
            k = k.masked_fill(key_padding_mask[:, :, None], 0.0)
            v = v.masked_fill(key_padding_mask[:, :, None], 0.0)
        k = self.E[:, :T] @ k  # (B, k, d)
        v = self.F[:, :T] @ v
        o = _attend(_heads(q, self.heads), _heads(k, self.heads), _heads(v, self.heads), None,
                    self.dropout if self.training else 0.0, self.training)
        return self.proj(_merge(o))


class MemoryCompressedAttention(nn.Module):
    """k, v compressed by Linear(s d, d) over blocks of s positions (zero-padded at the end); causal:
    query i sees block j iff (j + 1) s - 1 <= i."""

    def __init__(self, d, heads, stride, dropout=0.0, bias=True):
        super().__init__()
        self.heads, self.stride, self.dropout = heads, stride, dropout
        self.qkv = nn.Linear(d, 3 * d, bias=bias)
        self.compress_k = nn.Linear(stride * d, d, bias=bias)
        self.compress_v = nn.Linear(stride * d, d, bias=bias)
        self.proj = nn.Linear(d, d, bias=bias)

    def forward(self, x, causal=False, key_padding_mask=None):
        B, T, d = x.shape
        s = self.stride
        Tc = (T + s - 1) // s
        q, k, v = self.qkv(x).split(d, dim=2)
        pad = torch.zeros(B, T, dtype=torch.bool, device=x.device)
        if key_padding_mask is not None:
            pad = key_padding_mask
            k = k.masked_fill(pad[:, :, None], 0.0)
            v = v.masked_fill(pad[:, :, None], 0.0)
        k = F.pad(k, (0, 0, 0, Tc * s - T))  # zero positions at the end
        v = F.pad(v, (0, 0, 0, Tc * s - T))
        kc = self.compress_k(k.reshape(B, Tc, s * d))
        vc = self.compress_v(v.reshape(B, Tc, s * d))
        hidden = F.pad(pad, (0, Tc * s - T), value=True).reshape(B, Tc, s).all(2)  # (B, Tc)
        visible = ~hidden[:, None, None, :]
        if causal:
            i = torch.arange(T, device=x.device)[:, None]
            j = torch.arange(Tc, device=x.device)[None, :]
            visible = visible & ((j + 1) * s - 1 <= i)
        o = _attend(_heads(q, self.heads), _heads(kc, self.heads), _heads(vc, self.heads), visible,
                    self.dropout if self.training else 0.0, self.training)
        return self.proj(_merge(o))


class _MHA(nn.Module):  # attograd's MultiHeadAttention: qkv (in_proj) and proj (out_proj)
    def __init__(self, d, heads, dropout, bias):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(d, 3 * d, bias=bias)
        self.proj = nn.Linear(d, d, bias=bias)

    def forward(self, x, causal=False, visible=None):
        """visible: bool broadcast to (B, H, T, T), True = may attend; a query that sees no key gets 0."""
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        if causal:
            tril = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            visible = tril if visible is None else (visible & tril)
        o = _attend(_heads(q, self.heads), _heads(k, self.heads), _heads(v, self.heads), visible,
                    self.dropout if self.training else 0.0, self.training)
        return self.proj(_merge(o))


class AxialAttention(nn.Module):
    """x (B, height * width, d) in raster order: attention along each row (row), then along each column (col)."""

    def __init__(self, d, heads, height, width, causal=False, dropout=0.0, bias=True):
        super().__init__()
        self.height, self.width, self.causal = height, width, causal
        self.row = _MHA(d, heads, dropout, bias)
        self.col = _MHA(d, heads, dropout, bias)

    def forward(self, x):
        B, T, d = x.shape
        Hh, Ww = self.height, self.width
        z = self.row(x.reshape(B * Hh, Ww, d), self.causal)
        z = z.reshape(B, Hh, Ww, d).transpose(1, 2).reshape(B * Ww, Hh, d)
        y = self.col(z, self.causal)
        return y.reshape(B, Ww, Hh, d).transpose(1, 2).reshape(B, Hh * Ww, d)


# ---- apps/longseq: the long-sequence classifier, one attention method per model ---------------


def longseq_pattern(method, T, window=64, sparse="local-global", block=32, window_blocks=1, global_blocks=1,
                    stride_blocks=4, device=None):
    """The (T, T) bool pattern of window or sparse attention (True = may attend; apps/longseq's
    SdpaOptions::window and nn/sparse_patterns.h), None for the other methods."""
    i = torch.arange(T, device=device)
    if method == "window":
        return (i[:, None] - i[None, :]).abs() <= window
    if method != "sparse":
        return None
    n = (T + block - 1) // block
    a, c = torch.arange(n, device=device)[:, None], torch.arange(n, device=device)[None, :]
    if sparse == "strided":
        kept = ((a - c).abs() < stride_blocks) | ((a - c) % stride_blocks == 0)
    else:
        kept = ((a - c).abs() <= window_blocks) | (a < global_blocks) | (c < global_blocks)
    blocks = i // block
    return kept[blocks[:, None], blocks[None, :]]


class LongSeqBlock(nn.Module):
    """pre-LN: h += attn(ln1(h)); h += mlp(ln2(h)), attn chosen by the method (apps/longseq/model.h)."""

    def __init__(self, cfg):
        super().__init__()
        d, H, p, m = cfg["d_model"], cfg["n_heads"], cfg["dropout"], cfg["attention"]
        self.cfg = cfg
        self.ln1 = nn.LayerNorm(d)
        if m == "linformer":
            self.attn = LinformerAttention(d, H, cfg["max_len"], cfg["k"], p)
        elif m == "compressed":
            self.attn = MemoryCompressedAttention(d, H, cfg["stride"], p)
        elif m == "axial":
            self.attn = AxialAttention(d, H, cfg["grid_h"], cfg["grid_w"], False, p)
        else:
            self.attn = _MHA(d, H, p, True)
        self.ln2, self.mlp = nn.LayerNorm(d), MLP(d, cfg["mlp_hidden"], p)

    def forward(self, h, padded):
        """padded: (B, T) bool, True = a padding position (its key is hidden), or None."""
        m, x = self.cfg["attention"], self.ln1(h)
        if m in ("linformer", "compressed"):
            a = self.attn(x, key_padding_mask=padded)
        elif m == "axial":
            a = self.attn(x)
        else:
            keys = None if padded is None else ~padded[:, None, None, :]
            pattern = longseq_pattern(m, h.shape[1], self.cfg["window"], self.cfg["sparse"], self.cfg["block"],
                                      self.cfg["window_blocks"], self.cfg["global_blocks"], self.cfg["stride_blocks"],
                                      h.device)
            visible = keys if pattern is None else (pattern if keys is None else keys & pattern)
            a = self.attn(x, visible=visible)
        h = h + a
        return h + self.mlp(self.ln2(h))


class LongSeqClassifier(nn.Module):
    """embed (padding 0) + pos_embed, blocks.i, mean over the valid tokens, norm, head."""

    def __init__(self, vocab=257, max_len=784, classes=10, d_model=64, n_heads=4, n_layers=2, mlp_hidden=128,
                 dropout=0.0, attention="full", window=64, sparse="local-global", block=32, window_blocks=1,
                 global_blocks=1, stride_blocks=4, k=128, stride=4, grid_h=0, grid_w=0):
        super().__init__()
        cfg = dict(max_len=max_len, d_model=d_model, n_heads=n_heads, mlp_hidden=mlp_hidden, dropout=dropout,
                   attention=attention, window=window, sparse=sparse, block=block, window_blocks=window_blocks,
                   global_blocks=global_blocks, stride_blocks=stride_blocks, k=k, stride=stride, grid_h=grid_h,
                   grid_w=grid_w)
        self.embed = nn.Embedding(vocab, d_model, padding_idx=0)
        self.pos_embed = nn.Parameter(torch.randn(1, max_len, d_model) * 0.02)
        self.blocks = nn.ModuleList(LongSeqBlock(cfg) for _ in range(n_layers))
        self.norm, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, classes)

    def forward(self, tokens, lengths=None):
        B, T = tokens.shape
        padded = None if lengths is None else torch.arange(T, device=tokens.device)[None, :] >= lengths[:, None]
        h = self.embed(tokens) + self.pos_embed[:, :T]
        for block in self.blocks:
            h = block(h, padded)
        if padded is None:
            pooled = h.mean(1)
        else:
            pooled = (h * (~padded)[:, :, None].to(h.dtype)).sum(1) / lengths[:, None].to(h.dtype)
        return self.head(self.norm(pooled))
