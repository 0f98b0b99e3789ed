// Tests of the normalisation & loss ops (autograd/ops/nn.cpp): softmax, log_softmax, layer_norm,
// embedding, cross_entropy, dropout; and gelu's PyTorch fixture. PyTorch references are read from
// tests/golden/*.txt, written by tools/make_fixtures.py (torch, float64).
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- PyTorch fixtures ------------------------------------------------------------------------
// One tensor a line, "key: d0 d1 ... | v0 v1 ..." (the format make_fixtures.py documents).
struct Golden {
  std::map<std::string, std::pair<Shape, std::vector<double>>> entries;

  const std::pair<Shape, std::vector<double>>& at(const std::string& key) const {
    auto it = entries.find(key);
    REQUIRE_MESSAGE(it != entries.end(), "fixture key missing: " << key);
    return it->second;
  }
  const std::vector<double>& values(const std::string& key) const { return at(key).second; }
  Tensor tensor(const std::string& key, DType dtype) const {
    const auto& [shape, v] = at(key);
    return from_vector(v, shape).to(dtype);
  }
  Tensor leaf(const std::string& key, DType dtype) const { return tensor(key, dtype).set_requires_grad(true); }
  Tensor indices(const std::string& key) const { return tensor(key, DType::i64); }
};

Golden load_golden(const std::string& name) {
  const std::string path = std::string(ATTOGRAD_TEST_DATA) + "/" + name + ".txt";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open fixture " << path << " (run tools/make_fixtures.py)");
  Golden g;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t colon = line.find(':'), bar = line.find('|');
    REQUIRE_MESSAGE((colon != std::string::npos && bar != std::string::npos && colon < bar), "bad line: " << line);
    Shape shape;
    std::istringstream dims(line.substr(colon + 1, bar - colon - 1));
    for (int64_t d; dims >> d;) shape.push_back(d);
    std::vector<double> v;
    std::istringstream vals(line.substr(bar + 1));
    for (std::string tok; vals >> tok;) v.push_back(std::strtod(tok.c_str(), nullptr));  // reads nan, inf
    REQUIRE_MESSAGE(int64_t(v.size()) == shape.numel(), "value count differs from shape in: " << line.substr(0, colon));
    g.entries[line.substr(0, colon)] = {shape, std::move(v)};
  }
  return g;
}

// Tolerance against float64 PyTorch: f32 results to ~1e-5, f64 results to ~1e-10.
double tol(DType t) { return t == DType::f32 ? 1e-5 : 1e-10; }
void check_golden(const Tensor& got, const Golden& g, const std::string& key) {
  INFO("fixture " << key << ", dtype " << name(got.dtype()));
  REQUIRE(got.defined());
  CHECK(got.shape() == g.at(key).first);
  check_close(got, g.values(key), tol(got.dtype()), tol(got.dtype()));
}

// Restores the thread count at scope exit.
struct ThreadCountRestore {
  int saved = num_threads();
  ~ThreadCountRestore() { set_num_threads(saved); }
};

// Bitwise equality of two tensors' values (NaN equals NaN).
void check_identical(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) {
      FAIL_CHECK(fmt::format("element {}: {:.17g} vs {:.17g}", i, x[i], y[i]));
      return;
    }
}

Tensor randn64(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, DType::f64, &g);
}

}  // namespace

// =================================== softmax ==================================================
TEST_CASE("softmax: known values") {
  // x = [0, ln 2, ln 3]: e^x = [1, 2, 3], so y = [1, 2, 3] / 6; shifting x by 1000 changes nothing
  // (the max is subtracted first, so e^1000 never overflows)
  const double l2 = std::log(2.0), l3 = std::log(3.0);
  Tensor x = tensor<double>({0, l2, l3}).set_requires_grad(true);
  Tensor y = softmax(x);
  check_close(y, {1.0 / 6, 2.0 / 6, 3.0 / 6}, 1e-15, 1e-14);
  check_close(softmax(tensor<double>({1000, 1000 + l2, 1000 + l3})), {1.0 / 6, 2.0 / 6, 3.0 / 6}, 1e-14, 1e-12);
  // dx_k = y_k (g_k - sum_i g_i y_i); g = [1, 0, 0] gives sum = 1/6 and
  // dx = [1/6 * 5/6, 2/6 * -1/6, 3/6 * -1/6] = [5, -2, -3] / 36
  y.backward(tensor<double>({1, 0, 0}));
  check_close(x.grad(), {5.0 / 36, -2.0 / 36, -3.0 / 36}, 1e-15, 1e-14);
  // along dim 0 of [[0, 0], [ln 3, 0]]: columns [1, 3]/4 and [1, 1]/2
  check_close(softmax(tensor<double>({0, 0, l3, 0}, {2, 2}), 0), {0.25, 0.5, 0.75, 0.5}, 1e-15, 1e-14);
  // a 0-dim tensor is a row of one element: softmax 1
  check_close(softmax(scalar_tensor(5.0)), {1.0});
}

TEST_CASE("softmax: matches PyTorch along every dim (f32 and f64)") {
  Golden g = load_golden("softmax");
  for (DType dt : {DType::f32, DType::f64})
    for (int d : {0, 1, 2}) {
      Tensor x = g.leaf("x", dt);
      Tensor y = softmax(x, d);
      y.backward(g.tensor("r", dt));
      check_golden(y, g, fmt::format("y_dim{}", d));
      check_golden(x.grad(), g, fmt::format("dx_dim{}", d));
    }
}

