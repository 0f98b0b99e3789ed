// KVCache: the preallocated cache of nn/attention.h. Decoding through it must give the logits of
// one causal forward over the whole sequence (bottom-right causal alignment), across growths of
// the buffers; the in-place path must allocate nothing once the capacity is there; with grad mode
// on and inputs that require grad, the cache must stay differentiable (cat), so gradients match
// the forward without a cache.
#include <cstdint>
#include <vector>

#include "autograd/autocast.h"
#include "nn/attention.h"
#include "nn/transformer.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

// x (B, T, d) -> logits (B, T, V): two causal pre-LN blocks, a final LayerNorm and a linear head;
// each block takes its own KV cache while decoding.
struct TinyDecoder {
  nn::TransformerBlock b0, b1;
  nn::LayerNorm ln_f;
  nn::Linear head;
  TinyDecoder(DType dt, Generator* g)
      : b0(8, 2, {.mlp_hidden = 16, .causal = true, .dtype = dt, .generator = g}),
        b1(8, 2, {.mlp_hidden = 16, .causal = true, .dtype = dt, .generator = g}), ln_f(Shape{8}, 1e-5, true, dt),
        head(8, 5, true, dt, g) {}
  Tensor forward(const Tensor& x, nn::KVCache* c0 = nullptr, nn::KVCache* c1 = nullptr) {
    Tensor h = b0.forward(x, Tensor(), c0);
    h = b1.forward(h, Tensor(), c1);
    return head.forward(ln_f.forward(h));
  }
};

// Decodes x chunk by chunk through fresh caches of the given capacity; returns the logits joined along T.
Tensor decode(TinyDecoder& m, const Tensor& x, const std::vector<int64_t>& chunks, int64_t capacity,
              std::vector<int64_t>* capacities = nullptr) {
  nn::KVCache c0(capacity), c1(capacity);
  std::vector<Tensor> parts;
  int64_t t = 0;
  for (int64_t n : chunks) {
    parts.push_back(m.forward(x.narrow(1, t, n), &c0, &c1));
    t += n;
    CHECK(c0.length() == t);
    CHECK(c1.length() == t);
    CHECK(c0.k.shape() == Shape{x.size(0), 2, t, 4});  // the views see exactly `length` positions
    CHECK(c1.v.shape() == Shape{x.size(0), 2, t, 4});
    if (capacities) capacities->push_back(c0.capacity());
  }
  return cat(parts, 1);
}

}  // namespace

TEST_CASE("KVCache: decoding a 2-block stack token by token and in chunks equals the full causal forward") {
  for (DType dt : {DType::f64, DType::f32}) {
    CAPTURE(dt);
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    Generator g(21);
    TinyDecoder m(dt, &g);
    Tensor x = randn({2, 7, 8}, dt, &g);
    NoGradGuard no_grad;
    Tensor full = m.forward(x);  // (2, 7, 5)
    for (int64_t capacity : {int64_t(0), int64_t(3), int64_t(16)}) {
      CAPTURE(capacity);
      for (const std::vector<int64_t>& chunks :
           {std::vector<int64_t>(7, 1), std::vector<int64_t>{2, 3, 2}, std::vector<int64_t>{3, 1, 3}}) {
        std::vector<int64_t> caps;
        check_close(decode(m, x, chunks, capacity, &caps), full, tol, tol);
        CHECK(caps.back() >= 7);
        if (capacity == 16) CHECK(caps == std::vector<int64_t>(chunks.size(), 16));  // reserved: never grows
      }
    }
    // one token at a time from an unreserved cache: capacity 1, 2, 4, 4, 8, 8, 8 (doubling)
    std::vector<int64_t> caps;
    decode(m, x, std::vector<int64_t>(7, 1), 0, &caps);
    CHECK(caps == std::vector<int64_t>{1, 2, 4, 4, 8, 8, 8});
  }
}

