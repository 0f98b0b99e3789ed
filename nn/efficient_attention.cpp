#include "nn/efficient_attention.h"

#include <cmath>
#include <string>
#include <vector>

#include "nn/init.h"

namespace ag::nn {

namespace {

void check_dims(const char* layer, int64_t d_model, int64_t n_heads, double dropout) {
  check(d_model > 0, "{}: d_model must be positive, got {}", layer, d_model);
  check(n_heads > 0, "{}: n_heads must be positive, got {}", layer, n_heads);
  check(d_model % n_heads == 0, "{}: d_model {} must be a multiple of n_heads {}", layer, d_model, n_heads);
  check(dropout >= 0 && dropout < 1, "{}: dropout must be in [0, 1), got {}", layer, dropout);
}

void check_input(const char* layer, const Tensor& x, int64_t d_model) {
  check(x.ndim() == 3 && x.size(2) == d_model, "{}: expected x of shape [B, T, {}], got {}", layer, d_model,
        x.shape());
}

// The options these layers do not take: a KV cache and local windows.
void refuse_cache_window(const char* layer, const AttentionOptions& o) {
  check(o.cache == nullptr, "{}: a KV cache is not supported (option cache)", layer);
  check(o.window < 0, "{}: window attention is not supported (option window = {})", layer, o.window);
}

// 1 at the padded positions, 0 elsewhere: (B, T) in x's dtype and device, or undefined when the
// options ask for no key padding. The masks are checked here, against T.
Tensor padded_positions(const char* layer, const AttentionOptions& o, const Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1);
  const Tensor& len = o.key_padding_lengths;
  const Tensor& mask = o.key_padding_mask;
  check(!(len.defined() && mask.defined()),
        "{}: give key_padding_lengths or key_padding_mask, not both", layer);
  if (len.defined()) {
    check(len.dtype() == DType::i64 && len.ndim() == 1 && len.size(0) == B,
          "{}: key_padding_lengths must be i64 of shape [{}], got {} {}", layer, B, len.dtype(), len.shape());
    for (int64_t n : len.to_vector<int64_t>())
      check(n >= 0 && n <= T, "{}: key_padding_lengths value {} is outside [0, T = {}]", layer, n, T);
    // position t is padded when t >= len[b]
    Tensor t = arange(0, double(T), 1, DType::i64, x.device()).reshape({1, T});
    return ge(t, len.to(x.device()).reshape({B, 1})).to(x.dtype());
  }
  if (mask.defined()) {
    check(mask.dtype() == DType::b8 && mask.shape() == Shape{B, T},
          "{}: key_padding_mask must be b8 of shape [{}, {}], got {} {}", layer, B, T, mask.dtype(), mask.shape());
    return mask.to(x.device()).to(x.dtype());
  }
  return Tensor();
}

// (B, T, d) with the padded positions' rows set to 0 (pad (B, T): 1 = padded), differentiably.
Tensor zero_padded(const Tensor& t, const Tensor& pad) {
  if (!pad.defined()) return t;
  return masked_fill(t, gt(pad, 0.5).unsqueeze(2), 0.0);
}

// dropout in training only; the call's generator, else the layer's
SdpaOptions sdpa_options(const Module& m, double dropout, Generator* gen, const AttentionOptions& call) {
  SdpaOptions s;
  s.dropout = m.is_training() ? dropout : 0.0;
  s.generator = call.generator ? call.generator : gen;
  s.return_weights = call.need_weights;
  return s;
}

// (B, T, d) -> (B, H, T, hs), a view
Tensor split_heads(const Tensor& t, int64_t H, int64_t hs) {
  return t.reshape({t.size(0), t.size(1), H, hs}).transpose(1, 2);
}
// (B, H, T, hs) -> (B, T, H hs)
Tensor merge_heads(const Tensor& t) {
  return t.transpose(1, 2).reshape({t.size(0), t.size(2), t.size(1) * t.size(3)});
}

}  // namespace

// ============================== LinformerAttention ============================================

LinformerAttention::LinformerAttention(int64_t d_model, int64_t n_heads, int64_t max_len, int64_t k,
                                       const Options& options)
    : d_model(d_model), n_heads(n_heads), head_size(n_heads > 0 ? d_model / n_heads : 0), max_len(max_len),
      k(k), options(options) {
  check_dims("LinformerAttention", d_model, n_heads, options.dropout);
  check(max_len > 0, "LinformerAttention: max_len must be positive, got {}", max_len);
  check(k > 0, "LinformerAttention: k (the projected length) must be positive, got {}", k);
  const bool bias = options.bias;
  const DType dtype = options.dtype;
  Generator* gen = options.generator;
  qkv = register_module("qkv", std::make_shared<Linear>(d_model, 3 * d_model, bias, dtype, gen));
  proj = register_module("proj", std::make_shared<Linear>(d_model, d_model, bias, dtype, gen));
  // nn.Linear's weight init for a (k, max_len) weight: U(-1/sqrt(max_len), 1/sqrt(max_len))
  const double bound = 1.0 / std::sqrt(double(max_len));
  E = register_parameter("E", init::uniform({k, max_len}, -bound, bound, dtype, gen));
  F = register_parameter("F", init::uniform({k, max_len}, -bound, bound, dtype, gen));
}