TEST_CASE("softmax: gradcheck along dims 0, 1, -1, transposed, used twice") {
  for (int d : {0, 1, -1})
    expect_gradcheck([d](const std::vector<Tensor>& x) { return softmax(x[0], d); }, {leaf64({2, 3, 4}, 11)});
  // a transposed (non-contiguous) input, softmax over its dims 1 and -1
  for (int d : {1, -1})
    expect_gradcheck([d](const std::vector<Tensor>& x) { return softmax(x[0].transpose(0, 2), d); },
                     {leaf64({4, 3, 2}, 12)});
  // x used twice: y = softmax(x) * x
  expect_gradcheck([](const std::vector<Tensor>& x) { return mul(softmax(x[0], 1), x[0]); }, {leaf64({3, 5}, 13)});
}

TEST_CASE("softmax: a fully -inf row gives NaN, as PyTorch") {
  // e^(x - m) with m = -inf is e^(-inf - -inf) = e^NaN: the whole row is NaN (torch.softmax gives
  // nan there too), while the other rows are unaffected.
  Tensor x = tensor<float>({-INFINITY, -INFINITY, -INFINITY, 0.f, std::log(2.f), -INFINITY}, {2, 3});
  std::vector<double> y = softmax(x).to_vector<double>();
  for (int i = 0; i < 3; ++i) CHECK(std::isnan(y[i]));
  check_close(std::vector<double>(y.begin() + 3, y.end()), {1.0 / 3, 2.0 / 3, 0.0});
  std::vector<double> ly = log_softmax(x).to_vector<double>();
  for (int i = 0; i < 3; ++i) CHECK(std::isnan(ly[i]));
  CHECK(ly[5] == -kInf);
}

TEST_CASE("softmax: fast kernels match the naive reference") {
  // (outer, C, inner): rows (inner 1) of odd and long lengths, middle dims with one and several
  // column blocks (the kernel takes 128 columns at a time)
  const int64_t shapes[][3] = {{7, 1000, 1}, {5, 17, 1}, {1, 1, 1}, {3, 37, 5}, {2, 5, 300}, {4, 3, 128}};
  for (const auto& s : shapes) {
    const int64_t outer = s[0], C = s[1], inner = s[2];
    INFO("outer " << outer << " C " << C << " inner " << inner);
    Tensor x = randn64({outer, C, inner}, 21).mul_(3.0), g = randn64({outer, C, inner}, 22);
    Tensor y = empty_like(x), y_ref = empty_like(x), dx = zeros_like(x), dx_ref = zeros_like(x);
    cpu::softmax_forward<double>(y.data<double>(), x.data<double>(), outer, C, inner);
    cpu::softmax_forward_naive<double>(y_ref.data<double>(), x.data<double>(), outer, C, inner);
    check_close(y, y_ref, 1e-15, 1e-12);
    cpu::softmax_backward<double>(dx.data<double>(), g.data<double>(), y.data<double>(), outer, C, inner);
    cpu::softmax_backward_naive<double>(dx_ref.data<double>(), g.data<double>(), y.data<double>(), outer, C, inner);
    check_close(dx, dx_ref, 1e-14, 1e-10);
    // f32: the vectorised fast_exp (core/cpu/vecmath.h, 1 ulp) against std::exp
    Tensor xf = x.to(DType::f32), gf = g.to(DType::f32), yf = empty_like(xf), yf_ref = empty_like(xf);
    Tensor dxf = zeros_like(xf), dxf_ref = zeros_like(xf);
    cpu::softmax_forward<float>(yf.data<float>(), xf.data<float>(), outer, C, inner);
    cpu::softmax_forward_naive<float>(yf_ref.data<float>(), xf.data<float>(), outer, C, inner);
    check_close(yf, yf_ref, 1e-7, 1e-5);
    cpu::softmax_backward<float>(dxf.data<float>(), gf.data<float>(), yf.data<float>(), outer, C, inner);
    cpu::softmax_backward_naive<float>(dxf_ref.data<float>(), gf.data<float>(), yf.data<float>(), outer, C, inner);
    check_close(dxf, dxf_ref, 1e-6, 1e-4);
    // the backward kernels add into dx
    cpu::softmax_backward<double>(dx.data<double>(), g.data<double>(), y.data<double>(), outer, C, inner);
    check_close(dx, mul(dx_ref, 2.0), 1e-14, 1e-10);
  }
}

TEST_CASE("softmax: errors") {
  AG_CHECK_ERROR(softmax(zeros({2, 3}), 2), "softmax", "dim 2", "2 dims");
  AG_CHECK_ERROR(softmax(zeros({2, 3}), -3), "softmax", "dim -3");
  AG_CHECK_ERROR(softmax(arange(0, 6, 1, DType::i64)), "softmax", "i64");
  AG_CHECK_ERROR(log_softmax(zeros({2}), 1), "log_softmax", "dim 1");
  AG_CHECK_ERROR(log_softmax(arange(0, 6, 1, DType::i64)), "log_softmax", "i64");
}

