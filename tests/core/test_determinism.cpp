// Determinism on the CPU: the same computation at 1, 2, 3 and 4 threads gives the same bits, outputs
// and gradients alike (compared with memcmp, not a tolerance). Each case runs one kernel family on
// inputs big enough to be split over the threads (above its grain), so a result that depended on
// where the split falls (a partial sum per thread, or a vector loop whose scalar tail moves with the
// chunk boundary) would differ. 4 threads on a 2-core machine is fine: correctness, not speed.
#include <cstdlib>
#include <cstring>

#include "core/kernels.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "tests/helpers.h"

using namespace ag;

namespace {

// Restores the thread count (and the determinism switch) a test case changes.
struct ThreadsGuard {
  int threads = num_threads();
  bool deterministic = is_deterministic();
  ThreadsGuard(const ThreadsGuard&) = delete;
  ThreadsGuard() = default;
  ~ThreadsGuard() {
    set_num_threads(threads);
    set_deterministic(deterministic);
  }
};

// The raw bytes of a tensor's elements in row-major order.
std::string bytes_of(const Tensor& t) {
  if (!t.defined()) return "<undefined>";
  Tensor c = t.detach().contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), c.nbytes());
}

// Runs f (which returns the tensors to compare: outputs, then gradients) at 1 thread and at 2, 3 and
// 4, and checks that every tensor has the same bytes. The first differing tensor and element are
// named in the failure.
void expect_thread_independent(const std::function<std::vector<Tensor>()>& f) {
  ThreadsGuard guard;
  set_deterministic(true);
  set_num_threads(1);
  std::vector<std::string> ref;
  for (const Tensor& t : f()) ref.push_back(bytes_of(t));
  for (int nt : {2, 3, 4}) {
    set_num_threads(nt);
    std::vector<Tensor> got = f();
    REQUIRE(got.size() == ref.size());
    for (size_t k = 0; k < got.size(); ++k) {
      const std::string b = bytes_of(got[k]);
      size_t first = 0;
      while (first < b.size() && first < ref[k].size() && b[first] == ref[k][first]) ++first;
      INFO(fmt::format("threads {}: tensor {} of {} ({} bytes) first differs at byte {}", nt, k, got.size(),
                       b.size(), first));
      CHECK((b.size() == ref[k].size() && std::memcmp(b.data(), ref[k].data(), b.size()) == 0));
    }
  }
}

// A seeded leaf of the given dtype that requires grad.
Tensor leaf(const Shape& shape, uint64_t seed, DType dtype = DType::f32, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(shape, dtype, &g), scale).detach().set_requires_grad(true);
}

// sum(r * y) with a fixed random r, so the gradient reaching y is not all ones.
Tensor project(const Tensor& y, uint64_t seed = 99) {
  Generator g(seed);
  return sum(mul(y, randn(y.shape(), y.dtype(), &g)));
}

// backward of loss, then {outputs..., grads of inputs...}
std::vector<Tensor> with_grads(std::vector<Tensor> outs, const Tensor& loss, const std::vector<Tensor>& inputs) {
  backward(loss);
  for (const Tensor& x : inputs) outs.push_back(x.grad());
  return outs;
}

constexpr DType kBoth[] = {DType::f32, DType::f64};

}  // namespace

TEST_CASE("threads: set_num_threads refuses 0 and more than max_threads(), and keeps the count it had") {
  const int before = num_threads();
  CHECK(max_threads() >= 16);
  CHECK(max_threads() >= 4 * omp_get_num_procs());
  AG_CHECK_ERROR(set_num_threads(0), "set_num_threads", "got 0");
  AG_CHECK_ERROR(set_num_threads(100000), "set_num_threads", "got 100000");
  AG_CHECK_ERROR(set_num_threads(max_threads() + 1), "set_num_threads");
  CHECK(num_threads() == before);
  set_num_threads(3);
  CHECK(num_threads() == 3);
  set_num_threads(before);
}

TEST_CASE("determinism: the switch is off by default, and set_deterministic sets it") {
  ThreadsGuard guard;
  if (!std::getenv("ATTOGRAD_DETERMINISTIC")) CHECK_FALSE(is_deterministic());
  set_deterministic(true);
  CHECK(is_deterministic());
  set_deterministic(false);
  CHECK_FALSE(is_deterministic());
}

