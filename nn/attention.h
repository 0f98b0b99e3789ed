#pragma once
// Multi-head attention, as torch.nn.MultiheadAttention(batch_first=True), with grouped-query
// attention as an option (MultiHeadAttention::Options::kv_heads).
//
//   nn::MultiHeadAttention attn(64, 4, {.dropout = 0.1, .kv_heads = 2, .positions = "rope"});
//
//   x (B, Tq, d) [, context (B, Tk, d)]  ->  y (B, Tq, d),   H heads of size hs = d / H
//   [q | k | v] = x Wqkv^T + bqkv         qkv:  Linear(d, d + 2 Hkv hs), one fused projection
//   q           -> (B, H, T, hs)          columns [0, d): a narrow, a reshape and a transpose (views)
//   k, v        -> (B, Hkv, T, hs)        columns [d, d + Hkv hs) and [d + Hkv hs, d + 2 Hkv hs)
//   [q, k       <- rope(q), rope(k)]      with positions "rope" (at the KV cache's offset)
//   o_h         = softmax(q_h k_g^T / sqrt(hs) [+ alibi_h] + mask) v_g,  g = h / (H / Hkv)
//                                         scaled_dot_product_attention (enable_gqa when Hkv < H)
//   y           = concat_h(o_h) Wproj^T + bproj                 proj: Linear(d, d)
// With Hkv = H (the default) qkv.weight is PyTorch's in_proj_weight (rows 0..d-1 make q, d..2d-1
// k, 2d..3d-1 v) and proj is out_proj, so a state_dict maps one-to-one. Grouped-query attention
// (GQA; Hkv = 1 is multi-query attention) gives each group of H / Hkv query heads one key/value
// head, so the k, v projections and the KV cache shrink by H / Hkv. Cross-attention takes q from x
// with the first d rows and k, v from the context with the remaining rows of that same weight.
// Dropout (p) acts on the attention weights, in training only.
// Derived step by step, with the shapes: docs/math/multihead.md
//
// KVCache: for autoregressive decoding. Each step appends the new positions' k, v (B, Hkv, Tnew, hs)
// and attends over everything cached; causal masking is bottom-right aligned (query i of the new
// block sees keys 0 .. Tcached + i), so decoding one token (or a chunk) at a time gives the
// same outputs as one causal forward over the whole sequence. Meant for inference (NoGradGuard).
//
// Preallocated: the keys and values live in two buffers (B, H, capacity, hs). An append copies
// the new positions into the next free slots in place (copy_ into a narrow view) and returns the
// views [0, length) of the buffers, so decoding T tokens copies each position once, O(T) bytes,
// where a cat() per step copies O(T^2). When an append would pass the capacity, the buffers grow
// to max(2 capacity, needed) and the cached positions are copied once. A capacity given at
// construction (say the model's context length) avoids every growth.
//
// Under bf16 or fp16 autocast (autograd/autocast.h) an inference append keeps f32 keys and values
// rounded to that format, as bf16 (f16) tensors: what attention reads of them anyway, in half the
// memory (the fused CPU kernel reads them as they are; elsewhere they are widened, exactly).
//
// Gradients: when grad mode is on and k_new or v_new requires grad, an append is a
// differentiable cat() (k = cat({k, k_new}, 2)), so gradients flow to every appended
// position. The next in-place append copies those positions into fresh buffers, so the in-place
// path never writes into storage a recorded graph holds.
//
// On the CPU, scaled_dot_product_attention reads the views [0, length) where they are (their rows
// are unit-stride), so a decoding step copies nothing it has cached; a cache that cat()s copies
// every cached position at every step. bench/bench_decode times both.
//
// The returned views alias the buffers: they stay valid across appends (which write only the
// slots past them) and growth (which moves to new buffers), but clear() hands the slots back, so
// the next sequence overwrites what a view kept from the previous one.
#include "nn/linear.h"

namespace ag::nn {

struct KVCache {
  Tensor k, v;  // (B, H, length, hs): every position cached so far; undefined while empty

  // capacity: positions to reserve at the first append (0: as many as that append brings, then
  // doubling).
  explicit KVCache(int64_t capacity = 0);

