#include <array>

#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

std::vector<float> random_values(int64_t n, uint64_t seed) {
  Generator g(seed);
  return randn({n}, DType::f32, &g).to_vector<float>();
}

// Allocations (cache hits + system) made while running f: how many tensors it created.
template <class F>
uint64_t allocations(F&& f) {
  AllocStats s0 = alloc_stats();
  f();
  AllocStats s1 = alloc_stats();
  return (s1.system_allocs + s1.cache_hits) - (s0.system_allocs + s0.cache_hits);
}

// Restores the thread count a test changes.
struct ThreadCountGuard {
  int prev = num_threads();
  ~ThreadCountGuard() { set_num_threads(prev); }
};

}  // namespace

TEST_CASE("matmul: known values") {
  // C = A B:  [1 2 3] [ 7  8]   [1*7+2*9+3*11  1*8+2*10+3*12]   [ 58  64]
  //           [4 5 6] [ 9 10] = [4*7+5*9+6*11  4*8+5*10+6*12] = [139 154]
  //                   [11 12]
  // L = sum(C): dA = 1 B^T, each row holds B's row sums [15 19 23];
  //             dB = A^T 1, each column holds A's column sums [5 7 9].
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor a = tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3}).to(dt).set_requires_grad(true);
    Tensor b = tensor({7.f, 8.f, 9.f, 10.f, 11.f, 12.f}, {3, 2}).to(dt).set_requires_grad(true);
    Tensor c = matmul(a, b);
    CHECK(c.shape() == Shape{2, 2});
    CHECK(c.dtype() == dt);
    check_close(c, {58, 64, 139, 154});
    sum(c).backward();
    check_close(a.grad(), {15, 19, 23, 15, 19, 23});
    check_close(b.grad(), {5, 5, 7, 7, 9, 9});
  }
}

TEST_CASE("matmul: 1-D operands as in torch.matmul") {
  Tensor v = tensor({1.f, 2.f, 3.f}).set_requires_grad(true);
  Tensor B = tensor({7.f, 8.f, 9.f, 10.f, 11.f, 12.f}, {3, 2});
  Tensor A = tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  // vector @ matrix: [1 2 3] B = [58 64], shape [2]
  Tensor vm = matmul(v, B);
  CHECK(vm.shape() == Shape{2});
  check_close(vm, {58, 64});
  // matrix @ vector: A [1 0 -1] = [1-3, 4-6] = [-2 -2], shape [2]
  Tensor mv = matmul(A, tensor({1.f, 0.f, -1.f}));
  CHECK(mv.shape() == Shape{2});
  check_close(mv, {-2, -2});
  // vector @ vector: v.v = 1 + 4 + 9 = 14, 0-dim; the same tensor twice: d(v.v)/dv = 2v
  Tensor dot = matmul(v, v);
  CHECK(dot.ndim() == 0);
  CHECK(dot.item<float>() == 14);
  dot.backward();
  check_close(v.grad(), {2, 4, 6});
  // batched matrix @ vector: [2,2,3] @ [3] -> [2,2]
  Tensor A2 = tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 0.f, 0.f, 1.f, 1.f, 0.f, 0.f}, {2, 2, 3});
  Tensor bmv = matmul(A2, tensor({1.f, 0.f, -1.f}));
  CHECK(bmv.shape() == Shape{2, 2});
  check_close(bmv, {-2, -2, -1, 1});
  // vector @ batched matrix: [3] @ [2,3,2] -> [2,2]
  Tensor vbm = matmul(tensor({1.f, 2.f, 3.f}), stack({B, B}));
  CHECK(vbm.shape() == Shape{2, 2});
  check_close(vbm, {58, 64, 58, 64});
}