AttentionResult LinformerAttention::forward(const Tensor& x, const AttentionOptions& call) {
  ModuleScope scope(this);
  const char* layer = "LinformerAttention";
  check_input(layer, x, d_model);
  check(!call.causal,
        "LinformerAttention: causal = true is refused: Linformer is not causal by construction (each projected "
        "key mixes every position)");
  refuse_cache_window(layer, call);
  const int64_t T = x.size(1);
  check(T <= max_len, "LinformerAttention: sequence length T = {} exceeds max_len = {}", T, max_len);
  check(T > 0, "LinformerAttention: expected a non-empty sequence, got x of shape {}", x.shape());
  Tensor pad = padded_positions(layer, call, x);

  // (B, T, 3d) -> q, k, v (B, T, d)
  Tensor qkv_out = qkv->forward(x);
  Tensor q = qkv_out.narrow(2, 0, d_model);
  Tensor kk = zero_padded(qkv_out.narrow(2, d_model, d_model), pad);
  Tensor vv = zero_padded(qkv_out.narrow(2, 2 * d_model, d_model), pad);
  // along the sequence: (k, T) @ (B, T, d) -> (B, k, d); the same E, F for every head
  Tensor kp = matmul(E.narrow(1, 0, T), kk);
  Tensor vp = matmul(F.narrow(1, 0, T), vv);
  // per head, over the k projected keys: r.out (B, H, T, hs)
  SdpaResult r = scaled_dot_product_attention(split_heads(q, n_heads, head_size), split_heads(kp, n_heads, head_size),
                                              split_heads(vp, n_heads, head_size),
                                              sdpa_options(*this, options.dropout, options.generator, call));
  return {proj->forward(merge_heads(r.out)), r.weights};
}

// ============================ MemoryCompressedAttention =======================================

MemoryCompressedAttention::MemoryCompressedAttention(int64_t d_model, int64_t n_heads, int64_t stride,
                                                     const Options& options)
    : d_model(d_model), n_heads(n_heads), head_size(n_heads > 0 ? d_model / n_heads : 0), stride(stride),
      options(options) {
  check_dims("MemoryCompressedAttention", d_model, n_heads, options.dropout);
  check(stride > 0, "MemoryCompressedAttention: stride must be positive, got {}", stride);
  const bool bias = options.bias;
  const DType dtype = options.dtype;
  Generator* gen = options.generator;
  qkv = register_module("qkv", std::make_shared<Linear>(d_model, 3 * d_model, bias, dtype, gen));
  compress_k = register_module("compress_k", std::make_shared<Linear>(stride * d_model, d_model, bias, dtype, gen));
  compress_v = register_module("compress_v", std::make_shared<Linear>(stride * d_model, d_model, bias, dtype, gen));
  proj = register_module("proj", std::make_shared<Linear>(d_model, d_model, bias, dtype, gen));
}