// ================================= log_softmax ================================================
TEST_CASE("log_softmax: known values") {
  // x = [0, ln 2, ln 3]: y = x - log(1 + 2 + 3) = [ln 1/6, ln 2/6, ln 3/6]
  const double l2 = std::log(2.0), l3 = std::log(3.0);
  Tensor x = tensor<double>({0, l2, l3}).set_requires_grad(true);
  Tensor y = log_softmax(x);
  check_close(y, {std::log(1.0 / 6), std::log(2.0 / 6), std::log(3.0 / 6)}, 1e-15, 1e-14);
  // far from 0 there is no overflow: log_softmax([1000, 1000]) = [-ln 2, -ln 2]
  check_close(log_softmax(tensor<float>({1000.f, 1000.f})), {-l2, -l2});
  // dx_k = g_k - e^(y_k) sum_i g_i; g = [1, 0, 0]: dx = [1 - 1/6, -2/6, -3/6]
  y.backward(tensor<double>({1, 0, 0}));
  check_close(x.grad(), {5.0 / 6, -2.0 / 6, -3.0 / 6}, 1e-15, 1e-14);
}

TEST_CASE("log_softmax: matches PyTorch along every dim (f32 and f64)") {
  Golden g = load_golden("log_softmax");
  for (DType dt : {DType::f32, DType::f64})
    for (int d : {0, 1, 2}) {
      Tensor x = g.leaf("x", dt);
      Tensor y = log_softmax(x, d);
      y.backward(g.tensor("r", dt));
      check_golden(y, g, fmt::format("y_dim{}", d));
      check_golden(x.grad(), g, fmt::format("dx_dim{}", d));
    }
}

TEST_CASE("log_softmax: gradcheck along dims 0, 1, -1, transposed, used twice") {
  for (int d : {0, 1, -1})
    expect_gradcheck([d](const std::vector<Tensor>& x) { return log_softmax(x[0], d); }, {leaf64({2, 3, 4}, 31)});
  for (int d : {0, -1})
    expect_gradcheck([d](const std::vector<Tensor>& x) { return log_softmax(x[0].transpose(0, 2), d); },
                     {leaf64({4, 3, 2}, 32)});
  expect_gradcheck([](const std::vector<Tensor>& x) { return add(log_softmax(x[0], 0), softmax(x[0], 1)); },
                   {leaf64({3, 4}, 33)});
}

TEST_CASE("log_softmax: the middle-dim kernel matches the row kernel") {
  // log_softmax over dim 1 of [3, 37, 150] equals log_softmax over the last dim of its transpose
  Tensor x = randn64({3, 37, 150}, 34).mul_(4.0), g = randn64({3, 37, 150}, 35);
  Tensor a = x.detach().set_requires_grad(true), b = x.detach().set_requires_grad(true);
  Tensor ya = log_softmax(a, 1), yb = log_softmax(b.transpose(1, 2).contiguous(), -1).transpose(1, 2);
  check_close(ya, yb.contiguous(), 1e-14, 1e-12);
  ya.backward(g);
  yb.backward(g);
  check_close(a.grad(), b.grad(), 1e-14, 1e-10);
}

// ================================== layer_norm ================================================
TEST_CASE("layer_norm: known values") {
  // x = [1, 2, 3], eps = 0: mu = 2, var = ((-1)^2 + 0 + 1^2) / 3 = 2/3, rstd = sqrt(3/2) = a,
  // xhat = [-a, 0, a]; with w = [1, 2, 3], b = 1/2: y = [-a + 1/2, 1/2, 3a + 1/2]
  const double a = std::sqrt(1.5);
  Tensor x = tensor<double>({1, 2, 3}, {1, 3}).set_requires_grad(true);
  Tensor w = tensor<double>({1, 2, 3}).set_requires_grad(true), b = full({3}, 0.5, DType::f64).set_requires_grad(true);
  check_close(layer_norm(x.detach(), {3}, Tensor(), Tensor(), 0.0), {-a, 0, a}, 1e-15, 1e-14);
  Tensor y = layer_norm(x, {3}, w, b, 0.0);
  check_close(y, {-a + 0.5, 0.5, 3 * a + 0.5}, 1e-15, 1e-14);
  // g = [1, 0, 0]: dxhat = g w = [1, 0, 0], mean(dxhat) = 1/3, mean(dxhat xhat) = -a/3, so
  // dx = a ([1, 0, 0] - 1/3 + xhat a/3) = a [1 - 1/3 - 1/2, -1/3, -1/3 + 1/2] = a [1/6, -1/3, 1/6];
  // dw = g xhat = [-a, 0, 0], db = g = [1, 0, 0]
  y.backward(tensor<double>({1, 0, 0}, {1, 3}));
  check_close(x.grad(), {a / 6, -a / 3, a / 6}, 1e-15, 1e-14);
  check_close(w.grad(), {-a, 0, 0}, 1e-15, 1e-14);
  check_close(b.grad(), {1, 0, 0});
  // a constant gradient does not move a normalised row: g = 1 gives dx = 0, db = number of rows
  Tensor x2 = tensor<double>({1, 2, 3, -4, 0, 5}, {2, 3}).set_requires_grad(true);
  Tensor b2 = zeros({3}, DType::f64).set_requires_grad(true);
  layer_norm(x2, {3}, Tensor(), b2).backward(ones({2, 3}, DType::f64));
  check_close(x2.grad(), {0, 0, 0, 0, 0, 0}, 1e-12, 0);
  check_close(b2.grad(), {2, 2, 2});
}