TEST_CASE("matmul: gradcheck 2-D, batched and broadcast batch") {
  auto mm = [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); };
  expect_gradcheck(mm, {leaf64({3, 4}, 1), leaf64({4, 5}, 2)});
  expect_gradcheck(mm, {leaf64({2, 3, 4}, 3), leaf64({2, 4, 2}, 4)});
  // batch dims broadcast: [2,1] with [5] -> [2,5]; gradients summed back to each input's shape
  expect_gradcheck(mm, {leaf64({2, 1, 3, 4}, 5), leaf64({5, 4, 2}, 6)});
  expect_gradcheck(mm, {leaf64({1, 3, 4}, 7), leaf64({2, 1, 4, 2}, 8)});
  // a 2-D a against a batched b (a broadcast over the batch)
  expect_gradcheck(mm, {leaf64({3, 4}, 9), leaf64({2, 4, 2}, 10)});
  // b 2-D against a batched a: the folded path (one GEMM of 2*3 rows; dB one GEMM over them)
  expect_gradcheck(mm, {leaf64({2, 3, 4}, 11), leaf64({4, 2}, 12)});
  // b with leading size-1 batch dims: folded too; the output takes b's extra dim
  Tensor y = matmul(zeros({2, 3, 4}), zeros({1, 1, 4, 5}));
  CHECK(y.shape() == Shape{1, 2, 3, 5});
  expect_gradcheck(mm, {leaf64({2, 3, 4}, 13), leaf64({1, 1, 4, 2}, 14)});
  // empty inner dim: C = 0
  Tensor z = matmul(ones({2, 0}), ones({0, 3}));
  CHECK(z.shape() == Shape{2, 3});
  check_close(z, {0, 0, 0, 0, 0, 0});
}

TEST_CASE("matmul: gradcheck with transposed and sliced inputs") {
  // a.mT() and b.mT() reach BLAS as transpose flags (strides (1, ld))
  expect_gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0].mT(), x[1]); },
                   {leaf64({4, 3}, 1), leaf64({4, 5}, 2)});
  expect_gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0], x[1].mT()); },
                   {leaf64({3, 4}, 3), leaf64({5, 4}, 4)});
  expect_gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0].mT(), x[1].mT()); },
                   {leaf64({2, 4, 3}, 5), leaf64({2, 5, 4}, 6)});
  // the nn.Linear layout on a batch: x @ w^T, folded with b transposed
  expect_gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0], x[1].mT()); },
                   {leaf64({2, 3, 4}, 7), leaf64({5, 4}, 8)});
  // a batch whose rows cannot fold (batch dim inside the rows): per-matrix GEMMs, b broadcast
  expect_gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0].transpose(0, 1), x[1]); },
                   {leaf64({3, 2, 4}, 9), leaf64({4, 2}, 10)});
  // narrow: rows with a leading dim larger than K (lda = 7 for K = 4)
  expect_gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0].narrow(1, 2, 4), x[1]); },
                   {leaf64({3, 7}, 11), leaf64({4, 2}, 12)});
  // a step-2 slice has no BLAS layout: copied first
  expect_gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0].slice(1, 0, 8, 2), x[1].slice(0, 1, 5)); },
                   {leaf64({3, 8}, 13), leaf64({5, 2}, 14)});
  // an expanded (stride-0) batch operand
  expect_gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0].expand({3, 2, 4}), x[1]); },
                   {leaf64({2, 4}, 15), leaf64({3, 4, 2}, 16)});
}

TEST_CASE("matmul: gradcheck 1-D operands and the same tensor twice") {
  expect_gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }, {leaf64({4}, 1), leaf64({4, 3}, 2)});
  expect_gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }, {leaf64({3, 4}, 3), leaf64({4}, 4)});
  expect_gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }, {leaf64({4}, 5), leaf64({4}, 6)});
  expect_gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); },
                   {leaf64({4}, 7), leaf64({2, 4, 3}, 8)});
  // X @ X: both gradients flow into one leaf, dX = G X^T + X^T G
  expect_gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0], x[0]); }, {leaf64({3, 3}, 9)});
  // X @ X^T (a Gram matrix): one operand transposed, same storage
  expect_gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0], x[0].mT()); }, {leaf64({3, 4}, 10)});
}