// ---- elementwise: the flat loop splits one range over threads; vector and scalar forms of exp,
// log, tanh, erf (libmvec against libm) may round differently, so the chunk bounds must not move
// the scalar remainder. 100003 elements: three chunks above kGrain, none a multiple of the width.
TEST_CASE("determinism: elementwise unary ops, contiguous and strided") {
  for (DType dt : kBoth) {
    CAPTURE(dt);
    expect_thread_independent([&] {
      Tensor x = leaf({100003}, 1, dt), xp = leaf({100003}, 2, dt);
      Tensor pos = add(mul(xp, xp), 0.5);  // > 0 for log, sqrt, pow
      std::vector<Tensor> ys = {exp(x),   log(pos), tanh(x),          sigmoid(x), gelu(x),
                                gelu(x, "tanh"), silu(x), sqrt(pos), pow(pos, 1.7), rsqrt(pos)};
      Tensor loss = project(ys[0]);
      for (size_t k = 1; k < ys.size(); ++k) loss = add(loss, project(ys[k], 100 + k));
      return with_grads(ys, loss, {x, xp});
    });
    // contiguous but not aligned: a view starting one element in
    expect_thread_independent([&] {
      Tensor v = leaf({100004}, 5, dt);
      Tensor x = slice(v, 0, 1, 100004);
      std::vector<Tensor> ys = {exp(x), tanh(x), gelu(x), log(add(mul(x, x), 1.0))};
      Tensor loss = add(add(project(ys[0]), project(ys[1], 5)), add(project(ys[2], 6), project(ys[3], 7)));
      return with_grads(ys, loss, {v});
    });
    // strided: a transposed matrix (rows split over threads) and a step-3 slice (one strided row
    // split over threads)
    expect_thread_independent([&] {
      Tensor a = leaf({301, 337}, 3, dt), v = leaf({300009}, 4, dt);
      Tensor at = transpose(a, 0, 1), vs = slice(v, 0, 0, 300009, 3);
      std::vector<Tensor> ys = {exp(at), tanh(at), gelu(vs), log(add(mul(vs, vs), 1.0))};
      Tensor loss = add(add(project(ys[0]), project(ys[1], 5)), add(project(ys[2], 6), project(ys[3], 7)));
      return with_grads(ys, loss, {a, v});
    });
  }
}

// ---- binary ops with broadcasting: the backward of a broadcast operand is a column sum (sum_to).
TEST_CASE("determinism: broadcast binary ops and their sum_to backward") {
  for (DType dt : kBoth) {
    CAPTURE(dt);
    expect_thread_independent([&] {
      Tensor x = leaf({700, 150}, 1, dt), b = leaf({150}, 2, dt), c = leaf({700, 1}, 3, dt);
      Tensor y = div(mul(add(x, b), c), add(mul(b, b), 1.0));
      Tensor z = pow(add(mul(x, x), 1.0), add(mul(c, c), 0.5));
      return with_grads({y, z}, add(project(y), project(z, 5)), {x, b, c});
    });
  }
}

// ---- reductions: the whole-tensor sum adds fixed blocks; row and column sums keep each output
// element on one thread.
TEST_CASE("determinism: sum, mean, var, max over all and over each axis") {
  for (DType dt : kBoth) {
    CAPTURE(dt);
    expect_thread_independent([&] {
      Tensor x = leaf({90001}, 1, dt, 3.0), m = leaf({400, 333}, 2, dt);
      std::vector<Tensor> ys = {sum(x),          mean(x),         var(x),         sum(m, {0}),
                                sum(m, {1}),     mean(m, {0}),    var(m, {1}),    max(m, {0}),
                                max(m, {1}),     sum(transpose(m, 0, 1), {1}), mean(m)};
      Tensor loss = ys[0];
      for (size_t k = 1; k < ys.size(); ++k) loss = add(loss, project(ys[k], 100 + k));
      return with_grads(ys, loss, {x, m});
    });
  }
}

// ---- matmul / linear: f32 on attograd's sgemm (rows split for tall C, columns for M <= 4),
// f64 on OpenBLAS's dgemm, and the weight and bias gradients summed over all rows.
TEST_CASE("determinism: matmul and linear, forward and backward") {
  for (DType dt : kBoth) {
    CAPTURE(dt);
    expect_thread_independent([&] {
      Tensor a = leaf({301, 130}, 1, dt), b = leaf({130, 97}, 2, dt);          // tall: rows split
      Tensor s = leaf({3, 700}, 3, dt), w = leaf({700, 450}, 4, dt);           // M = 3: columns split
      Tensor ba = leaf({6, 50, 64}, 5, dt), bb = leaf({64, 70}, 6, dt);         // batch, b broadcast
      Tensor at = leaf({130, 301}, 7, dt);                                      // transposed operand
      Tensor y1 = matmul(a, b), y2 = matmul(s, w), y3 = matmul(ba, bb), y4 = matmul(transpose(at, 0, 1), b);
      Tensor loss = add(add(project(y1), project(y2, 5)), add(project(y3, 6), project(y4, 7)));
      return with_grads({y1, y2, y3, y4}, loss, {a, b, s, w, ba, bb, at});
    });
    expect_thread_independent([&] {
      Tensor x = leaf({8, 96, 64}, 1, dt), w = leaf({200, 64}, 2, dt), bias = leaf({200}, 3, dt);
      Tensor x1 = leaf({2, 640}, 4, dt), w1 = leaf({480, 640}, 5, dt), b1 = leaf({480}, 6, dt);
      Tensor y = linear(x, w, bias), y1 = linear(x1, w1, b1);
      return with_grads({y, y1}, add(project(y), project(y1, 7)), {x, w, bias, x1, w1, b1});
    });
  }
}

