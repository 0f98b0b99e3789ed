// scaled_dot_product_attention: checks, the fused kernel (core/cpu/attention.cpp) and, when the
// weights are asked for, the path composed from ops that materialises them (also the test
// oracle of the fused kernel). Math: autograd/ops.h.
#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "core/dispatch.h"
#include "core/kernels/attention_mask.h"
#include "core/kernels/dropout_mask.h"

namespace ag {

namespace {

// Calls f.template operator()<T>() with the element type q, k and v are kept in: f32 or f64, or
// bf16 or f16 (autocast's rounded copies on the CPU).
template <class F>
void visit_half_or_floating(const char* op, DType t, F&& f) {
  if (t == DType::bf16) f.template operator()<bf16>();
  else if (t == DType::f16) f.template operator()<f16>();
  else visit_floating(op, t, f);
}

// Visible[b, i, j]: may query i of batch element b see key j? As b8 (B, 1, Tq, Tk), computed on the
// host by the rule the kernels call (core/kernels/attention_mask.h: causal bottom-right aligned,
// window, key padding, block mask).
Tensor visibility(const SdpaOptions& o, int64_t B, int64_t Tq, int64_t Tk, const Tensor& lengths, const Tensor& kmask,
                  const Tensor& blocks) {
  const std::vector<int64_t> len = lengths.defined() ? lengths.to_vector<int64_t>() : std::vector<int64_t>();
  const Tensor km = kmask.defined() ? kmask.to(Device::cpu()).contiguous() : Tensor();
  const Tensor bm = blocks.defined() ? blocks.to(Device::cpu()).contiguous() : Tensor();
  const Visibility rule{Tq, Tk, o.causal, o.window, lengths.defined() ? len.data() : nullptr,
                        km.defined() ? km.data<bool>() : nullptr, bm.defined() ? bm.data<bool>() : nullptr,
                        bm.defined() ? bm.size(1) : 0, bm.defined() ? o.block_size : 1};
  Tensor vis = empty({B, 1, Tq, Tk}, DType::b8);
  bool* out = vis.data<bool>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t j = 0; j < Tk; ++j) out[(b * Tq + i) * Tk + j] = visible(rule, b, i, j);
  return vis;
}

// The fraction of the Tq x Tk (query, key) pairs that a window and a block mask keep, the work the
// kernels do (the FLOP count of nn/summary.h scales by it; causal and padding masks, which depend
// on the batch element or halve the plane, count in full by its convention). 1 without either.
// Reads the block mask where the caller gave it (usually the cpu), not the kernels' device copy.
double kept_pairs(const SdpaOptions& o, int64_t Tq, int64_t Tk) {
  if (o.window < 0 && !o.block_mask.defined()) return 1;
  const Tensor bm = o.block_mask.defined() ? o.block_mask.detach().to(Device::cpu()).contiguous() : Tensor();
  const Visibility rule{Tq, Tk, false, o.window, nullptr, nullptr, bm.defined() ? bm.data<bool>() : nullptr,
                        bm.defined() ? bm.size(1) : 0, bm.defined() ? o.block_size : 1};
  const int64_t bs = rule.block_size;
  double pairs = 0;
  for (int64_t i = 0; i < Tq; ++i) {
    const KeyRange r = key_range(rule, 0, i);
    if (r.empty()) continue;
    if (!rule.block_mask) {
      pairs += double(r.hi - r.lo);
      continue;
    }
    for (int64_t c = r.lo / bs; c <= (r.hi - 1) / bs; ++c)  // the kept blocks' part of the range
      if (rule.block_mask[(i / bs) * rule.block_cols + c])
        pairs += double(std::min(r.hi, (c + 1) * bs) - std::max(r.lo, c * bs));
  }
  return Tq > 0 && Tk > 0 ? pairs / (double(Tq) * double(Tk)) : 1;
}

// ALiBi's bias (core/kernels/attention_mask.h alibi_bias) as a (1, H, Tq, Tk) tensor of `dtype`,
// built on the host from the slopes (H): what the kernels add tile by tile, for the composed path.
Tensor alibi_bias_tensor(const Tensor& slopes, int64_t Tq, int64_t Tk, DType dtype) {
  const std::vector<float> m = slopes.to(Device::cpu()).to_vector<float>();
  const int64_t H = int64_t(m.size());
  std::vector<double> bias(size_t(H * Tq * Tk));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t j = 0; j < Tk; ++j) bias[size_t((h * Tq + i) * Tk + j)] = alibi_bias(m[size_t(h)], Tq, Tk, i, j);
  return from_vector<double>(bias, {1, H, Tq, Tk}).to(dtype);
}