TEST_CASE("KVCache: under bf16 and fp16 autocast the cache keeps 16-bit keys and values, and decodes as the full forward") {
  Generator g(23);
  TinyDecoder m(DType::f32, &g);
  Tensor x = randn({2, 7, 8}, DType::f32, &g);
  NoGradGuard no_grad;
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    CAPTURE(name(p));
    const DType half = p == Precision::bf16 ? DType::bf16 : DType::f16;
    AutocastGuard autocast(p);
    Tensor full = m.forward(x);  // attention reads k and v rounded to the same format
    for (int64_t capacity : {int64_t(0), int64_t(16)}) {
      CAPTURE(capacity);
      for (const std::vector<int64_t>& chunks : {std::vector<int64_t>(7, 1), std::vector<int64_t>{2, 3, 2}}) {
        // the same products of the same rounded values, summed in another order (the GEMMs' shapes
        // differ): f32 rounding apart
        check_close(decode(m, x, chunks, capacity), full, 1e-5, 1e-4);
      }
    }
    nn::KVCache c0, c1;
    m.forward(x.narrow(1, 0, 3), &c0, &c1);
    CHECK(c0.k.dtype() == half);
    CHECK(c1.v.dtype() == half);
    CHECK(c0.k.nbytes() == size_t(2 * 2 * 3 * 4) * 2);  // (B 2, H 2, 3 positions, hs 4), 2 bytes each
    // appending under another precision than the cache's is refused, naming both
    AutocastGuard f32(Precision::fp32);
    AG_CHECK_ERROR(m.forward(x.narrow(1, 3, 1), &c0, &c1), "KVCache", "kept as f32", name(half));
  }
}

TEST_CASE("scaled_dot_product_attention: 16-bit k and v with an f32 q read as their values") {
  Generator g(29);
  Tensor q = randn({1, 2, 5, 8}, DType::f32, &g), k = randn({1, 2, 9, 8}, DType::f32, &g),
         v = randn({1, 2, 9, 8}, DType::f32, &g);
  for (DType half : {DType::bf16, DType::f16}) {
    CAPTURE(name(half));
    const Tensor kh = k.to(half), vh = v.to(half);
    SdpaOptions o;
    o.causal = true;
    // without autocast: the f32 attention of the widened values
    check_close(scaled_dot_product_attention(q, kh, vh, o).out,
                scaled_dot_product_attention(q, kh.to(DType::f32), vh.to(DType::f32), o).out, 0, 0);
    // under the autocast of their format: q rounded too, the 16-bit kernel, the same bits as
    // rounding all three by hand
    AutocastGuard autocast(half == DType::bf16 ? Precision::bf16 : Precision::fp16);
    const Tensor got = scaled_dot_product_attention(q, kh, vh, o).out;
    AutocastGuard off(Precision::fp32);
    const Tensor qr = half == DType::bf16 ? round_bf16(q) : round_fp16(q);
    check_close(got, scaled_dot_product_attention(qr, kh.to(DType::f32), vh.to(DType::f32), o).out, 0, 0);
    AG_CHECK_ERROR(scaled_dot_product_attention(q, kh, v, o), "scaled_dot_product_attention", "dtypes differ");
  }
}

TEST_CASE("KVCache: views, growth keeps old values, the same tensor as k and v") {
  NoGradGuard no_grad;
  nn::KVCache cache;  // no capacity: the first append sizes it, then it doubles
  CHECK(cache.length() == 0);
  CHECK(cache.capacity() == 0);
  // step k values base + 100 head + 10 position + element (each value tells where it came from); v = -k
  auto step = [](double base, int64_t n) {
    std::vector<double> vals;
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t e = 0; e < 3; ++e) vals.push_back(base + 100 * h + 10 * t + e);
    return from_vector(vals, {1, 2, n, 3});
  };
  std::vector<Tensor> ks;
  auto append = [&](const Tensor& kn) {
    ks.push_back(kn);
    auto [k, v] = cache.append(kn, neg(kn));
    CHECK(k.shape() == Shape{1, 2, cache.length(), 3});
    check_close(k, cat(ks, 2), 0, 0);  // every earlier position, unchanged by the growths
    check_close(v, neg(cat(ks, 2)), 0, 0);
    return k;
  };
  Tensor k2 = append(step(1000, 2));
  CHECK(cache.capacity() == 2);
  Tensor k3 = append(step(2000, 1));  // 3 > 2: grows to 4, copying the 2 old positions once
  CHECK(cache.capacity() == 4);
  const void* buffer = k3.raw_data();
  Tensor k4 = append(step(3000, 1));  // fits: same buffer
  CHECK(cache.capacity() == 4);
  CHECK(k4.raw_data() == buffer);
  Tensor k7 = append(step(4000, 3));  // 7 > 4: max(2 * 4, 7) = 8
  CHECK(cache.capacity() == 8);
  CHECK(k7.raw_data() != buffer);
  // a view returned earlier is untouched by later appends and growths
  check_close(k2, cat({ks[0]}, 2), 0, 0);
  check_close(k4, cat({ks[0], ks[1], ks[2]}, 2), 0, 0);

  // the same tensor as k and v: both buffers get its values
  nn::KVCache same;
  Tensor kv = step(5, 2);
  auto [k, v] = same.append(kv, kv);
  check_close(k, kv, 0, 0);
  check_close(v, kv, 0, 0);
  CHECK(k.raw_data() != v.raw_data());
}