// ---- matmul on OpenBLAS: its bits depend on the rows of C a call gets ([37,700]@[700,97] cut for
// 4 threads differs from one call), so deterministic mode cuts C by the sizes alone.
TEST_CASE("determinism: matmul on OpenBLAS (sgemm kernel openblas, f64 dgemm) in deterministic mode") {
  const cpu::GemmKernel prev = cpu::sgemm_kernel();
  for (DType dt : kBoth) {
    CAPTURE(dt);
    cpu::set_sgemm_kernel(cpu::GemmKernel::openblas);  // f64 is always on OpenBLAS
    expect_thread_independent([&] {
      Tensor a = leaf({37, 700}, 1, dt), b = leaf({700, 97}, 2, dt);
      Tensor c = leaf({37, 64}, 3, dt), d = leaf({64, 450}, 4, dt);
      Tensor y = matmul(a, b), z = matmul(c, d);
      return with_grads({y, z}, add(project(y), project(z, 5)), {a, b, c, d});
    });
    cpu::set_sgemm_kernel(prev);
  }
}

// ---- softmax / log_softmax over the last dim (rows) and over dim 0 (column blocks)
TEST_CASE("determinism: softmax and log_softmax") {
  for (DType dt : kBoth) {
    CAPTURE(dt);
    expect_thread_independent([&] {
      Tensor x = leaf({300, 257}, 1, dt, 2.0);
      std::vector<Tensor> ys = {softmax(x, -1), log_softmax(x, -1), softmax(x, 0), log_softmax(x, 0)};
      Tensor loss = add(add(project(ys[0]), project(ys[1], 5)), add(project(ys[2], 6), project(ys[3], 7)));
      return with_grads(ys, loss, {x});
    });
  }
}

// ---- layer_norm: dw, db are sums over all rows (fixed blocks of rows)
TEST_CASE("determinism: layer_norm forward and backward, dw and db over many rows") {
  for (DType dt : kBoth) {
    CAPTURE(dt);
    expect_thread_independent([&] {
      Tensor x = leaf({2000, 96}, 1, dt, 2.0), w = leaf({96}, 2, dt), b = leaf({96}, 3, dt);
      Tensor y = layer_norm(x, {96}, w, b), y0 = layer_norm(x, {96});
      return with_grads({y, y0}, add(project(y), project(y0, 5)), {x, w, b});
    });
  }
}

// ---- embedding and index_select: the backward is a scatter-add, many positions per row
TEST_CASE("determinism: embedding and index_select backward with repeated indices") {
  for (DType dt : kBoth) {
    CAPTURE(dt);
    expect_thread_independent([&] {
      Generator g(11);
      Tensor idx = randint(0, 50, {64, 130}, &g), sel = randint(0, 20, {300}, &g);
      Tensor w = leaf({50, 72}, 1, dt), x = leaf({6, 20, 300}, 2, dt);
      Tensor y = embedding(w, idx), z = index_select(x, 1, sel);
      return with_grads({y, z}, add(project(y), project(z, 5)), {w, x});
    });
  }
}

// ---- cross_entropy: the mean over rows, label smoothing, ignored rows
TEST_CASE("determinism: cross_entropy mean, sum and none") {
  for (DType dt : kBoth) {
    CAPTURE(dt);
    expect_thread_independent([&] {
      Generator g(12);
      Tensor logits = leaf({700, 211}, 1, dt, 3.0);
      Tensor target = randint(0, 211, {700}, &g);
      std::vector<int64_t> t = target.to_vector<int64_t>();
      for (size_t i = 0; i < t.size(); i += 7) t[i] = -100;
      target = from_vector(t, {700});
      Tensor l1 = cross_entropy(logits, target), l2 = cross_entropy(logits, target, "sum", -100, 0.1);
      Tensor l3 = cross_entropy(logits, target, "none");
      return with_grads({l1, l2, l3}, add(add(l1, mul(l2, 0.01)), project(l3)), {logits});
    });
  }
}