TEST_CASE("layer_norm: matches PyTorch, over 1 and 2 dims, with and without w, b (f32 and f64)") {
  Golden g = load_golden("layer_norm");
  struct Case {
    const char* name;
    Shape ns;
    const char* w;
    const char* b;
  };
  const Case cases[] = {{"last1_wb", {4}, "w1", "b1"}, {"last1_none", {4}, nullptr, nullptr},
                        {"last2_wb", {3, 4}, "w2", "b2"}, {"last2_w", {3, 4}, "w2", nullptr}};
  for (DType dt : {DType::f32, DType::f64})
    for (const Case& c : cases) {
      Tensor x = g.leaf("x", dt);
      Tensor w = c.w ? g.leaf(c.w, dt) : Tensor(), b = c.b ? g.leaf(c.b, dt) : Tensor();
      Tensor y = layer_norm(x, c.ns, w, b, 1e-5);
      y.backward(g.tensor("r", dt));
      const std::string n = c.name;
      check_golden(y, g, "y_" + n);
      check_golden(x.grad(), g, "dx_" + n);
      if (c.w) check_golden(w.grad(), g, "dw_" + n);
      if (c.b) check_golden(b.grad(), g, "db_" + n);
    }
}

TEST_CASE("layer_norm: gradcheck with and without w, b, over 1 and 2 dims, transposed, used twice") {
  GradcheckOptions opt;
  opt.atol = 1e-5;
  // over the last dim, with w and b
  expect_gradcheck([](const std::vector<Tensor>& x) { return layer_norm(x[0], {4}, x[1], x[2]); },
                   {leaf64({2, 3, 4}, 41), leaf64({4}, 42), leaf64({4}, 43)}, opt);
  // no w, no b
  expect_gradcheck([](const std::vector<Tensor>& x) { return layer_norm(x[0], {4}); }, {leaf64({3, 4}, 44)}, opt);
  // over the last 2 dims, w only, then b only
  expect_gradcheck([](const std::vector<Tensor>& x) { return layer_norm(x[0], {3, 4}, x[1]); },
                   {leaf64({2, 3, 4}, 45), leaf64({3, 4}, 46)}, opt);
  expect_gradcheck([](const std::vector<Tensor>& x) { return layer_norm(x[0], {3, 4}, Tensor(), x[1]); },
                   {leaf64({2, 3, 4}, 47), leaf64({3, 4}, 48)}, opt);
  // a transposed input and a sliced weight (non-contiguous)
  expect_gradcheck(
      [](const std::vector<Tensor>& x) { return layer_norm(x[0].transpose(0, 1), {3}, x[1].slice(0, 0, 6, 2)); },
      {leaf64({3, 4}, 49), leaf64({6}, 50)}, opt);
  // x used twice: y = layer_norm(x) * x; and a weight that does not require grad
  Tensor w_const = randn64({5}, 51);
  expect_gradcheck([w_const](const std::vector<Tensor>& x) { return mul(layer_norm(x[0], {5}, w_const), x[0]); },
                   {leaf64({2, 5}, 52)}, opt);
}