TEST_CASE("matmul: BLAS kernel matches the naive kernel (f32, transposes, batch, threads)") {
  ThreadCountGuard restore;
  struct Case {
    int64_t M, N, K;
  };
  // small and odd sizes; sizes above the threading threshold (rows split, or columns when M is
  // small); a batch of 3 whose row split crosses matrix boundaries
  const Case cases[] = {{1, 1, 1},     {3, 5, 7},      {17, 13, 9},   {33, 65, 31},
                        {200, 70, 50}, {2, 1500, 300}, {257, 9, 129}, {40, 64, 128}};
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (const Case& cs : cases) {
      for (int64_t P : {int64_t(1), int64_t(3)}) {
        for (int t = 0; t < 4; ++t) {
          const bool ta = t & 1, tb = t & 2;
          // leading dims padded by 3: the kernel must honour ld, not assume dense rows
          const int64_t lda = (ta ? cs.M : cs.K) + 3, ldb = (tb ? cs.K : cs.N) + 3;
          const int64_t size_a = (ta ? cs.K : cs.M) * lda, size_b = (tb ? cs.N : cs.K) * ldb;
          std::vector<float> a = random_values(P * size_a, 1), b = random_values(size_b, 2);
          Layout la, lb;  // a batched, b broadcast over the batch (stride 0)
          la.ndim = lb.ndim = 1;
          la.shape[0] = lb.shape[0] = P;
          la.strides[0] = size_a;
          lb.strides[0] = 0;
          cpu::Gemm g{cs.M, cs.N, cs.K, ta, tb, lda, ldb, &la, &lb};
          std::vector<float> fast(size_t(P * cs.M * cs.N), -1.f), ref(fast.size(), -2.f);
          cpu::matmul_forward(fast.data(), a.data(), b.data(), g);
          cpu::matmul_forward_naive(ref.data(), a.data(), b.data(), g);
          INFO("threads " << threads << " M " << cs.M << " N " << cs.N << " K " << cs.K << " P " << P
                          << " trans " << ta << tb);
          check_close(std::vector<double>(fast.begin(), fast.end()), std::vector<double>(ref.begin(), ref.end()),
                      1e-4, 1e-4);
        }
      }
    }
  }
}

TEST_CASE("matmul: f32 forward and backward match the naive kernel (threaded sizes)") {
  // y = x @ w^T, the nn.Linear layout on a batch: folded into one GEMM of 4*37 rows, large
  // enough to be split over threads; then dx = G w and dw = G^T x against triple loops
  Generator gen(3);
  Tensor x = randn({4, 37, 64}, DType::f32, &gen).set_requires_grad(true);
  Tensor w = randn({70, 64}, DType::f32, &gen).set_requires_grad(true);
  Tensor G = randn({4, 37, 70}, DType::f32, &gen);
  Tensor y = matmul(x, w.mT());
  y.backward(G);
  const int64_t R = 4 * 37;
  std::vector<float> ref(size_t(R * 70)), dx(size_t(R * 64)), dw(size_t(70 * 64));
  cpu::Gemm fwd{R, 70, 64, false, true, 64, 64, nullptr, nullptr};   // x (R,64) @ w^T, w stored (70,64)
  cpu::Gemm bx{R, 64, 70, false, false, 70, 64, nullptr, nullptr};   // G (R,70) @ w (70,64)
  cpu::Gemm bw{70, 64, R, true, false, 70, 64, nullptr, nullptr};    // G^T, G stored (R,70), @ x (R,64)
  cpu::matmul_forward_naive(ref.data(), x.data<float>(), w.data<float>(), fwd);
  cpu::matmul_forward_naive(dx.data(), G.data<float>(), w.data<float>(), bx);
  cpu::matmul_forward_naive(dw.data(), G.data<float>(), x.data<float>(), bw);
  check_close(y, std::vector<double>(ref.begin(), ref.end()), 1e-4, 1e-4);
  check_close(x.grad(), std::vector<double>(dx.begin(), dx.end()), 1e-4, 1e-4);
  check_close(w.grad(), std::vector<double>(dw.begin(), dw.end()), 1e-3, 1e-4);

  // a transposed a, 2-D
  Tensor at = randn({64, 37}, DType::f32, &gen), b = randn({64, 90}, DType::f32, &gen);
  Tensor y2 = matmul(at.mT(), b);
  std::vector<float> ref2(size_t(37 * 90));
  cpu::Gemm g2{37, 90, 64, true, false, 37, 90, nullptr, nullptr};
  cpu::matmul_forward_naive(ref2.data(), at.data<float>(), b.data<float>(), g2);
  check_close(y2, std::vector<double>(ref2.begin(), ref2.end()), 1e-4, 1e-4);
}