// ---- fused attention: forward splits (head, query block), backward heads; causal, dropout
TEST_CASE("determinism: scaled_dot_product_attention with causal mask and dropout") {
  for (DType dt : kBoth) {
    CAPTURE(dt);
    expect_thread_independent([&] {
      Tensor q = leaf({2, 3, 100, 16}, 1, dt), k = leaf({2, 3, 100, 16}, 2, dt), v = leaf({2, 3, 100, 16}, 3, dt);
      Generator g(13);
      SdpaOptions o;
      o.causal = true;
      o.dropout = 0.2;
      o.generator = &g;
      Tensor y = scaled_dot_product_attention(q, k, v, o).out;
      Tensor y2 = scaled_dot_product_attention(q, k, v).out;
      return with_grads({y, y2}, add(project(y), project(y2, 5)), {q, k, v});
    });
  }
}

// ---- dropout masks and random tensors: counter-based Philox, independent of the split
TEST_CASE("determinism: dropout, rand, randn, randint") {
  for (DType dt : kBoth) {
    CAPTURE(dt);
    expect_thread_independent([&] {
      Generator g(14);
      Tensor x = leaf({100003}, 1, dt);
      Tensor y = dropout(x, 0.3, true, &g);
      Tensor r = rand({100003}, dt, &g), n = randn({100001}, dt, &g), i = randint(-5, 1000, {100001}, &g);
      return with_grads({y, r, n, i}, project(y), {x});
    });
  }
}

// ---- optimizers and clipping: the global norm adds fixed blocks; the updates are elementwise
TEST_CASE("determinism: clip_grad_norm and AdamW step") {
  for (DType dt : kBoth) {
    CAPTURE(dt);
    expect_thread_independent([&] {
      Tensor p1 = leaf({150001}, 1, dt).detach(), p2 = leaf({300, 170}, 2, dt).detach();
      p1.set_requires_grad(true), p2.set_requires_grad(true);
      optim::AdamW opt({p1, p2}, {.lr = 1e-2});
      std::vector<Tensor> norms;
      for (int step = 0; step < 2; ++step) {
        p1.set_grad(leaf({150001}, 10 + step, dt, 3.0).detach());
        p2.set_grad(leaf({300, 170}, 20 + step, dt, 3.0).detach());
        const double n2 = optim::clip_grad_norm({p1, p2}, 1.0), ninf = optim::clip_grad_norm({p1, p2}, 0.5, INFINITY);
        norms.push_back(from_vector(std::vector<double>{n2, ninf}));
        opt.step();
      }
      norms.push_back(p1.detach());
      norms.push_back(p2.detach());
      return norms;
    });
  }
}

// ---- end to end: a tiny causal transformer (embedding, MHA, layer norm, GELU MLP, dropout,
// cross-entropy), trained a few AdamW steps with gradient clipping: losses and parameters bitwise
// equal at every thread count.
TEST_CASE("determinism: tiny transformer trained with AdamW, dropout and clipping") {
  expect_thread_independent([] {
    constexpr int64_t V = 61, D = 32, H = 4, T = 48, B = 6;
    Generator g(2024);
    nn::Embedding tok(V, D, std::nullopt, DType::f32, &g), pos(T, D, std::nullopt, DType::f32, &g);
    const nn::TransformerBlock::Options block{.mlp_hidden = 4 * D, .dropout = 0.1, .causal = true, .generator = &g};
    nn::TransformerBlock b1(D, H, block), b2(D, H, block);
    nn::LayerNorm ln(D);
    nn::Linear head(D, V, true, DType::f32, &g);
    std::vector<Tensor> params;
    for (nn::Module* m : std::initializer_list<nn::Module*>{&tok, &pos, &b1, &b2, &ln, &head})
      for (const Tensor& p : m->parameters()) params.push_back(p);
    optim::AdamW opt(params, {.lr = 3e-3});
    Generator data(7);
    Tensor positions = arange(0, T, 1, DType::i64);
    std::vector<Tensor> out;
    for (int step = 0; step < 4; ++step) {
      Tensor seq = randint(0, V, {B, T + 1}, &data);
      Tensor x = slice(seq, 1, 0, T), y = slice(seq, 1, 1, T + 1).contiguous();
      Tensor h = add(tok(x), pos(positions));
      h = b2.forward(b1.forward(h));
      Tensor logits = head.forward(ln.forward(h));
      Tensor loss = cross_entropy(logits.reshape({B * T, V}), y.reshape({B * T}));
      opt.zero_grad();
      backward(loss);
      const double norm = optim::clip_grad_norm(params, 0.5);
      opt.step();
      out.push_back(loss.detach());
      out.push_back(from_vector(std::vector<double>{norm}));
    }
    for (const Tensor& p : params) out.push_back(p.detach());
    return out;
  });
}