TEST_CASE("layer_norm: fast kernels match the naive reference") {
  // (R, N): one row, rows of odd length, and enough rows for several blocks of dw/db partial sums
  const int64_t shapes[][2] = {{1, 1}, {3, 7}, {500, 300}, {20000, 8}, {64, 1024}};
  for (const auto& s : shapes)
    for (bool affine : {true, false}) {
      const int64_t R = s[0], N = s[1];
      INFO("R " << R << " N " << N << " affine " << affine);
      Tensor x = randn64({R, N}, 61).mul_(2.0).add_(full({}, 0.5, DType::f64)), g = randn64({R, N}, 62);
      Tensor w = randn64({N}, 63), b = randn64({N}, 64);
      const double* wp = affine ? w.data<double>() : nullptr;
      const double* bp = affine ? b.data<double>() : nullptr;
      Tensor y = empty({R, N}, DType::f64), mu = empty({R}, DType::f64), rs = empty({R}, DType::f64);
      Tensor y0 = empty({R, N}, DType::f64), mu0 = empty({R}, DType::f64), rs0 = empty({R}, DType::f64);
      cpu::layer_norm_forward<double>(y.data<double>(), mu.data<double>(), rs.data<double>(), x.data<double>(), wp, bp,
                                      R, N, 1e-5);
      cpu::layer_norm_forward_naive<double>(y0.data<double>(), mu0.data<double>(), rs0.data<double>(),
                                            x.data<double>(), wp, bp, R, N, 1e-5);
      check_close(mu, mu0, 1e-14, 1e-12);
      check_close(rs, rs0, 1e-14, 1e-12);
      check_close(y, y0, 1e-13, 1e-12);
      Tensor dx = zeros({R, N}, DType::f64), dw = zeros({N}, DType::f64), db = zeros({N}, DType::f64);
      Tensor dx0 = zeros({R, N}, DType::f64), dw0 = zeros({N}, DType::f64), db0 = zeros({N}, DType::f64);
      cpu::layer_norm_backward<double>(dx.data<double>(), dw.data<double>(), db.data<double>(), g.data<double>(),
                                       x.data<double>(), wp, mu.data<double>(), rs.data<double>(), R, N);
      cpu::layer_norm_backward_naive<double>(dx0.data<double>(), dw0.data<double>(), db0.data<double>(),
                                             g.data<double>(), x.data<double>(), wp, mu.data<double>(),
                                             rs.data<double>(), R, N);
      check_close(dx, dx0, 1e-12, 1e-10);
      check_close(dw, dw0, 1e-10, 1e-10);
      check_close(db, db0, 1e-10, 1e-10);
      // f32 forward and backward, dx alone (dw, db not wanted) and dw, db alone (dx not wanted)
      Tensor xf = x.to(DType::f32), gf = g.to(DType::f32), wf = w.to(DType::f32);
      const float* wfp = affine ? wf.data<float>() : nullptr;
      Tensor yf = empty({R, N}), muf = empty({R}), rsf = empty({R});
      cpu::layer_norm_forward<float>(yf.data<float>(), muf.data<float>(), rsf.data<float>(), xf.data<float>(), wfp,
                                     nullptr, R, N, 1e-5);
      Tensor yf0 = empty({R, N}), muf0 = empty({R}), rsf0 = empty({R});
      cpu::layer_norm_forward_naive<float>(yf0.data<float>(), muf0.data<float>(), rsf0.data<float>(),
                                           xf.data<float>(), wfp, nullptr, R, N, 1e-5);
      check_close(yf, yf0, 1e-5, 1e-4);
      Tensor dxf = zeros({R, N}), dwf = zeros({N}), dbf = zeros({N});
      cpu::layer_norm_backward<float>(dxf.data<float>(), nullptr, nullptr, gf.data<float>(), xf.data<float>(), wfp,
                                      muf.data<float>(), rsf.data<float>(), R, N);
      cpu::layer_norm_backward<float>(nullptr, dwf.data<float>(), dbf.data<float>(), gf.data<float>(),
                                      xf.data<float>(), wfp, muf.data<float>(), rsf.data<float>(), R, N);
      check_close(dxf, dx0, 1e-4, 1e-3);
      check_close(dwf, dw0, 1e-3, 1e-4);
      check_close(dbf, db0, 1e-3, 1e-4);
    }
}

TEST_CASE("layer_norm: dw and db do not depend on the thread count") {
  ThreadCountRestore restore;
  Tensor x = randn64({3000, 48}, 71).to(DType::f32), w = randn64({48}, 72).to(DType::f32);
  Tensor g = randn64({3000, 48}, 73).to(DType::f32);
  std::vector<Tensor> grads[2];
  for (int t : {1, 2}) {
    set_num_threads(t);
    Tensor xl = x.detach().set_requires_grad(true), wl = w.detach().set_requires_grad(true);
    Tensor bl = zeros({48}).set_requires_grad(true);
    layer_norm(xl, {48}, wl, bl).backward(g);
    grads[t - 1] = {xl.grad(), wl.grad(), bl.grad()};
  }
  for (int i = 0; i < 3; ++i) check_identical(grads[0][i], grads[1][i]);
}

TEST_CASE("layer_norm: errors") {
  Tensor x = zeros({2, 3, 4});
  AG_CHECK_ERROR(layer_norm(x, {3}), "layer_norm", "[3]", "[2,3,4]");
  AG_CHECK_ERROR(layer_norm(x, {2, 4}), "layer_norm", "[2,4]", "last 2 dims");
  AG_CHECK_ERROR(layer_norm(x, {1, 2, 3, 4}), "layer_norm", "[1,2,3,4]", "[2,3,4]");
  AG_CHECK_ERROR(layer_norm(x, {}), "layer_norm", "normalized_shape []");
  AG_CHECK_ERROR(layer_norm(x, {4}, zeros({3})), "layer_norm", "weight", "[3]", "[4]");
  AG_CHECK_ERROR(layer_norm(x, {3, 4}, Tensor(), zeros({4})), "layer_norm", "bias", "[4]", "[3,4]");
  AG_CHECK_ERROR(layer_norm(x, {4}, zeros({4}, DType::f64)), "layer_norm", "weight", "f64", "f32");
  AG_CHECK_ERROR(layer_norm(arange(0, 4, 1, DType::i64), {4}), "layer_norm", "i64");
  AG_CHECK_ERROR(layer_norm(x, {4}, Tensor(), Tensor(), -1.0), "layer_norm", "eps", "-1");
}