// x as it is; its gradient read rounded to p (pw::round_operand) as it flows back: the composed
// path's form of AttentionGeom::grad_operands. fp32: x itself.
Tensor gradient_rounded(const Tensor& x, Precision p) {
  if (p == Precision::fp32 || !x.requires_grad()) return x;
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  y.copy_(x.detach());
  record("scaled_dot_product_attention", {x}, y, [p](const Tensor& g) { return std::vector{round_operand(g, p)}; });
  return y;
}

// The composed path: S = scale Q K^T (+ the ALiBi bias), masked, softmax, dropout, @ V. A row with
// no visible key is left unmasked for the softmax (so no NaN enters forward or backward) and
// zeroed afterwards. grads: autocast's rounding of the gradients that enter the two products, dO
// and dS (AttentionGeom::grad_operands), fp32 for none.
// snippet-begin: attention-composed
SdpaResult attention_composed(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& o, double scale,
                              const Tensor& visible, Precision grads) {
  Tensor hidden = eq(visible, scalar_tensor(0, DType::b8, q.device()));   // (B,1,Tq,Tk)
  Tensor empty_row = eq(sum(visible.to(DType::i64), {-1}, true), 0.0);  // (B,1,Tq,1): nothing visible
  Tensor s = gradient_rounded(mul(matmul(q, k.mT()), scale), grads);
  if (o.alibi_slopes.defined())
    s = add(s, alibi_bias_tensor(o.alibi_slopes, q.size(2), k.size(2), q.dtype()).to(q.device()));
  Tensor hide = where(empty_row, scalar_tensor(0, DType::b8, q.device()), hidden);
  Tensor w = softmax(masked_fill(s, hide, -std::numeric_limits<double>::infinity()), -1);
  w = where(empty_row, zeros({}, w.dtype(), w.device()), w);
  Tensor wd = o.dropout > 0 ? dropout(w, o.dropout, true, o.generator) : w;
  return {gradient_rounded(matmul(wd, v), grads), w};
}
// snippet-end: attention-composed

}  // namespace

Tensor rope(const Tensor& x, int64_t offset, bool interleaved, double base, Site site) {
  const CallSite at("rope", site);
  check(is_floating(x.dtype()), "rope: expected an f32 or f64 input, got {} (shape {})", x.dtype(), x.shape());
  check(x.ndim() >= 2 && x.size(-1) % 2 == 0 && x.size(-1) > 0,
        "rope: expected x of shape [..., T, D] with D even, got {}", x.shape());
  check(offset >= 0, "rope: offset must be >= 0, got {}", offset);
  check(base > 1 && std::isfinite(base), "rope: base must be a finite number > 1, got {}", base);
  const int64_t D = x.size(-1), Tn = x.size(-2), R = Tn > 0 ? x.numel() / (Tn * D) : 0;
  Tensor xc = x.detach().contiguous(), y = empty(x.shape(), x.dtype(), x.device());
  visit_floating("rope", x.dtype(), [&]<class T>() {
    KERNEL(x.device(), rope_forward<T>, y.data<T>(), xc.data<T>(), R, Tn, D, offset, base, interleaved, false);
  });
  record("rope", {x}, y, [R, Tn, D, offset, base, interleaved](const Tensor& g) {  // saves nothing
    Tensor gc = g.contiguous(), dx = empty(g.shape(), g.dtype(), g.device());
    visit_floating("rope", g.dtype(), [&]<class T>() {
      KERNEL(g.device(), rope_forward<T>, dx.data<T>(), gc.data<T>(), R, Tn, D, offset, base, interleaved, true);
    });
    return std::vector{dx};
  });
  return y;
}

