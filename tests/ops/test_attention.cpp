// scaled_dot_product_attention: the fused kernel against the composed path (matmul, masked
// softmax, matmul: ops verified against PyTorch), gradchecks, masks, dropout, memory and errors.
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

struct QKV {
  Tensor q, k, v;
};
QKV make_qkv(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, DType dt, uint64_t seed) {
  Generator g(seed);
  auto leaf = [&](Shape s) { return randn(s, dt, &g).set_requires_grad(true); };
  return {leaf({B, H, Tq, D}), leaf({B, H, Tk, D}), leaf({B, H, Tk, Dv})};
}

// Runs fused and composed forward + backward on the same inputs (through a fixed projection r of
// the output) and compares outputs and all three gradients.
void compare_paths(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, SdpaOptions o, DType dt,
                   double tol) {
  QKV a = make_qkv(B, H, Tq, Tk, D, Dv, dt, 7), b = make_qkv(B, H, Tq, Tk, D, Dv, dt, 7);
  Generator gr(99);
  Tensor r = randn({B, H, Tq, Dv}, dt, &gr);
  Generator g1(5), g2(5);
  SdpaOptions of = o, oc = o;
  of.generator = &g1, oc.generator = &g2, oc.return_weights = true;
  Tensor yf = scaled_dot_product_attention(a.q, a.k, a.v, of).out;
  SdpaResult rc = scaled_dot_product_attention(b.q, b.k, b.v, oc);
  CHECK(rc.weights.shape() == Shape{B, H, Tq, Tk});
  check_close(yf, rc.out, tol, tol);
  sum(mul(yf, r)).backward();
  sum(mul(rc.out, r)).backward();
  check_close(a.q.grad(), b.q.grad(), tol, tol);
  check_close(a.k.grad(), b.k.grad(), tol, tol);
  check_close(a.v.grad(), b.v.grad(), tol, tol);
}

}  // namespace

TEST_CASE("attention: known values") {
  // One query, two keys, d = 1: scores q k_j / sqrt(1) = [0, ln 3] -> weights [1/4, 3/4];
  // out = 1/4 * 10 + 3/4 * 20 = 17.5
  Tensor q = tensor<double>({1.0}, {1, 1, 1, 1});
  Tensor k = tensor<double>({0.0, std::log(3.0)}, {1, 1, 2, 1});
  Tensor v = tensor<double>({10.0, 20.0}, {1, 1, 2, 1});
  check_close(scaled_dot_product_attention(q, k, v).out, {17.5}, 1e-12, 1e-12);
  SdpaOptions o;
  o.return_weights = true;
  check_close(scaled_dot_product_attention(q, k, v, o).weights, {0.25, 0.75}, 1e-12, 1e-12);
}

TEST_CASE("attention: fused equals composed (f64), every mask") {
  SdpaOptions none, causal, win, wincausal, lens, bmask;
  causal.causal = true;
  win.window = 2;
  wincausal.window = 1, wincausal.causal = true;
  lens.key_padding_lengths = tensor<int64_t>({5, 2});
  bmask.key_padding_mask = tensor<bool>({false, true, false, false, true, true, false, false, false, true}, {2, 5});
  for (const SdpaOptions& o : {none, causal, win, wincausal, lens, bmask}) {
    compare_paths(2, 3, 5, 5, 4, 3, o, DType::f64, 1e-11);
    if (!o.causal) compare_paths(2, 3, 3, 5, 4, 3, o, DType::f64, 1e-11);  // Tq < Tk
  }
  compare_paths(2, 3, 3, 5, 4, 3, causal, DType::f64, 1e-11);  // causal, bottom-right aligned
}

TEST_CASE("attention: fused equals composed across several tiles (f32, T = 150)") {
  SdpaOptions causal;
  causal.causal = true;
  compare_paths(1, 2, 150, 150, 8, 8, causal, DType::f32, 2e-5);
  SdpaOptions win;
  win.window = 40;
  compare_paths(1, 2, 150, 150, 8, 8, win, DType::f32, 2e-5);
  // head sizes that fill the register blocks (32 columns) and leave a remainder
  compare_paths(1, 2, 70, 70, 40, 40, SdpaOptions{}, DType::f32, 2e-5);
  compare_paths(1, 1, 33, 300, 64, 48, causal, DType::f32, 2e-5);
}