// =================================== embedding ================================================
TEST_CASE("embedding: known values, repeated indices accumulate") {
  // w = [[0, 1], [10, 11], [20, 21]], idx = [[2, 0], [2, 1]]: y[i, j] = w[idx[i, j]]
  Tensor w = tensor<float>({0, 1, 10, 11, 20, 21}, {3, 2}).set_requires_grad(true);
  Tensor idx = tensor<int64_t>({2, 0, 2, 1}, {2, 2});
  Tensor y = embedding(w, idx);
  CHECK(y.shape() == Shape{2, 2, 2});
  check_close(y, {20, 21, 0, 1, 20, 21, 10, 11});
  // g[p] = [p, 10 p] for position p = 0..3: dw[v] = sum of g over positions holding v, so
  // dw[0] = g[1] = [1, 10], dw[1] = g[3] = [3, 30], dw[2] = g[0] + g[2] = [2, 20]
  y.backward(tensor<float>({0, 0, 1, 10, 2, 20, 3, 30}, {2, 2, 2}));
  check_close(w.grad(), {1, 10, 3, 30, 2, 20});
  // a 0-dim index picks one row: shape [D]
  check_close(embedding(w.detach(), tensor<int64_t>({1}, {})), {10, 11});
}

TEST_CASE("embedding: gradcheck with repeated indices, transposed weight, used twice") {
  Tensor idx = tensor<int64_t>({1, 3, 1, 1, 4, 0}, {2, 3});
  expect_gradcheck([idx](const std::vector<Tensor>& x) { return embedding(x[0], idx); }, {leaf64({5, 3}, 81)});
  // a transposed weight, and the indices passed as a (non-differentiable) input
  expect_gradcheck([](const std::vector<Tensor>& x) { return embedding(x[0].transpose(0, 1), x[1]); },
                   {leaf64({3, 5}, 82), tensor<int64_t>({4, 4, 2})});
  // w used twice (two lookups and a product with w itself)
  Tensor j = tensor<int64_t>({0, 2, 2});
  expect_gradcheck([idx, j](const std::vector<Tensor>& x) {
    return add(mul(embedding(x[0], j), x[0].narrow(0, 0, 3)), sum(embedding(x[0], idx), {0}));
  }, {leaf64({5, 3}, 83)});
}

TEST_CASE("embedding: the parallel backward is deterministic and matches a sequential scatter-add") {
  ThreadCountRestore restore;
  const int64_t V = 50, D = 40, R = 6000;
  Generator gen(91);
  Tensor idx = randint(0, V, {R}, &gen), g = randn({R, D}, DType::f32, &gen);
  Tensor w = randn({V, D}, DType::f32, &gen);
  // sequential reference in f64
  std::vector<double> ref(size_t(V * D), 0.0);
  std::vector<int64_t> iv = idx.to_vector<int64_t>();
  std::vector<double> gv = g.to_vector<double>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < D; ++j) ref[size_t(iv[r] * D + j)] += gv[size_t(r * D + j)];
  Tensor grads[2];
  for (int t : {1, 2}) {
    set_num_threads(t);
    Tensor wl = w.detach().set_requires_grad(true);
    embedding(wl, idx).backward(g);
    grads[t - 1] = wl.grad();
  }
  check_identical(grads[0], grads[1]);
  check_close(grads[1], ref, 1e-4, 1e-5);
}

TEST_CASE("embedding: errors") {
  Tensor w = zeros({3, 2});
  AG_CHECK_ERROR(embedding(w, tensor<int64_t>({0, 3})), "embedding", "index 3", "V = 3");
  AG_CHECK_ERROR(embedding(w, tensor<int64_t>({-1})), "embedding", "index -1", "V = 3");
  AG_CHECK_ERROR(embedding(zeros({6}), tensor<int64_t>({0})), "embedding", "[V, D]", "[6]");
  AG_CHECK_ERROR(embedding(w, tensor<float>({0.f})), "embedding", "indices", "f32");
  AG_CHECK_ERROR(embedding(arange(0, 6, 1, DType::i64).reshape({3, 2}), tensor<int64_t>({0})), "embedding", "i64");
}

// ================================= cross_entropy ==============================================
TEST_CASE("cross_entropy: known values") {
  // logits [0, 0]: p = [1/2, 1/2], so loss = -log p_t = ln 2 and dlogits = p - onehot(t)
  const double l2 = std::log(2.0);
  Tensor x = tensor<double>({0, 0, 5, 1}, {2, 2}).set_requires_grad(true);
  Tensor t = tensor<int64_t>({0, -100});  // row 1 ignored: "mean" divides by 1 row
  Tensor loss = cross_entropy(x, t);
  CHECK(loss.shape() == Shape{});
  check_close(loss, {l2}, 1e-15, 1e-14);
  loss.backward();
  check_close(x.grad(), {-0.5, 0.5, 0, 0}, 1e-15, 1e-14);
  // label smoothing s = 0.2, C = 2: q = (1 - s) onehot + s/C = [0.9, 0.1]; p is uniform, so the
  // loss is still -(0.9 + 0.1) ln(1/2) = ln 2 and dlogits = p - q = [-0.4, 0.4]
  x.set_grad(Tensor());
  Tensor ls = cross_entropy(x, t, "sum", -100, 0.2);
  check_close(ls, {l2}, 1e-15, 1e-14);
  ls.backward();
  check_close(x.grad(), {-0.4, 0.4, 0, 0}, 1e-15, 1e-14);
  // "none" keeps one loss per row, 0 for an ignored row
  check_close(cross_entropy(x.detach(), t, "none"), {l2, 0}, 1e-15, 1e-14);
}