  int64_t length() const { return k.defined() ? k.size(2) : 0; }
  // Positions the buffers hold before the next growth (0 before the first in-place append).
  int64_t capacity() const { return k_buf_.defined() ? k_buf_.size(2) : 0; }
  // Appends k_new, v_new (B, H, Tnew, hs) along T and returns all cached keys and values.
  std::pair<Tensor, Tensor> append(const Tensor& k_new, const Tensor& v_new);
  // Empties the cache; the buffers are kept for the next sequence (same B, H, hs, dtype, device).
  void clear() { k = Tensor(), v = Tensor(), in_buffers_ = false; }

 private:
  int64_t reserve_ = 0;     // capacity asked for at construction
  Tensor k_buf_, v_buf_;    // (B, H, capacity, hs); k, v are their views [0, length) when in_buffers_
  bool in_buffers_ = false; // false after a differentiable append: k, v are cat() results
  // Makes the buffers (of like's B, H, hs and device, of `dtype`) hold at least `needed` positions
  // with k, v copied into [0, length).
  void ensure_capacity(const Tensor& like, DType dtype, int64_t needed);
};

// What one forward call asks of an attention layer (masks, a KV cache, need_weights). What the
// layer is (dropout, bias, heads, positions) is fixed at construction by its own Options.
struct AttentionOptions {
  bool causal = false;
  Tensor key_padding_lengths;  // i64 (B): valid keys per sequence
  Tensor key_padding_mask;     // b8 (B, Tk): true = ignore that key (PyTorch's convention)
  int64_t window = -1;         // >= 0: local attention (see SdpaOptions)
  bool need_weights = false;   // also return the per-head weights (B, H, Tq, Tk)
  KVCache* cache = nullptr;    // self-attention only: append this call's k, v and attend over all
  Generator* generator = nullptr;  // for dropout; null: the module's (see MultiHeadAttention)
  Tensor block_mask;           // b8 (ceil(Tq/bs), ceil(Tk/bs)): a block-sparse pattern, true = kept
                               //   (nn/sparse_patterns.h builds them; see SdpaOptions)
  int64_t block_size = 0;      // bs >= 1 with block_mask
};

// Which keys each query could see: the masking part of AttentionOptions, kept with captured
// weights so that statistics over them leave the hidden keys out (nn/diagnostics.h).
struct AttentionMask {
  bool causal = false;         // bottom-right aligned when Tq < Tk (a KV cache)
  int64_t window = -1;
  Tensor key_padding_lengths;  // i64 (B), or undefined
  Tensor key_padding_mask;     // b8 (B, Tk), true = ignored, or undefined
  Tensor block_mask;           // b8 (ceil(Tq/bs), ceil(Tk/bs)), true = kept, or undefined
  int64_t block_size = 0;      // bs with block_mask
};

// The keys and values of a cross-attention's context, projected once:  k, v (B, Hkv, Tk, hs).
// A decoder that generates token by token attends to the same context (say an image's patch
// tokens) at every step: MultiHeadAttention::context_kv projects it once per context, and each
// step's forward(x, ContextKV) then costs only the queries' projection and the attention itself.
// The gradient flows through k, v into the context as through forward(x, context).
struct ContextKV {
  Tensor k, v;
};

struct AttentionResult {
  Tensor out;      // (B, Tq, d)
  Tensor weights;  // (B, H, Tq, Tk), only with need_weights
};

struct MultiHeadAttention : Module {
  // How a MultiHeadAttention is built, beyond its width and heads. Per-call choices (masks, a KV
  // cache, need_weights) are AttentionOptions, given to forward.
  struct Options {
    double dropout = 0.0;  // on the attention weights, in training only
    bool bias = true;      // qkv and proj have biases (PyTorch's bias)
    int64_t kv_heads = 0;  // key/value heads Hkv, dividing n_heads (0: n_heads, plain multi-head)
    // Positions inside self-attention: "rope" turns q and k by their positions (the op rope, at the
    // offset of the positions a KV cache holds), "alibi" adds ALiBi's biases -m_h |i - j| to the
    // scores (nn/positional.h alibi_slopes), "none": the model adds positions to its inputs, or has
    // none. Either of the first two is relative: the scores depend on i - j only. Cross-attention
    // has no shared position axis and refuses them.
    std::string positions = "none";
    bool rope_interleaved = false;  // rope's pairs (x[2k], x[2k+1]) instead of (x[k], x[k + hs/2])
    double rope_base = 10000;
    DType dtype = DType::f32;        // of the parameters
    Generator* generator = nullptr;  // init and attention dropout (null: the default generator); a
                                     // call's AttentionOptions::generator takes over the dropout
  };