TEST_CASE("attention: a query that sees no key gives zeros and zero gradients, not NaN") {
  SdpaOptions o;
  o.key_padding_lengths = tensor<int64_t>({3, 0});  // batch element 1 has no valid key
  QKV a = make_qkv(2, 1, 2, 3, 4, 2, DType::f64, 3);
  Tensor y = scaled_dot_product_attention(a.q, a.k, a.v, o).out;
  std::vector<double> yv = y.to_vector<double>();
  for (size_t i = 4; i < 8; ++i) CHECK(yv[i] == 0.0);
  sum(y).backward();
  for (double g : a.q.grad().to_vector<double>()) CHECK(std::isfinite(g));
  for (double g : a.k.grad().narrow(0, 1, 1).to_vector<double>()) CHECK(g == 0.0);
  compare_paths(2, 1, 2, 3, 4, 2, o, DType::f64, 1e-11);
}

TEST_CASE("attention: gradcheck of the fused kernel") {
  SdpaOptions causal;
  causal.causal = true;
  SdpaOptions lens;
  lens.key_padding_lengths = tensor<int64_t>({2, 4});
  for (const SdpaOptions& o : {SdpaOptions{}, causal, lens}) {
    QKV a = make_qkv(2, 2, 3, 4, 3, 2, DType::f64, 11);
    if (o.causal) a = make_qkv(2, 2, 4, 4, 3, 2, DType::f64, 11);
    expect_gradcheck([o](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], o).out; },
                     {a.q, a.k, a.v});
  }
  // a transposed (non-contiguous) query and the same tensor as keys and values
  Tensor x = leaf64({1, 2, 4, 3}, 13);
  expect_gradcheck([](const std::vector<Tensor>& t) {
    Tensor q = t[0].transpose(2, 3).transpose(2, 3);
    return scaled_dot_product_attention(q.mT().mT(), t[0], t[0]).out;
  }, {x});
}

TEST_CASE("attention: dropout drops the same weights in both paths, and gradchecks") {
  SdpaOptions o;
  o.dropout = 0.3;
  compare_paths(2, 2, 4, 6, 3, 3, o, DType::f64, 1e-11);
  QKV a = make_qkv(1, 2, 3, 4, 3, 2, DType::f64, 17);
  expect_gradcheck([](const std::vector<Tensor>& x) {
    Generator g(42);  // the same mask at every evaluation
    SdpaOptions od;
    od.dropout = 0.3, od.generator = &g;
    return scaled_dot_product_attention(x[0], x[1], x[2], od).out;
  }, {a.q, a.k, a.v});
}

TEST_CASE("attention: the fused path keeps no T x T matrix") {
  // B = H = 1, T = 1024, d = 16: a T x T f32 matrix would be 4 MB; q, k, v, out are 64 KB each.
  QKV a = make_qkv(1, 1, 1024, 1024, 16, 16, DType::f32, 21);
  SdpaOptions o;
  o.causal = true;
  const uint64_t before = alloc_stats().bytes_in_use;
  Tensor y = scaled_dot_product_attention(a.q, a.k, a.v, o).out;
  const uint64_t held = alloc_stats().bytes_in_use - before;  // what forward keeps for backward
  CHECK(held < 1024 * 1024);
  sum(y).backward();
  CHECK(a.q.grad().shape() == Shape{1, 1, 1024, 16});
}

TEST_CASE("attention: errors") {
  QKV a = make_qkv(2, 2, 3, 4, 5, 6, DType::f32, 1);
  AG_CHECK_ERROR(scaled_dot_product_attention(a.q.reshape({4, 3, 5}), a.k, a.v), "scaled_dot_product_attention",
                 "[4,3,5]");
  AG_CHECK_ERROR(scaled_dot_product_attention(a.q, a.v, a.v), "scaled_dot_product_attention", "[2,2,4,6]");
  AG_CHECK_ERROR(scaled_dot_product_attention(a.q, a.k, a.v.narrow(2, 0, 3)), "scaled_dot_product_attention",
                 "[2,2,3,6]", "[2,2,4,5]");
  AG_CHECK_ERROR(scaled_dot_product_attention(a.q.to(DType::f64), a.k, a.v), "dtypes");
  SdpaOptions c;
  c.causal = true;
  QKV t = make_qkv(1, 1, 5, 3, 2, 2, DType::f32, 1);
  AG_CHECK_ERROR(scaled_dot_product_attention(t.q, t.k, t.v, c), "causal", "Tq 5", "Tk 3");
  SdpaOptions l;
  l.key_padding_lengths = tensor<int64_t>({1, 9});
  AG_CHECK_ERROR(scaled_dot_product_attention(a.q, a.k, a.v, l), "key_padding_lengths", "9");
  SdpaOptions m;
  m.key_padding_mask = zeros({2, 3}, DType::b8);
  AG_CHECK_ERROR(scaled_dot_product_attention(a.q, a.k, a.v, m), "key_padding_mask", "[2,3]");
  SdpaOptions d;
  d.dropout = 1.0;
  AG_CHECK_ERROR(scaled_dot_product_attention(a.q, a.k, a.v, d), "dropout", "1");
}