TEST_CASE("cross_entropy: matches PyTorch (reductions, ignore_index, label smoothing, f32 and f64)") {
  Golden g = load_golden("cross_entropy");
  struct Case {
    const char* name;
    const char* target;
    const char* reduction;
    int64_t ignore_index;
    double smoothing;
  };
  const Case cases[] = {{"mean", "target", "mean", -100, 0.0},         {"sum", "target", "sum", -100, 0.0},
                        {"none", "target", "none", -100, 0.0},         {"mean_ls", "target", "mean", -100, 0.1},
                        {"sum_ls", "target", "sum", -100, 0.25},       {"none_ls", "target", "none", -100, 0.1},
                        {"mean_ig2", "target_ig2", "mean", 2, 0.0},    {"mean_ig2_ls", "target_ig2", "mean", 2, 0.3}};
  for (DType dt : {DType::f32, DType::f64})
    for (const Case& c : cases) {
      Tensor x = g.leaf("logits", dt);
      Tensor y = cross_entropy(x, g.indices(c.target), c.reduction, c.ignore_index, c.smoothing);
      const bool rows = std::string_view(c.reduction) == "none";
      y.backward(g.tensor(rows ? "r_rows" : "r_scalar", dt));
      check_golden(y, g, std::string("loss_") + c.name);
      check_golden(x.grad(), g, std::string("dlogits_") + c.name);
    }
}

TEST_CASE("cross_entropy: gradcheck for each reduction, ignore_index, label smoothing, transposed, used twice") {
  Tensor t = tensor<int64_t>({2, 0, -100, 3, 2});
  for (const char* red : {"mean", "sum", "none"})
    for (double s : {0.0, 0.15}) {
      INFO("reduction " << red << " label_smoothing " << s);
      expect_gradcheck([t, red, s](const std::vector<Tensor>& x) { return cross_entropy(x[0], t, red, -100, s); },
                       {leaf64({5, 4}, 101)});
    }
  // a custom ignore_index (rows with target 2 ignored), the target passed as an input
  expect_gradcheck([](const std::vector<Tensor>& x) { return cross_entropy(x[0], x[1], "mean", 2, 0.1); },
                   {leaf64({5, 4}, 102), tensor<int64_t>({2, 0, 1, 3, 2})});
  // transposed logits, and the same logits in two losses
  expect_gradcheck([t](const std::vector<Tensor>& x) { return cross_entropy(x[0].transpose(0, 1), t); },
                   {leaf64({4, 5}, 103)});
  expect_gradcheck([t](const std::vector<Tensor>& x) {
    return add(cross_entropy(x[0], t, "sum"), mul(cross_entropy(x[0], t, "none", -100, 0.3), x[0].select(1, 0)));
  }, {leaf64({5, 4}, 104)});
}

TEST_CASE("cross_entropy: every row ignored") {
  // "mean" over zero rows is 0/0 = NaN, as in PyTorch; the gradient is 0 everywhere
  Tensor x = tensor<float>({1, 2, 3, 4}, {2, 2}).set_requires_grad(true);
  Tensor t = tensor<int64_t>({-100, -100});
  Tensor loss = cross_entropy(x, t, "mean", -100, 0.1);
  CHECK(std::isnan(loss.item<double>()));
  loss.backward();
  check_close(x.grad(), {0, 0, 0, 0});
  check_close(cross_entropy(x.detach(), t, "sum"), {0.0});
}

TEST_CASE("cross_entropy: errors") {
  Tensor x = zeros({2, 4});
  Tensor t = tensor<int64_t>({0, 1});
  AG_CHECK_ERROR(cross_entropy(x, tensor<int64_t>({0, 4})), "cross_entropy", "target 4", "C = 4");
  AG_CHECK_ERROR(cross_entropy(x, tensor<int64_t>({-1, 0})), "cross_entropy", "target -1", "C = 4");
  AG_CHECK_ERROR(cross_entropy(x, t, "avg"), "cross_entropy", "reduction", "\"avg\"");
  AG_CHECK_ERROR(cross_entropy(zeros({2, 4, 3}), t), "cross_entropy", "[N, C]", "[2,4,3]");
  AG_CHECK_ERROR(cross_entropy(zeros({4}), t), "cross_entropy", "[N, C]", "[4]");
  AG_CHECK_ERROR(cross_entropy(x, tensor<int64_t>({0, 1, 2})), "cross_entropy", "[2]", "[3]");
  AG_CHECK_ERROR(cross_entropy(x, tensor<int64_t>({0, 1}, {1, 2})), "cross_entropy", "[1,2]");
  AG_CHECK_ERROR(cross_entropy(zeros({2, 4}, DType::i64), t), "cross_entropy", "logits", "i64");
  AG_CHECK_ERROR(cross_entropy(x, tensor<float>({0.f, 1.f})), "cross_entropy", "target", "f32");
  AG_CHECK_ERROR(cross_entropy(x, t, "mean", -100, 1.5), "cross_entropy", "label_smoothing", "1.5");
}

// ==================================== dropout =================================================
TEST_CASE("dropout: eval mode and p == 0 return x itself") {
  Tensor x = randn({3, 4}).set_requires_grad(true);
  CHECK(dropout(x, 0.5, false).impl_ptr() == x.impl_ptr());
  CHECK(dropout(x, 0.0, true).impl_ptr() == x.impl_ptr());
}

