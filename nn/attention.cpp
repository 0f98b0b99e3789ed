#include "nn/attention.h"

#include <algorithm>
#include <tuple>

#include "autograd/autocast.h"
#include "nn/positional.h"

namespace ag::nn {

KVCache::KVCache(int64_t capacity) : reserve_(capacity) {
  check(capacity >= 0, "KVCache: capacity must be >= 0, got {}", capacity);
}

void KVCache::ensure_capacity(const Tensor& like, DType dtype, int64_t needed) {
  const int64_t L = length();
  // buffers of another geometry (a new sequence after clear(), L == 0) are dropped
  const bool same = k_buf_.defined() && k_buf_.size(0) == like.size(0) && k_buf_.size(1) == like.size(1) &&
                    k_buf_.size(3) == like.size(3) && k_buf_.dtype() == dtype &&
                    k_buf_.device() == like.device();
  const bool fits = same && k_buf_.size(2) >= needed;
  if (fits && (in_buffers_ || L == 0)) return;
  // Grow geometrically, so decoding T tokens grows log2(T) times and copies O(T) positions in all.
  // After a differentiable append (k, v are cat() results) take fresh buffers even when the old
  // ones fit: the recorded cat() has a view of them as input, and its backward refuses to run
  // when that storage was written since.
  const int64_t cap = fits ? k_buf_.size(2) : std::max({needed, reserve_, same ? 2 * k_buf_.size(2) : int64_t(0)});
  const Shape shape{like.size(0), like.size(1), cap, like.size(3)};
  Tensor kb = empty(shape, dtype, like.device()), vb = empty(shape, dtype, like.device());
  if (L > 0) kb.narrow(2, 0, L).copy_(k), vb.narrow(2, 0, L).copy_(v);  // the one copy of the old positions
  k_buf_ = kb, v_buf_ = vb;
}

std::pair<Tensor, Tensor> KVCache::append(const Tensor& k_new, const Tensor& v_new) {
  check(k_new.ndim() == 4 && k_new.shape() == v_new.shape(),
        "KVCache: expected k and v of one shape [B, H, T, hs], got {} and {}", k_new.shape(), v_new.shape());
  check(k_new.dtype() == v_new.dtype() && k_new.device() == v_new.device(),
        "KVCache: k {} is {} on {} but v {} is {} on {}", k_new.shape(), k_new.dtype(), k_new.device(),
        v_new.shape(), v_new.dtype(), v_new.device());
  const bool differentiable = grad_enabled() && (k_new.requires_grad() || v_new.requires_grad());
  // what the cache holds: under autocast (inference) the 16-bit rounding attention reads
  const Precision p = differentiable ? Precision::fp32 : autocast_operands(k_new.dtype());
  const DType stored = stored_dtype(p, k_new.dtype());
  if (k.defined())
    check(k_new.size(0) == k.size(0) && k_new.size(1) == k.size(1) && k_new.size(3) == k.size(3) &&
              stored == k.dtype() && k_new.device() == k.device(),
          "KVCache: new keys {} ({} on {}, kept as {}) do not match the cached {} ({} on {}) in B, H, hs, dtype or "
          "device",
          k_new.shape(), k_new.dtype(), k_new.device(), name(stored), k.shape(), k.dtype(), k.device());
  const int64_t L = length(), Tnew = k_new.size(2);

  if (differentiable) {
    // training through the cache: the differentiable cat() (a copy of every position per step)
    if (k.defined()) k = cat({k, k_new}, 2), v = cat({v, v_new}, 2);
    else k = k_new, v = v_new;
    in_buffers_ = false;
    return {k, v};
  }
  // inference: write the new positions into slots [L, L + Tnew) and return views [0, L + Tnew)
  ensure_capacity(k_new, stored, L + Tnew);
  k_buf_.narrow(2, L, Tnew).copy_(k_new);  // converts to the buffers' dtype
  v_buf_.narrow(2, L, Tnew).copy_(v_new);
  k = k_buf_.narrow(2, 0, L + Tnew), v = v_buf_.narrow(2, 0, L + Tnew);
  in_buffers_ = true;
  return {k, v};
}

thread_local constinit AttentionCapture* detail::t_attention_capture = nullptr;

AttentionCapture::AttentionCapture() : prev_(detail::t_attention_capture) { detail::t_attention_capture = this; }
AttentionCapture::~AttentionCapture() { detail::t_attention_capture = prev_; }

MultiHeadAttention::MultiHeadAttention(int64_t d_model, int64_t n_heads, const Options& options)
    : d_model(d_model), n_heads(n_heads), head_size(n_heads > 0 ? d_model / n_heads : 0),
      kv_heads(options.kv_heads == 0 ? n_heads : options.kv_heads), options(options) {
  check(d_model > 0 && n_heads > 0 && d_model % n_heads == 0,
        "MultiHeadAttention: d_model {} must be a positive multiple of n_heads {}", d_model, n_heads);
  check(kv_heads > 0 && n_heads % kv_heads == 0,
        "MultiHeadAttention: kv_heads {} must divide n_heads {} (0: n_heads)", options.kv_heads, n_heads);
  check(options.dropout >= 0 && options.dropout < 1, "MultiHeadAttention: dropout must be in [0, 1), got {}",
        options.dropout);
  check(options.positions == "none" || options.positions == "rope" || options.positions == "alibi",
        "MultiHeadAttention: positions '{}': expected none, rope or alibi", options.positions);
  check(options.positions != "rope" || head_size % 2 == 0,
        "MultiHeadAttention: rope turns pairs of a head's dims, so the head size must be even, got {}", head_size);
  check(options.rope_base > 1, "MultiHeadAttention: rope_base must be > 1, got {}", options.rope_base);
  this->options.kv_heads = kv_heads;
  if (options.positions == "alibi") alibi = alibi_slopes(n_heads);
  qkv = register_module("qkv", std::make_shared<Linear>(d_model, d_model + 2 * kv_heads * head_size, options.bias,
                                                        options.dtype, options.generator));
  proj = register_module("proj",
                         std::make_shared<Linear>(d_model, d_model, options.bias, options.dtype, options.generator));
}

Tensor MultiHeadAttention::split_heads(const Tensor& t, int64_t first, int64_t heads) const {
  return t.narrow(2, first, heads * head_size).reshape({t.size(0), t.size(1), heads, head_size}).transpose(1, 2);
}

AttentionResult MultiHeadAttention::attend(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const AttentionOptions& call) {
  SdpaOptions o;
  o.causal = call.causal;
  o.key_padding_lengths = call.key_padding_lengths;
  o.key_padding_mask = call.key_padding_mask;
  o.window = call.window;
  o.block_mask = call.block_mask, o.block_size = call.block_size;
  o.dropout = is_training() ? options.dropout : 0.0;
  o.enable_gqa = kv_heads != n_heads;
  o.alibi_slopes = alibi;
  o.generator = call.generator ? call.generator : options.generator;
  AttentionCapture* capture = detail::t_attention_capture;
  o.return_weights = call.need_weights || capture != nullptr;
  SdpaResult r = scaled_dot_product_attention(q, k, v, o);  // (B, H, Tq, hs)
  if (capture)
    capture->add({this, r.weights.detach(),
                  {call.causal, call.window, call.key_padding_lengths, call.key_padding_mask,
                   call.block_mask, call.block_size}});
  // (B, H, Tq, hs) -> (B, Tq, H, hs) -> (B, Tq, d): the heads side by side, then the output projection
  const int64_t B = r.out.size(0), Tq = r.out.size(2);
  Tensor y = r.out.transpose(1, 2).reshape({B, Tq, d_model});
  return {proj->forward(y), call.need_weights ? r.weights : Tensor()};
}

AttentionResult MultiHeadAttention::forward(const Tensor& x, const AttentionOptions& call) {
  ModuleScope scope(this);
  check(x.ndim() == 3 && x.size(2) == d_model, "MultiHeadAttention: expected x of shape [B, T, {}], got {}",
        d_model, x.shape());
  // (B, T, d + 2 Hkv hs): q, k, v are views of one projection
  const Tensor p = qkv->forward(x);
  const int64_t kvd = kv_heads * head_size;
  Tensor q = split_heads(p, 0, n_heads), k = split_heads(p, d_model, kv_heads),
         v = split_heads(p, d_model + kvd, kv_heads);
  if (options.positions == "rope") {  // the new rows stand after what the cache holds
    const int64_t offset = call.cache ? call.cache->length() : 0;
    q = rope(q, offset, options.rope_interleaved, options.rope_base);
    k = rope(k, offset, options.rope_interleaved, options.rope_base);
  }
  if (call.cache != nullptr) std::tie(k, v) = call.cache->append(k, v);
  return attend(q, k, v, call);
}

AttentionResult MultiHeadAttention::forward(const Tensor& x, const Tensor& context, const AttentionOptions& call) {
  ModuleScope scope(this);
  check(x.ndim() == 3 && x.size(2) == d_model, "MultiHeadAttention: expected x of shape [B, Tq, {}], got {}",
        d_model, x.shape());
  check(context.ndim() == 3 && context.size(2) == d_model && context.size(0) == x.size(0),
        "MultiHeadAttention: expected context of shape [{}, Tk, {}], got {}", x.size(0), d_model, context.shape());
  return forward(x, context_kv(context), call);  // the context's k, v, then the queries over them
}

ContextKV MultiHeadAttention::context_kv(const Tensor& context) {
  ModuleScope scope(this);
  check(context.ndim() == 3 && context.size(2) == d_model,
        "MultiHeadAttention: expected context of shape [B, Tk, {}], got {}", d_model, context.shape());
  // k and v use the rows after the first d of the fused weight: PyTorch's in_proj split
  const Tensor& W = qkv->weight;
  const Tensor& b = qkv->bias;
  const int64_t kvd = kv_heads * head_size;
  Tensor kv = linear(context, W.narrow(0, d_model, 2 * kvd), b.defined() ? b.narrow(0, d_model, 2 * kvd) : Tensor());
  return {split_heads(kv, 0, kv_heads), split_heads(kv, kvd, kv_heads)};  // (B, Hkv, Tk, hs) each, views
}

AttentionResult MultiHeadAttention::forward(const Tensor& x, const ContextKV& context, const AttentionOptions& call) {
  ModuleScope scope(this);
  check(x.ndim() == 3 && x.size(2) == d_model, "MultiHeadAttention: expected x of shape [B, Tq, {}], got {}",
        d_model, x.shape());
  const Tensor &k = context.k, &v = context.v;
  check(k.defined() && v.defined() && k.ndim() == 4 && k.shape() == v.shape() && k.size(0) == x.size(0) &&
            k.size(1) == kv_heads && k.size(3) == head_size,
        "MultiHeadAttention: expected context keys and values of shape [{}, {}, Tk, {}], got {} and {}", x.size(0),
        kv_heads, head_size, k.defined() ? k.shape() : Shape{}, v.defined() ? v.shape() : Shape{});
  check(call.cache == nullptr, "MultiHeadAttention: a KV cache is for self-attention, not cross-attention");
  check(options.positions == "none",
        "MultiHeadAttention: positions '{}' are for self-attention; queries and a context have no shared positions",
        options.positions);
  // q uses rows [0, d) of the fused weight
  const Tensor& W = qkv->weight;
  const Tensor& b = qkv->bias;
  Tensor q = linear(x, W.narrow(0, 0, d_model), b.defined() ? b.narrow(0, 0, d_model) : Tensor());
  return attend(split_heads(q, 0, n_heads), k, v, call);
}

}  // namespace ag::nn