TEST_CASE("matmul: transposed views go to BLAS without a copy") {
  Tensor x = randn({64, 32}), w = randn({48, 32}), x3 = randn({2, 64, 32});
  // only the output is allocated: a transposed operand is a BLAS flag, not a copy
  CHECK(allocations([&] { matmul(x, w.mT()); }) == 1);
  CHECK(allocations([&] { matmul(x.mT().mT(), w.mT()); }) == 1);
  CHECK(allocations([&] { matmul(w.mT().mT(), x.mT()); }) == 1);
  CHECK(allocations([&] { matmul(x3, w.mT()); }) == 1);
  CHECK(allocations([&] { matmul(x3.narrow(2, 0, 16), w.narrow(1, 0, 16).mT()); }) == 1);
  // step-2 slices have no BLAS layout: each is copied, then the output
  CHECK(allocations([&] { matmul(x.slice(1, 0, 32, 2), w.slice(1, 0, 32, 2).mT()); }) == 3);
}

TEST_CASE("matmul: errors") {
  AG_CHECK_ERROR(matmul(zeros({2, 3}), zeros({4, 5})), "matmul: [2,3] @ [4,5]: inner dimensions 3 and 4 differ");
  AG_CHECK_ERROR(matmul(zeros({3}), zeros({4})), "matmul: [3] @ [4]: inner dimensions 3 and 4 differ");
  AG_CHECK_ERROR(matmul(zeros({2, 3}), zeros({2})), "matmul", "inner dimensions 3 and 2 differ");
  AG_CHECK_ERROR(matmul(zeros({2, 3}), zeros({3, 2}, DType::f64)), "matmul", "[2,3] @ [3,2]", "f32", "f64");
  AG_CHECK_ERROR(matmul(zeros({2, 3}, DType::i64), zeros({3, 2}, DType::i64)), "matmul", "i64");
  AG_CHECK_ERROR(matmul(scalar_tensor(2.0), zeros({3})), "matmul", "[] @ [3]", "0-dim");
  AG_CHECK_ERROR(matmul(zeros({3}), scalar_tensor(2.0)), "matmul", "[3] @ []", "0-dim");
  AG_CHECK_ERROR(matmul(zeros({2, 3, 4}), zeros({3, 4, 5})), "matmul", "[2,3,4] @ [3,4,5]",
                 "batch dims [2] and [3] cannot be broadcast");
}

TEST_CASE("linear: known values") {
  // x = [[1, 2], [3, 4]], W = [[1, 0], [0, 1], [1, 1]], b = [10, 20, 30]
  // y = x W^T + b: row 1 = [1, 2, 1 + 2] + b = [11, 22, 33]; row 2 = [3, 4, 7] + b = [13, 24, 37]
  Tensor x = from_vector<double>({1, 2, 3, 4}, {2, 2}).set_requires_grad(true);
  Tensor w = from_vector<double>({1, 0, 0, 1, 1, 1}, {3, 2}).set_requires_grad(true);
  Tensor b = from_vector<double>({10, 20, 30}, {3}).set_requires_grad(true);
  Tensor y = linear(x, w, b);
  CHECK(y.shape() == Shape{2, 3});
  check_close(y, {11, 22, 33, 13, 24, 37});
  // with g = ones: dx = g W = [1+0+1, 0+1+1] per row; dW = g^T x = column sums of x per row of W
  // = [4, 6]; db = rows of g summed = [2, 2, 2]
  y.backward(ones({2, 3}, DType::f64));
  check_close(x.grad(), {2, 2, 2, 2});
  check_close(w.grad(), {4, 6, 4, 6, 4, 6});
  check_close(b.grad(), {2, 2, 2});
  // without a bias: x W^T
  check_close(linear(x.detach(), w.detach()), {1, 2, 3, 3, 4, 7});
  // no input features: y is the bias on every row (zeros without one), as in torch
  check_close(linear(zeros({2, 0}, DType::f64), zeros({3, 0}, DType::f64), b.detach()), {10, 20, 30, 10, 20, 30});
  check_close(linear(zeros({2, 0}, DType::f64), zeros({3, 0}, DType::f64)), {0, 0, 0, 0, 0, 0});
}