TEST_CASE("dropout: the mask is Philox(seed, offset + i/4) lane i%4, kept when u >= p") {
  const double p = 0.4;
  Generator gen(1234);
  gen.set_offset(10);
  Tensor x = arange(1, 14, 1, DType::f32);  // 13 elements: 4 Philox blocks, the last partly used
  Tensor y = dropout(x, p, true, &gen);
  CHECK(gen.offset() == 14);  // advanced by ceil(13 / 4)
  std::vector<double> got = y.to_vector<double>();
  int kept = 0;
  for (int i = 0; i < 13; ++i) {
    const float u = uniform01(philox4x32_10(1234, 10 + uint64_t(i / 4)).v[i % 4]);
    const double expect = u >= p ? (i + 1) * float(1 / (1 - p)) : 0.0;
    kept += u >= p;
    CHECK(got[size_t(i)] == doctest::Approx(expect).epsilon(1e-6));
  }
  CHECK(kept > 0);
  CHECK(kept < 13);
  // the next call continues from offset 14: another mask
  std::vector<double> m1 = dropout(ones({64}), p, true, &gen).to_vector<double>();
  CHECK(gen.offset() == 30);
  CHECK(m1 != dropout(ones({64}), p, true, &gen).to_vector<double>());
}

TEST_CASE("dropout: kept fraction near 1 - p, kept values scaled by 1/(1 - p)") {
  const int64_t n = 100000;
  for (double p : {0.1, 0.5, 0.9}) {
    Generator gen(7);
    std::vector<double> y = dropout(ones({n}), p, true, &gen).to_vector<double>();
    int64_t kept = 0;
    bool scaled = true;
    for (double v : y) {
      kept += v != 0;
      scaled &= v == 0 || v == double(float(1.0 / (1.0 - p)));
    }
    // the kept fraction has standard deviation sqrt(p (1-p) / n) <= 0.0016: allow 5 of them
    INFO("p " << p << " kept " << kept);
    CHECK(std::abs(double(kept) / double(n) - (1 - p)) < 0.008);
    CHECK(scaled);
  }
}

TEST_CASE("dropout: same seed, same mask, whatever the thread count") {
  ThreadCountRestore restore;
  Tensor x = randn({300, 500});
  Tensor y[2], dx[2];
  for (int t : {1, 2}) {
    set_num_threads(t);
    Generator gen(99);
    Tensor xl = x.detach().set_requires_grad(true);
    y[t - 1] = dropout(xl, 0.3, true, &gen);
    y[t - 1].backward(ones({300, 500}));
    dx[t - 1] = xl.grad();
  }
  check_identical(y[0], y[1]);
  check_identical(dx[0], dx[1]);
}

TEST_CASE("dropout: backward recomputes the same mask") {
  // x = 1: y = m / (1 - p), and dx = g m / (1 - p) with g = 1 is the same tensor
  Generator gen(5);
  Tensor x = ones({1000}, DType::f64).set_requires_grad(true);
  Tensor y = dropout(x, 0.25, true, &gen);
  gen.advance(100);  // later draws do not change the recorded mask
  y.backward(ones({1000}, DType::f64));
  check_identical(x.grad(), y);
  // a transposed input: elements are numbered in its row-major (logical) order
  Generator g1(6), g2(6);
  Tensor a = randn({4, 6});
  check_identical(dropout(a.mT(), 0.5, true, &g1), dropout(a.mT().contiguous(), 0.5, true, &g2));
}

TEST_CASE("dropout: gradcheck with a fixed generator, used twice") {
  // a fresh generator with the same seed inside f: every evaluation draws the same mask
  expect_gradcheck([](const std::vector<Tensor>& x) {
    Generator gen(17);
    return dropout(x[0], 0.4, true, &gen);
  }, {leaf64({3, 7}, 111)});
  expect_gradcheck([](const std::vector<Tensor>& x) {
    Generator gen(18);
    return mul(dropout(x[0].transpose(0, 1), 0.3, true, &gen), x[0].transpose(0, 1));
  }, {leaf64({4, 5}, 112)});
}

TEST_CASE("dropout: errors") {
  Tensor x = ones({4});
  AG_CHECK_ERROR(dropout(x, 1.0, true), "dropout", "[0, 1)", "1");
  AG_CHECK_ERROR(dropout(x, -0.1, true), "dropout", "-0.1");
  AG_CHECK_ERROR(dropout(x, 1.5, false), "dropout", "1.5");
  AG_CHECK_ERROR(dropout(x, std::nan(""), true), "dropout", "nan");
  AG_CHECK_ERROR(dropout(arange(0, 4, 1, DType::i64), 0.5, true), "dropout", "i64");
}

// ===================================== gelu ===================================================
TEST_CASE("gelu: matches PyTorch, exact and tanh forms (f32 and f64)") {
  Golden g = load_golden("gelu");
  for (DType dt : {DType::f32, DType::f64})
    for (const char* approx : {"none", "tanh"}) {
      Tensor x = g.leaf("x", dt);
      Tensor y = gelu(x, approx);
      y.backward(g.tensor("r", dt));
      check_golden(y, g, std::string("y_") + approx);
      check_golden(x.grad(), g, std::string("dx_") + approx);
    }
}