namespace {

// The run of storage that q, k and v (f32 views of one storage, nonnegative strides) tile, as the
// heads cut from one fused QKV projection's output do: from the first element any of them reads to
// the last, when their element counts add up to its length (so, when none overlaps another, it
// holds no element outside them). As a 1-D view of that run; undefined otherwise (other storages,
// a gap, a negative stride, 16-bit k and v). Correct either way: each is read back as a view of
// the run's cast with its own offset and strides; the count only keeps the cast from copying more
// than they hold.
Tensor qkv_span(const Tensor& q, const Tensor& k, const Tensor& v) {
  int64_t lo = INT64_MAX, hi = 0, total = 0;
  for (const Tensor* x : {&q, &k, &v}) {
    if (x->dtype() != DType::f32 || x->impl().storage != q.impl().storage || x->numel() == 0) return Tensor();
    int64_t end = x->offset() + 1;  // one past its last element
    for (int d = 0; d < x->ndim(); ++d) {
      if (x->stride(d) < 0) return Tensor();
      end += (x->size(d) - 1) * x->stride(d);
    }
    lo = std::min(lo, x->offset()), hi = std::max(hi, end), total += x->numel();
  }
  if (hi - lo != total) return Tensor();
  return as_strided(q, {total}, {1}, lo);
}

// scaled_dot_product_attention, whose gradients entering the products are read rounded to `grads`
// (fp32: as they are): autocast's form of it, once q, k and v are rounded.
SdpaResult attention(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& o, Site site,
                     Precision grads) {
  const CallSite at("scaled_dot_product_attention", site);
  const char* op = "scaled_dot_product_attention";
  check(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4,
        "{}: expected q, k, v of 4 dims [batch, heads, T, d], got {}, {}, {}", op, q.shape(), k.shape(), v.shape());
  // k and v may be 16-bit (a KV cache under autocast, nn::KVCache) with an f32 q: read as the
  // values they hold, by the 16-bit kernel where autocast rounds to their format on the CPU, else
  // widened (exactly) to f32 first.
  const bool half_kv = is_half(k.dtype()) && k.dtype() == v.dtype() && q.dtype() == DType::f32;
  check(half_kv || (q.dtype() == k.dtype() && q.dtype() == v.dtype()),
        "{}: q, k, v dtypes differ ({}, {}, {}); 16-bit k and v (both bf16 or both f16) take an f32 q", op,
        q.dtype(), k.dtype(), v.dtype());
  check(is_floating(q.dtype()), "{}: expected f32 or f64, got {}", op, q.dtype());
  check(q.device() == k.device() && q.device() == v.device(), "{}: q, k, v on different devices ({}, {}, {})", op,
        q.device(), k.device(), v.device());
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3), Tk = k.size(2), Dv = v.size(3);
  const int64_t Hkv = k.size(1);
  check(k.size(0) == B && k.size(3) == D, "{}: k of shape {} does not match q of shape {} (batch and d must agree)",
        op, k.shape(), q.shape());
  if (o.enable_gqa)
    check(Hkv >= 1 && H % Hkv == 0,
          "{}: with enable_gqa the key/value heads ({}) must divide the query heads ({}), got q {} and k {}", op, Hkv,
          H, q.shape(), k.shape());
  else
    check(Hkv == H, "{}: k of shape {} does not match q of shape {} (heads must agree; fewer key/value heads need "
                    "enable_gqa)", op, k.shape(), q.shape());
  check(v.size(0) == B && v.size(1) == Hkv && v.size(2) == Tk,
        "{}: v of shape {} does not match k of shape {} (batch, heads and T must agree)", op, v.shape(), k.shape());
  const int64_t G = H / Hkv;  // query heads per key/value head
  check(!o.causal || Tq <= Tk, "{}: causal attention needs Tq <= Tk, got Tq {} and Tk {}", op, Tq, Tk);
  check(o.dropout >= 0 && o.dropout < 1, "{}: dropout must be in [0, 1), got {}", op, o.dropout);
  check(!(o.key_padding_lengths.defined() && o.key_padding_mask.defined()),
        "{}: give key_padding_lengths or key_padding_mask, not both", op);
  Tensor lengths, kmask;
  if (o.key_padding_lengths.defined()) {
    lengths = o.key_padding_lengths.detach().contiguous();
    check(lengths.dtype() == DType::i64 && lengths.ndim() == 1 && lengths.size(0) == B,
          "{}: key_padding_lengths must be i64 of shape [{}], got {} {}", op, B, lengths.dtype(), lengths.shape());
    for (int64_t n : lengths.to_vector<int64_t>())
      check(n >= 0 && n <= Tk, "{}: key_padding_lengths value {} is outside [0, Tk = {}]", op, n, Tk);
  }
  if (o.key_padding_mask.defined()) {
    kmask = o.key_padding_mask.detach().contiguous();
    check(kmask.dtype() == DType::b8 && kmask.shape() == Shape{B, Tk},
          "{}: key_padding_mask must be b8 of shape [{}, {}] (true = ignore the key), got {} {}", op, B, Tk,
          kmask.dtype(), kmask.shape());
  }
  Tensor blocks;  // the block mask on q's device, where the kernels read it
  if (o.block_mask.defined()) {
    const int64_t bs = o.block_size;
    check(bs >= 1, "{}: block_size must be >= 1 with a block_mask, got {}", op, bs);
    const int64_t rows = (Tq + bs - 1) / bs, cols = (Tk + bs - 1) / bs;
    check(o.block_mask.dtype() == DType::b8 && o.block_mask.shape() == Shape{rows, cols},
          "{}: block_mask must be b8 of shape [{}, {}] (ceil(Tq / block_size), ceil(Tk / block_size) for Tq {}, "
          "Tk {}, block_size {}), got {} {}",
          op, rows, cols, Tq, Tk, bs, o.block_mask.dtype(), o.block_mask.shape());
    check(o.block_mask.device() == q.device() || o.block_mask.device() == Device::cpu(),
          "{}: block_mask is on {} but q on {} (give it on the cpu or on q's device)", op, o.block_mask.device(),
          q.device());
    blocks = o.block_mask.detach().to(q.device()).contiguous();
  }
  Tensor slopes;  // ALiBi's, f32 on q's device
  if (o.alibi_slopes.defined()) {
    check(o.alibi_slopes.dtype() == DType::f32 && o.alibi_slopes.shape() == Shape{H},
          "{}: alibi_slopes must be f32 of shape [{}] (one slope per query head), got {} {}", op, H,
          o.alibi_slopes.dtype(), o.alibi_slopes.shape());
    check(o.alibi_slopes.device() == q.device() || o.alibi_slopes.device() == Device::cpu(),
          "{}: alibi_slopes is on {} but q on {} (give it on the cpu or on q's device)", op, o.alibi_slopes.device(),
          q.device());
    if (o.alibi_slopes.device() == Device::cpu())  // (slopes on the GPU are not copied back to look)
      for (float m : o.alibi_slopes.contiguous().to_vector<float>())
        check(std::isfinite(m), "{}: alibi_slopes holds {}, expected finite slopes", op, m);
    slopes = o.alibi_slopes.detach().to(q.device()).contiguous();
  }
  // autocast (autograd/autocast.h): q, k and v rounded to bf16 or fp16 (straight-through
  // gradients), and in backward the gradients that enter the products, dO and dS, rounded too
  // (AttentionGeom::grad_operands), as matmul's backward reads its incoming gradient; the rest in
  // f32, so the fused and the composed path compute the same function. The fused CPU kernel keeps
  // the rounded q, k, v in 16 bits (`half`: attention_forward_16, half the memory of f32 copies);
  // elsewhere they are rounded by round_operand and kept in f32.
  const Precision p = autocast_operands(q.dtype());
  const bool fused_16 = p != Precision::fp32 && q.device().is_cpu() && !o.return_weights;
  const DType half = fused_16 ? stored_dtype(p) : DType::f32;
  if (fused_16) grads = p;
  if (half_kv && k.dtype() != half)  // a 16-bit k, v the 16-bit kernel does not read as it is
    return attention(q, cast(k.detach(), DType::f32), cast(v.detach(), DType::f32), o, site, grads);
  if (p != Precision::fp32 && !fused_16) {
    AutocastGuard f32(Precision::fp32);
    return attention(round_operand(q, p), round_operand(k, p), round_operand(v, p), o, site, p);
  }
  const double scale = o.scale > 0 ? o.scale : 1.0 / std::sqrt(double(D));