// Grouped-query attention: k and v of Hkv heads serve H = G Hkv query heads, query head h reading
// key/value head h / G. The oracle is plain multi-head attention on k and v whose heads are
// repeated by index_select ([0, 0, 1, 1] for H 4, Hkv 2: PyTorch's repeat_interleave), so the
// gradient of each key/value head is the sum over its group, by the chain rule through the copy.
TEST_CASE("attention: grouped-query heads equal repeated key/value heads, fused and composed") {
  SdpaOptions causal, lens, blocks;
  causal.causal = true;
  lens.key_padding_lengths = tensor<int64_t>({5, 3});
  blocks.block_mask = tensor<bool>({true, false, true, true}, {2, 2}), blocks.block_size = 3;
  for (int64_t Hkv : {1, 2})
    for (const SdpaOptions& mask : {SdpaOptions{}, causal, lens, blocks})
      for (bool composed : {false, true}) {
        CAPTURE(Hkv);
        CAPTURE(composed);
        const int64_t B = 2, H = 4, T = 5, D = 3, Dv = 2, G = H / Hkv;
        Tensor q = leaf64({B, H, T, D}, 1), k = leaf64({B, Hkv, T, D}, 2), v = leaf64({B, Hkv, T, Dv}, 3);
        Tensor q2 = leaf64({B, H, T, D}, 1), k2 = leaf64({B, Hkv, T, D}, 2), v2 = leaf64({B, Hkv, T, Dv}, 3);
        std::vector<int64_t> rep;
        for (int64_t h = 0; h < H; ++h) rep.push_back(h / G);
        const Tensor idx = from_vector<int64_t>(rep);
        SdpaOptions o = mask;
        o.enable_gqa = true, o.return_weights = composed;
        const Tensor y = scaled_dot_product_attention(q, k, v, o).out;
        const Tensor ref = scaled_dot_product_attention(q2, index_select(k2, 1, idx), index_select(v2, 1, idx), mask).out;
        check_close(y, ref, 1e-12, 1e-12);
        const Tensor r = leaf64({B, H, T, Dv}, 4).detach();
        sum(mul(y, r)).backward();
        sum(mul(ref, r)).backward();
        check_close(q.grad(), q2.grad(), 1e-12, 1e-12);
        check_close(k.grad(), k2.grad(), 1e-12, 1e-12);
        check_close(v.grad(), v2.grad(), 1e-12, 1e-12);
      }
}

TEST_CASE("attention: gradcheck of grouped-query heads, fused, across several tiles") {
  SdpaOptions o;
  o.enable_gqa = true, o.causal = true;
  // 4 query heads on 2 key/value heads; T 70 crosses the kernel's query and key tiles
  expect_gradcheck([o](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], o).out; },
                   {leaf64({1, 4, 70, 3}, 5), leaf64({1, 2, 70, 3}, 6), leaf64({1, 2, 70, 2}, 7)});
  o.causal = false, o.dropout = 0.25;
  expect_gradcheck([o](const std::vector<Tensor>& x) {
    Generator g(42);  // the same mask at every evaluation
    SdpaOptions od = o;
    od.generator = &g;
    return scaled_dot_product_attention(x[0], x[1], x[2], od).out;
  }, {leaf64({2, 3, 4, 3}, 8), leaf64({2, 1, 6, 3}, 9), leaf64({2, 1, 6, 2}, 10)});
}

TEST_CASE("attention: grouped-query errors name the heads") {
  const Tensor q = randn({1, 4, 3, 2}), k = randn({1, 3, 3, 2}), k2 = randn({1, 2, 3, 2});
  AG_CHECK_ERROR(scaled_dot_product_attention(q, k2, k2), "scaled_dot_product_attention", "heads must agree",
                 "enable_gqa");
  SdpaOptions o;
  o.enable_gqa = true;
  AG_CHECK_ERROR(scaled_dot_product_attention(q, k, k, o), "key/value heads (3) must divide the query heads (4)");
  AG_CHECK_ERROR(scaled_dot_product_attention(q, k2, k, o), "v of shape [1,3,3,2] does not match k of shape [1,2,3,2]");
}