AttentionResult MemoryCompressedAttention::forward(const Tensor& x, const AttentionOptions& call) {
  ModuleScope scope(this);
  const char* layer = "MemoryCompressedAttention";
  check_input(layer, x, d_model);
  refuse_cache_window(layer, call);
  const int64_t B = x.size(0), T = x.size(1), s = stride, H = n_heads, hs = head_size;
  check(T > 0, "MemoryCompressedAttention: expected a non-empty sequence, got x of shape {}", x.shape());
  const int64_t Tc = (T + s - 1) / s, end_pad = Tc * s - T;  // compressed length, zero positions at the end
  const Device dev = x.device();
  const DType dt = x.dtype();
  Tensor pad = padded_positions(layer, call, x);  // (B, T) 1 = padded, or undefined

  Tensor qkv_out = qkv->forward(x);
  Tensor q = qkv_out.narrow(2, 0, d_model);
  Tensor kk = zero_padded(qkv_out.narrow(2, d_model, d_model), pad);
  Tensor vv = zero_padded(qkv_out.narrow(2, 2 * d_model, d_model), pad);
  if (end_pad > 0) {
    Tensor z = zeros({B, end_pad, d_model}, dt, dev);
    kk = cat({kk, z}, 1), vv = cat({vv, z}, 1);
  }
  // blocks of s positions side by side: (B, Tc s, d) -> (B, Tc, s d) -> (B, Tc, d)
  Tensor kc = split_heads(compress_k->forward(kk.reshape({B, Tc, s * d_model})), H, hs);  // (B, H, Tc, hs)
  Tensor vc = split_heads(compress_v->forward(vv.reshape({B, Tc, s * d_model})), H, hs);

  // a block is hidden when all its positions are padding (the end positions count as padding)
  Tensor block_hidden;  // (B, Tc) in x's dtype, 1 = hidden, or undefined
  if (pad.defined()) {
    Tensor keep = 1.0 - pad;
    if (end_pad > 0) keep = cat({keep, zeros({B, end_pad}, dt, dev)}, 1);
    block_hidden = eq(sum(keep.reshape({B, Tc, s}), {2}), 0.0).to(dt);
  }

  SdpaOptions o = sdpa_options(*this, options.dropout, options.generator, call);
  if (!call.causal) {
    if (block_hidden.defined()) o.key_padding_mask = gt(block_hidden, 0.5);
    SdpaResult r = scaled_dot_product_attention(split_heads(q, H, hs), kc, vc, o);  // (B, H, T, hs)
    return {proj->forward(merge_heads(r.out)), r.weights};
  }

  // Causal, by folding. Query i sits at i' = i + 1 and falls in group g = floor(i' / s); it may see
  // block j iff (j + 1) s - 1 <= i, i.e. j < g. The G = Tc + 1 groups become the query axis, the s
  // members of a group join the heads (batch) axis, and a dummy key, always hidden, goes first
  // (key j' = j + 1): the fused kernel's causal mask over G x G (j' <= g) is then exactly j < g,
  // and group 0 (queries 0 .. s - 2) sees only the hidden dummy, so it gets zeros.
  const int64_t G = Tc + 1;
  Tensor qh = split_heads(q, H, hs);  // (B, H, T, hs)
  std::vector<Tensor> parts{zeros({B, H, 1, hs}, dt, dev), qh};
  if (G * s - T - 1 > 0) parts.push_back(zeros({B, H, G * s - T - 1, hs}, dt, dev));
  Tensor qpad = cat(parts, 2);
  Tensor qf = qpad.reshape({B, H, G, s, hs}).permute({0, 1, 3, 2, 4}).reshape({B, H * s, G, hs});
  auto fold_kv = [&](const Tensor& t) {  // (B, H, Tc, hs) -> (B, H s, G, hs), the dummy first
    Tensor t1 = cat({zeros({B, H, 1, hs}, dt, dev), t}, 2);
    return t1.unsqueeze(2).expand({B, H, s, G, hs}).reshape({B, H * s, G, hs});
  };
  Tensor hidden = ones({B, 1}, dt, dev);
  hidden = cat({hidden, block_hidden.defined() ? block_hidden : zeros({B, Tc}, dt, dev)}, 1);
  o.key_padding_mask = gt(hidden, 0.5);  // (B, G)
  o.causal = true;
  SdpaResult r = scaled_dot_product_attention(qf, fold_kv(kc), fold_kv(vc), o);  // (B, H s, G, hs)
  auto unfold = [&](const Tensor& t, int64_t n) {  // (B, H s, G, n) -> (B, H, T, n)
    return t.reshape({B, H, s, G, n}).permute({0, 1, 3, 2, 4}).reshape({B, H, G * s, n}).narrow(2, 1, T);
  };
  Tensor out = unfold(r.out, hs);
  Tensor weights = r.weights.defined() ? unfold(r.weights.narrow(3, 1, Tc), Tc) : Tensor();
  return {proj->forward(merge_heads(out)), weights};
}

// ================================== AxialAttention ============================================

AxialAttention::AxialAttention(int64_t d_model, int64_t n_heads, int64_t height, int64_t width,
                               const Options& options)
    : d_model(d_model), n_heads(n_heads), height(height), width(width), options(options) {
  check_dims("AxialAttention", d_model, n_heads, options.dropout);
  check(height > 0 && width > 0, "AxialAttention: the grid height and width must be positive, got height {} width {}",
        height, width);
  const MultiHeadAttention::Options axis{
      .dropout = options.dropout, .bias = options.bias, .dtype = options.dtype, .generator = options.generator};
  row = register_module("row", std::make_shared<MultiHeadAttention>(d_model, n_heads, axis));
  col = register_module("col", std::make_shared<MultiHeadAttention>(d_model, n_heads, axis));
}

Tensor AxialAttention::forward(const Tensor& x) {
  ModuleScope scope(this);
  check(x.ndim() == 3 && x.size(1) == height * width && x.size(2) == d_model,
        "AxialAttention: expected x of shape [B, height * width = {} * {} = {}, {}], got {}", height, width,
        height * width, d_model, x.shape());
  const int64_t B = x.size(0), Hh = height, Ww = width, d = d_model;
  AttentionOptions o;
  o.causal = options.causal;
  // rows: token (r, c) is x[:, r Ww + c]: (B, Hh Ww, d) -> (B Hh, Ww, d), a view
  Tensor z = row->forward(x.reshape({B * Hh, Ww, d}), o).out;
  // columns: (B Hh, Ww, d) -> (B, Hh, Ww, d) -> (B, Ww, Hh, d) -> (B Ww, Hh, d)
  Tensor zc = z.reshape({B, Hh, Ww, d}).transpose(1, 2).reshape({B * Ww, Hh, d});
  Tensor y = col->forward(zc, o).out;
  // back to raster order: (B Ww, Hh, d) -> (B, Ww, Hh, d) -> (B, Hh, Ww, d) -> (B, Hh Ww, d)
  return y.reshape({B, Ww, Hh, d}).transpose(1, 2).reshape({B, Hh * Ww, d});
}

}  // namespace ag::nn