  if (o.return_weights) {  // the visibility is built on the host, then moved to q's device
    // grouped-query: each key/value head repeated for the G query heads that read it
    auto per_query_head = [&](const Tensor& t) {
      return G == 1 ? t : reshape(expand(unsqueeze(t, 2), {B, Hkv, G, Tk, t.size(3)}), {B, H, Tk, t.size(3)});
    };
    return attention_composed(q, per_query_head(k), per_query_head(v), o, scale,
                              visibility(o, B, Tq, Tk, lengths, kmask, blocks).to(q.device()), grads);
  }

  // q, k, v are read where they are when their rows are unit-stride (the heads of a fused QKV
  // projection, a KV cache's first positions): no copy. Anything else is copied once.
  auto readable = [](const Tensor& t, cpu::Strides& s) {
    Tensor r = t.detach();
    if (r.stride(3) != 1) r = r.contiguous();
    s = {r.stride(0), r.stride(1), r.stride(2)};
    return r;
  };
  cpu::AttentionGeom g;
  Tensor qc = readable(q, g.q), kc = readable(k, g.k), vc = readable(v, g.v);
  if (half != DType::f32) {  // the 16-bit copies; a 16-bit k, v as it is
    if (Tensor span = qkv_span(qc, kc, vc); span.defined()) {
      // q, k, v tile one run of storage (the heads of a fused QKV projection): that run is cast
      // once, as a flat copy, and each is read as a view of the copy with its own strides: one
      // flat cast is cheaper than three casts by rows of D strided values
      // (docs/benchmarks.md, "bf16 on the CPU")
      const Tensor run16 = cast(span, half);
      auto view = [&](const Tensor& t, cpu::Strides& st) {
        st = {t.stride(0), t.stride(1), t.stride(2)};
        return as_strided(run16, t.shape(), t.strides(), t.offset() - span.offset());
      };
      qc = view(qc, g.q), kc = view(kc, g.k), vc = view(vc, g.v);
    } else {  // contiguous copies (default Strides)
      qc = cast(qc, half), g.q = cpu::Strides{};
      if (kc.dtype() != half) kc = cast(kc, half), g.k = cpu::Strides{};
      if (vc.dtype() != half) vc = cast(vc, half), g.v = cpu::Strides{};
    }
  }
  Tensor out = empty({B, H, Tq, Dv}, q.dtype(), q.device()), lse = empty({B, H, Tq}, q.dtype(), q.device());
  g.BH = B * H, g.H = H, g.G = G, g.Tq = Tq, g.Tk = Tk, g.D = D, g.Dv = Dv, g.scale = scale;
  g.causal = o.causal, g.window = o.window, g.grad_operands = grads;
  g.alibi = slopes.defined() ? slopes.data<float>() : nullptr;
  g.lengths = lengths.defined() ? lengths.data<int64_t>() : nullptr;
  g.key_mask = kmask.defined() ? kmask.data<bool>() : nullptr;
  if (blocks.defined())
    g.block_mask = blocks.data<bool>(), g.block_rows = blocks.size(0), g.block_cols = blocks.size(1),
    g.block_size = o.block_size;
  if (o.dropout > 0) {  // the same Philox elements ag::dropout would use on the (B, H, Tq, Tk) weights
    Generator& gen = o.generator ? *o.generator : default_generator();
    g.dropout = o.dropout, g.seed = gen.seed(), g.offset = gen.advance(dropout_blocks(B * H * Tq * Tk));
  }
  visit_half_or_floating(op, qc.dtype(), [&]<class In>() {
    if constexpr (is_half_v<In>) {
      const detail::KernelScope scope("attention_forward_16", q.device(), typeid(g));
      cpu::attention_forward_16<In>(out.data<float>(), lse.data<float>(), qc.data<In>(), kc.data<In>(), vc.data<In>(), g);
    } else {
      KERNEL(q.device(), attention_forward<In>, out.data<In>(), lse.data<In>(), qc.data<In>(), kc.data<In>(),
             vc.data<In>(), g);
    }
  });
  // saves q, k, v, out and lse (O(T) per row), and the masks and slopes the geometry points into
  record(op, {q, k, v}, out, [qc, kc, vc, o_ = out.detach(), lse, lengths, kmask, blocks, slopes,
                              g](const Tensor& dout) {
    // contiguous; dk and dv per query head (B, H, Tk, .), each group summed below when G > 1
    const int64_t B = g.BH / g.H, Tk = g.Tk;
    const DType gt = o_.dtype();  // of the gradients: f32 when q, k, v are kept in 16 bits
    // dO as the products read it (autocast: rounded, AttentionGeom::grad_operands; D_i too)
    Tensor gc = g.grad_operands == Precision::fp32 ? dout.contiguous() : round_operand(dout.contiguous(), g.grad_operands);
    Tensor dq = empty(qc.shape(), gt, qc.device()), dk = empty({B, g.H, Tk, g.D}, gt, qc.device()),
           dv = empty({B, g.H, Tk, g.Dv}, gt, qc.device());  // written by the kernel
    visit_half_or_floating("scaled_dot_product_attention", qc.dtype(), [&]<class In>() {
      if constexpr (is_half_v<In>) {
        const detail::KernelScope scope("attention_backward_16", qc.device(), typeid(g));
        cpu::attention_backward_16<In>(dq.data<float>(), dk.data<float>(), dv.data<float>(), gc.data<float>(),
                                       qc.data<In>(), kc.data<In>(), vc.data<In>(), o_.data<float>(),
                                       lse.data<float>(), g);
      } else {
        KERNEL(qc.device(), attention_backward<In>, dq.data<In>(), dk.data<In>(), dv.data<In>(), gc.data<In>(),
               qc.data<In>(), kc.data<In>(), vc.data<In>(), o_.data<In>(), lse.data<In>(), g);
      }
    });
    if (g.G > 1) {
      const int64_t Hkv = g.H / g.G;
      dk = sum(dk.view({B, Hkv, g.G, Tk, g.D}), {2});
      dv = sum(dv.view({B, Hkv, g.G, Tk, g.Dv}), {2});
    }
    return std::vector{dq, dk, dv};
  }, OutputCheck::finite, needs_grad({q, k, v}) ? kept_pairs(o, Tq, Tk) : 1);
  return {out, Tensor()};
}

}  // namespace

SdpaResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& o, Site site) {
  return attention(q, k, v, o, site, Precision::fp32);
}

}  // namespace ag
