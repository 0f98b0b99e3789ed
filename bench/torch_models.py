"""PyTorch twins of the sample models in apps/gpt, apps/vit and apps/textclf (model.h), for checks and benchmarks only.

Same parameter names, shapes and math as the C++ models, so a state_dict (a safetensors file)
moves between the two unchanged:

  Block        ln1, attn.qkv, attn.proj, ln2, mlp.fc1, mlp.fc2      pre-LN, exact (erf) GELU
  GPT          wte, wpe, blocks.i, ln_f, head (no bias)             causal
  ViT          patch.proj, patch.cls_token, pos_embed, blocks.i, norm, head
  TextClassifier tok (padding 0), [ngram (padding 0),] pos, blocks.i, norm, head
                                                                    key padding by lengths, masked mean;
                                                                    subword n-grams: a word's vector is tok plus
                                                                    the sum of its n-grams' rows

Attention is written out (q k^T / sqrt(hs), mask, softmax, dropout, @ v) so it runs on any
PyTorch version; with torch >= 2.0 the fused F.scaled_dot_product_attention is used instead
when no weights are requested (use_sdpa=True), which is what a PyTorch user would run.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class Attention(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads, self.hs, self.dropout = heads, d // heads, dropout
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.use_sdpa = HAS_SDPA
        self.weights = None  # (B, H, T, T) of the last forward when keep_weights

    def forward(self, x, causal=False, lengths=None, keep_weights=False):
        B, T, d = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, self.heads, self.hs).permute(2, 0, 3, 1, 4)
        mask = None  # True = may attend
        if causal:
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        if lengths is not None:
            keys = torch.arange(T, device=x.device)[None, :] < lengths[:, None]  # (B, T)
            keys = keys[:, None, None, :]
            mask = keys if mask is None else (mask & keys)
        p = self.dropout if self.training else 0.0
        if self.use_sdpa and not keep_weights:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        else:
            s = (q @ k.transpose(-2, -1)) / math.sqrt(self.hs)
            if mask is not None:
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


class Block(nn.Module):
    def __init__(self, d, heads, hidden, dropout=0.0, causal=False):
        super().__init__()
        self.causal = causal
        self.ln1, self.attn = nn.LayerNorm(d), Attention(d, heads, dropout)
        self.ln2, self.mlp = nn.LayerNorm(d), MLP(d, hidden, dropout)

    def forward(self, x, lengths=None, keep_weights=False):
        x = x + self.attn(self.ln1(x), self.causal, lengths, keep_weights)
        return x + self.mlp(self.ln2(x))


def init_gpt2_style(model, n_layers):
    """As init_gpt2_style in apps/common/gpt2_style.cpp."""
    std_resid = 0.02 / math.sqrt(2 * n_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                resid = name.endswith("attn.proj.weight") or name.endswith("mlp.fc2.weight")
                p.normal_(0.0, std_resid if resid else 0.02)
            elif name.endswith("bias"):
                p.zero_()


class GPT(nn.Module):
    def __init__(self, vocab=96, context=128, d_model=128, n_heads=4, n_layers=4, mlp_hidden=512, dropout=0.0):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, mlp_hidden, dropout, True) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        init_gpt2_style(self, n_layers)

    def forward(self, idx):
        h = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
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


class TextClassifier(nn.Module):
    def __init__(self, vocab=20000, max_len=256, classes=2, d_model=128, n_heads=4, n_layers=2, mlp_hidden=512,
                 dropout=0.1, ngram_buckets=0, ngram_min=2, ngram_max=5, ngrams_per_token=32):
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
        with torch.no_grad():
            self.tok.weight[0].zero_()
            if self.ngram is not None:
                self.ngram.weight[0].zero_()

    def forward(self, tokens, lengths, ngrams=None):
        T = tokens.shape[1]
        e = self.tok(tokens)
        if self.ngram is not None:  # ngrams (B, T, G): the word's vector plus its n-grams' vectors
            e = e + self.ngram(ngrams).sum(2)
        h = e + self.pos.weight[:T]
        for b in self.blocks:
            h = b(h, lengths)
        valid = (torch.arange(T, device=tokens.device)[None, :] < lengths[:, None]).to(h.dtype).unsqueeze(2)
        pooled = (self.norm(h) * valid).sum(1) / lengths.clamp(min=1).to(h.dtype)[:, None]
        return self.head(F.dropout(pooled, self.dropout, self.training))