  int64_t d_model, n_heads, head_size, kv_heads;  // kv_heads resolved (never 0)
  Options options;               // as given, with kv_heads resolved
  std::shared_ptr<Linear> qkv;   // d -> d + 2 kv_heads head_size (3d with kv_heads = n_heads)
  std::shared_ptr<Linear> proj;  // d -> d
  Tensor alibi;                  // f32 (H) slopes with positions "alibi", on the cpu (not a parameter)

  MultiHeadAttention(int64_t d_model, int64_t n_heads, const Options& options);
  MultiHeadAttention(int64_t d_model, int64_t n_heads) : MultiHeadAttention(d_model, n_heads, Options{}) {}

  // Self-attention: queries, keys and values all from x (B, T, d).
  // `call`: this call's masks, cache and need_weights.
  AttentionResult forward(const Tensor& x, const AttentionOptions& call = {});
  // Cross-attention: queries from x (B, Tq, d), keys and values from context (B, Tk, d).
  AttentionResult forward(const Tensor& x, const Tensor& context, const AttentionOptions& call = {});
  // The context's keys and values, context (B, Tk, d) -> k, v (B, Hkv, Tk, hs): rows [d, d + Hkv hs)
  // and [d + Hkv hs, d + 2 Hkv hs) of the fused weight, as forward(x, context) computes them.
  ContextKV context_kv(const Tensor& context);
  // Cross-attention over keys and values projected beforehand: forward(x, context) is exactly
  // forward(x, context_kv(context)). The batch of x must equal that of k, v (an expand() of one
  // context's k, v to B rows is a view: many queries over one image cost no copy of it).
  AttentionResult forward(const Tensor& x, const ContextKV& context, const AttentionOptions& call = {});

 private:
  // columns [first, first + heads hs) of t (B, T, *) -> (B, heads, T, hs), a view
  Tensor split_heads(const Tensor& t, int64_t first, int64_t heads) const;
  AttentionResult attend(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& call);
};

// AttentionCapture: while one is alive on this thread, every MultiHeadAttention forward also
// computes its weights (the composed path of scaled_dot_product_attention, whatever need_weights
// says) and appends them here with the module and its mask, in call order. One ordinary forward of
// a whole model then shows every layer's attention (nn/diagnostics.h names the layers from the
// module tree). Captures nest: the innermost one receives. Without one, MultiHeadAttention pays one
// branch on a thread-local pointer.
//
//   nn::AttentionCapture capture;
//   model.forward(x);                       // the weights are detached, the forward is unchanged
//   for (auto& e : capture.entries()) ...   // e.module, e.weights (B, H, Tq, Tk), e.mask
class AttentionCapture {
 public:
  struct Entry {
    const MultiHeadAttention* module;
    Tensor weights;      // (B, H, Tq, Tk), detached; a hidden key's weight is 0
    AttentionMask mask;  // the keys each query could see
  };

  AttentionCapture();   // becomes this thread's capture
  ~AttentionCapture();  // restores the one before
  AttentionCapture(const AttentionCapture&) = delete;
  AttentionCapture& operator=(const AttentionCapture&) = delete;

  const std::vector<Entry>& entries() const { return entries_; }
  void add(Entry e) { entries_.push_back(std::move(e)); }

 private:
  AttentionCapture* prev_;
  std::vector<Entry> entries_;
};

namespace detail {
extern thread_local constinit AttentionCapture* t_attention_capture;  // this thread's, or null
}  // namespace detail

}  // namespace ag::nn