TEST_CASE("linear: gradcheck with and without bias, batched, transposed and sliced inputs, shared tensors") {
  auto lin = [](const std::vector<Tensor>& t) { return linear(t[0], t[1], t[2]); };
  auto nob = [](const std::vector<Tensor>& t) { return linear(t[0], t[1]); };
  expect_gradcheck(lin, {leaf64({3, 4}, 1), leaf64({5, 4}, 2), leaf64({5}, 3)});
  expect_gradcheck(nob, {leaf64({3, 4}, 4), leaf64({5, 4}, 5)});
  expect_gradcheck(lin, {leaf64({2, 3, 4}, 6), leaf64({2, 4}, 7), leaf64({2}, 8)});  // [..., in]
  expect_gradcheck(lin, {leaf64({4}, 9), leaf64({3, 4}, 10), leaf64({3}, 11)});      // 1-D input
  // x whose rows do not fold (a transposed batch), a transposed weight, a sliced input
  expect_gradcheck([](const std::vector<Tensor>& t) { return linear(t[0].transpose(0, 1), t[1], t[2]); },
                   {leaf64({3, 2, 4}, 12), leaf64({5, 4}, 13), leaf64({5}, 14)});
  expect_gradcheck([](const std::vector<Tensor>& t) { return linear(t[0], t[1].mT(), t[2]); },
                   {leaf64({3, 4}, 15), leaf64({4, 5}, 16), leaf64({5}, 17)});
  expect_gradcheck([](const std::vector<Tensor>& t) { return linear(t[0].narrow(1, 1, 4), t[1], t[2]); },
                   {leaf64({3, 7}, 18), leaf64({2, 4}, 19), leaf64({2}, 20)});
  // the same tensor as input and weight: x W^T with W = x
  expect_gradcheck([](const std::vector<Tensor>& t) { return linear(t[0], t[0], t[1]); },
                   {leaf64({3, 3}, 21), leaf64({3}, 22)});
}

TEST_CASE("linear: f32 equals matmul + bias at GEMM sizes (edge tiles, several k blocks, few rows)") {
  // the bias is added in the GEMM's epilogue; against the composed ops in f64
  for (auto [rows, in, out] : {std::array<int64_t, 3>{70, 300, 130}, {1, 40, 24}, {3, 700, 65}, {256, 64, 192}}) {
    CAPTURE(rows);
    CAPTURE(in);
    CAPTURE(out);
    Generator g(uint64_t(rows * 7 + in));
    Tensor x = randn({rows, in}, DType::f64, &g), w = randn({out, in}, DType::f64, &g), b = randn({out}, DType::f64, &g);
    Tensor ref = add(matmul(x, w.mT()), b);
    Tensor y = linear(x.to(DType::f32), w.to(DType::f32), b.to(DType::f32));
    check_close(y, ref.to_vector<double>(), 1e-4, 1e-4);
    // and the gradients, in f32, against f64
    Tensor xf = x.to(DType::f32).set_requires_grad(true), wf = w.to(DType::f32).set_requires_grad(true),
           bf = b.to(DType::f32).set_requires_grad(true);
    Tensor gy = randn({rows, out}, DType::f64, &g);
    linear(xf, wf, bf).backward(gy.to(DType::f32));
    check_close(xf.grad(), matmul(gy, w).to_vector<double>(), 1e-4, 1e-4);
    check_close(wf.grad(), matmul(gy.mT(), x).to_vector<double>(), 1e-4, 1e-4);
    check_close(bf.grad(), sum(gy, {0}).to_vector<double>(), 1e-4, 1e-4);
  }
}

TEST_CASE("linear: errors") {
  AG_CHECK_ERROR(linear(zeros({2, 3}), zeros({4, 5})), "linear", "[2,3]", "[4,5]", "in = 5");
  AG_CHECK_ERROR(linear(zeros({2, 3}), zeros({3})), "linear", "weight must be [out, in]", "[3]");
  AG_CHECK_ERROR(linear(zeros({2, 3}), zeros({4, 3}), zeros({5})), "linear", "bias [5]", "[4]");
  AG_CHECK_ERROR(linear(zeros({2, 3}), zeros({4, 3}, DType::f64)), "linear", "f32", "f64");
  AG_CHECK_ERROR(linear(zeros({2, 3}, DType::i64), zeros({4, 3}, DType::i64)), "linear", "i64");
  AG_CHECK_ERROR(linear(scalar_tensor(1.0), zeros({4, 1})), "linear", "[]");
}