TEST_CASE("KVCache: clear() then reuse, also with another shape") {
  NoGradGuard no_grad;
  Generator g(3);
  nn::KVCache cache(8);
  Tensor a = randn({1, 2, 5, 4}, DType::f32, &g), b = randn({1, 2, 3, 4}, DType::f32, &g);
  const void* buffer = cache.append(a, a).first.raw_data();
  CHECK(cache.capacity() == 8);
  cache.clear();
  CHECK(cache.length() == 0);
  CHECK(!cache.k.defined());
  CHECK(cache.capacity() == 8);  // the buffers are kept
  auto [k, v] = cache.append(b, mul(b, 2.0));
  CHECK(k.raw_data() == buffer);  // reused, not reallocated
  CHECK(cache.length() == 3);
  check_close(k, b, 0, 0);  // only the new sequence: nothing of a
  check_close(v, mul(b, 2.0), 0, 0);
  // a new sequence of another batch size and dtype after clear(): fresh buffers
  cache.clear();
  Tensor c = randn({3, 2, 2, 4}, DType::f64, &g);
  auto [kc, vc] = cache.append(c, c);
  CHECK(kc.shape() == Shape{3, 2, 2, 4});
  CHECK(cache.capacity() == 8);
  check_close(kc, c, 0, 0);
}

TEST_CASE("KVCache: the in-place path allocates nothing once the capacity is there") {
  Generator g(4);
  std::vector<Tensor> steps;
  for (int i = 0; i < 20; ++i) steps.push_back(randn({2, 2, 1, 4}, DType::f32, &g));
  {
    NoGradGuard no_grad;
    nn::KVCache cache(32);
    cache.append(steps[0], steps[0]);  // allocates the two buffers
    const void* kbuf = cache.k.raw_data();
    const void* vbuf = cache.v.raw_data();
    const AllocStats before = alloc_stats();
    for (int i = 1; i < 20; ++i) cache.append(steps[size_t(i)], steps[size_t(i)]);
    const AllocStats after = alloc_stats();
    CHECK(after.system_allocs == before.system_allocs);
    CHECK(after.cache_hits == before.cache_hits);  // no storage at all, not even a cached block
    CHECK(cache.k.raw_data() == kbuf);
    CHECK(cache.v.raw_data() == vbuf);
    check_close(cache.k, cat(steps, 2), 0, 0);
  }
  // contrast: with grad on and inputs that require grad, each append is a cat (a new storage),
  // so the counters above do see an allocation when there is one
  nn::KVCache diff;
  Tensor s = steps[0].detach().set_requires_grad(true);
  diff.append(s, s);
  const AllocStats before = alloc_stats();
  diff.append(s, s);
  const AllocStats after = alloc_stats();
  CHECK(after.system_allocs + after.cache_hits > before.system_allocs + before.cache_hits);
}

TEST_CASE("KVCache: with grad on, decoding through the cache gives the gradients of the full forward") {
  Generator g(5);
  TinyDecoder m(DType::f64, &g);
  Tensor x = leaf64({1, 5, 8}, 6);
  Tensor r = leaf64({1, 5, 5}, 7).detach();  // a random projection: L = sum(r * logits)
  auto grads = [&](const Tensor& logits) {
    x.set_grad(Tensor());
    for (Tensor& p : m.b0.parameters()) p.set_grad(Tensor());
    sum(mul(logits, r)).backward();
    return std::pair{x.grad(), m.b0.attn->qkv->weight.grad()};
  };
  auto [dx_full, dw_full] = grads(m.forward(x));
  REQUIRE(dx_full.defined());
  REQUIRE(dw_full.defined());
  for (int64_t capacity : {int64_t(0), int64_t(8)}) {
    auto [dx, dw] = grads(decode(m, x, {2, 1, 2}, capacity));
    check_close(dx, dx_full, 1e-12, 1e-12);
    check_close(dw, dw_full, 1e-12, 1e-12);
  }

  // gradcheck through a cache in one block: the gradient of x reaches every cached position
  nn::MultiHeadAttention mha(4, 2, {.dtype = DType::f64, .generator = &g});
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        nn::KVCache cache;
        nn::AttentionOptions o;
        o.causal = true;
        o.cache = &cache;
        Tensor a = mha.forward(in[0].narrow(1, 0, 2), o).out;
        Tensor b = mha.forward(in[0].narrow(1, 2, 1), o).out;
        return cat({a, b}, 1);
      },
      {leaf64({1, 3, 4}, 8)});
}

TEST_CASE("KVCache: switching between the differentiable and the in-place path keeps every position") {
  // capacity 0: the in-place append after the cat grows; 16: it would fit, but takes fresh buffers all the same
  for (int64_t capacity : {int64_t(0), int64_t(16)}) {
    CAPTURE(capacity);
    Generator g(9);
    Tensor a = randn({1, 1, 2, 2}, DType::f64, &g), b = leaf64({1, 1, 1, 2}, 10);
    Tensor c = randn({1, 1, 3, 2}, DType::f64, &g);
    nn::KVCache cache(capacity);
    cache.append(a, a);                  // in place (a requires no grad)
    auto [k1, v1] = cache.append(b, b);  // cat: differentiable in b
    CHECK(k1.requires_grad());
    Tensor loss = sum(mul(k1, tensor<double>({1, 2, 3, 4, 5, 6}, {1, 1, 3, 2})));
    {
      NoGradGuard no_grad;
      auto [k2, v2] = cache.append(c, c);  // back in place: the cat result is copied into fresh buffers
      CHECK(!k2.requires_grad());
      check_close(k2, cat({a, b, c}, 2), 0, 0);
      check_close(v2, cat({a, b, c}, 2), 0, 0);
      CHECK(cache.length() == 6);
    }
    // the cat's input (a view of the first buffers) was left untouched, so its backward runs:
    // d loss / d b is w's last row, w = [[1, 2], [3, 4], [5, 6]] -> [5, 6]
    loss.backward();
    check_close(b.grad(), {5, 6}, 0, 0);
    CHECK(cache.capacity() == (capacity == 0 ? 6 : 16));
  }
}

TEST_CASE("KVCache: errors name KVCache and the shapes") {
  NoGradGuard no_grad;
  nn::KVCache cache;
  cache.append(zeros({1, 2, 3, 4}), zeros({1, 2, 3, 4}));
  AG_CHECK_ERROR(cache.append(zeros({2, 2, 1, 4}), zeros({2, 2, 1, 4})), "KVCache", "[2,2,1,4]", "[1,2,3,4]");
  AG_CHECK_ERROR(cache.append(zeros({1, 3, 1, 4}), zeros({1, 3, 1, 4})), "KVCache", "[1,3,1,4]", "[1,2,3,4]");
  AG_CHECK_ERROR(cache.append(zeros({1, 2, 1, 5}), zeros({1, 2, 1, 5})), "KVCache", "[1,2,1,5]", "[1,2,3,4]");
  AG_CHECK_ERROR(cache.append(zeros({1, 2, 1, 4}, DType::f64), zeros({1, 2, 1, 4}, DType::f64)), "KVCache",
                 "[1,2,1,4]", "f64", "[1,2,3,4]", "f32");
  AG_CHECK_ERROR(cache.append(zeros({1, 2, 1, 4}), zeros({1, 2, 2, 4})), "KVCache", "[1,2,1,4]", "[1,2,2,4]");
  AG_CHECK_ERROR(cache.append(zeros({1, 2, 1, 4}), zeros({1, 2, 1, 4}, DType::f64)), "KVCache", "f32", "f64");
  AG_CHECK_ERROR(cache.append(zeros({2, 1, 4}), zeros({2, 1, 4})), "KVCache", "[B, H, T, hs]", "[2,1,4]");
  AG_CHECK_ERROR(nn::KVCache(-1), "KVCache", "capacity", "-1");
  CHECK(cache.length() == 3);  // a refused append leaves the cache as it was
}
