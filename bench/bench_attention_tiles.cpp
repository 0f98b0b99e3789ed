// The fused attention kernels alone (cpu::attention_forward, cpu::attention_backward in
// core/cpu/attention.cpp), forward and backward timed apart, without the tape or allocations:
// where the time of bench_attention's fused column goes, and the GFLOP/s each half reaches. Then
// the whole op, fused against unfused, as bench_attention times it but in CPU time.
//
//   bench_attention_tiles [--batch 32] [--heads 4] [--T 256] [--d 32] [--reps 20] [--bf16 [--rounds 3]]
//
// Also the CPU time summed over threads (std::clock), steadier than wall time on a loaded machine
// (with OMP_WAIT_POLICY=passive waiting threads add little to it).
//
// Before timing, each mask is checked against a plain-loop reference in double on the first and
// the last head (max abs error printed): the benchmark's shapes (d = 32) are larger than the tests'.
//
// FLOPs counted as the GEMMs only (2 per multiply-add): forward S = Q K^T and O = P V; backward
// S again, dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q. Causal: the visible half of each.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>
#include <random>
#include <vector>

#include "apps/common/run.h"
#include "attograd.h"
#include "bench/bench_util.h"
#include "core/kernels.h"

using namespace ag;

// Median CPU seconds (all threads) of fn() over reps runs, after one warm-up.
template <class F>
double median_cpu_seconds(F&& fn, int reps) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const std::clock_t a = std::clock();
    fn();
    t.push_back(double(std::clock() - a) / CLOCKS_PER_SEC);
  }
  return bench::median(std::move(t));
}

// Attention of one head in double, the textbook way: out (T, D) and the gradients (T, D) for dout.
struct HeadReference {
  std::vector<double> out, dq, dk, dv;
};
HeadReference attention_head_naive(const float* q, const float* k, const float* v, const float* dout, int64_t T,
                                   int64_t D, double scale, bool causal) {
  const size_t n = size_t(T * D), nt = size_t(T);
  HeadReference r{std::vector<double>(n), std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
  std::vector<double> p(nt), dp(nt);
  for (int64_t i = 0; i < T; ++i) {
    const int64_t nk = causal ? i + 1 : T;  // keys query i sees
    double mx = -1e300, sum = 0, pdp = 0;
    for (int64_t j = 0; j < nk; ++j) {
      double s = 0;
      for (int64_t c = 0; c < D; ++c) s += double(q[i * D + c]) * k[j * D + c];
      p[j] = s * scale, mx = std::max(mx, p[j]);
    }
    for (int64_t j = 0; j < nk; ++j) p[j] = std::exp(p[j] - mx), sum += p[j];
    for (int64_t j = 0; j < nk; ++j) {
      p[j] /= sum;
      dp[j] = 0;
      for (int64_t c = 0; c < D; ++c) {
        r.out[i * D + c] += p[j] * v[j * D + c];
        r.dv[j * D + c] += p[j] * dout[i * D + c];
        dp[j] += double(dout[i * D + c]) * v[j * D + c];
      }
      pdp += p[j] * dp[j];
    }
    for (int64_t j = 0; j < nk; ++j) {
      const double ds = p[j] * (dp[j] - pdp) * scale;
      for (int64_t c = 0; c < D; ++c) {
        r.dq[i * D + c] += ds * k[j * D + c];
        r.dk[j * D + c] += ds * q[i * D + c];
      }
    }
  }
  return r;
}

// --bf16: cpu::attention_forward_16 / attention_backward_16 on bf16 q, k, v (what bf16 autocast
// keeps) under autocast's rule (dout rounded to bf16, AttentionGeom::grad_operands bf16), with the
// products of bf16 operands on VDPBF16PS (native, ag::cpu::sbgemm_native: the scores, and in
// backward dO V^T, dS K, dS^T Q) and with the f32 tile products of the widened values (emulated),
// alternating; each path's outputs are compared once, before timing (they differ by f32 rounding
// only). Medians of wall time per round.
int bench_bf16(int64_t B, int64_t H, int64_t T, int64_t D, int reps, int rounds) {
  if (!cpu::sbgemm_supported()) {
    fmt::print(stderr, "bench_attention_tiles --bf16: this CPU has no AVX512-BF16 (avx512_bf16)\n");
    return 2;
  }
  const int64_t BH = B * H, n = BH * T * D;
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  const size_t sz = static_cast<size_t>(n);
  std::vector<bf16> q(sz), k(sz), v(sz);
  for (auto* x : {&q, &k, &v})
    for (bf16& e : *x) e = bf16(normal(rng));
  std::vector<float> dout(sz), out(sz), lse(static_cast<size_t>(BH * T)), dq(sz), dk(sz), dv(sz);
  for (float& e : dout) e = pw::round_bf16(normal(rng));  // as the op hands it to the kernel
  fmt::print("attograd bench_attention_tiles --bf16: B {} H {} T {} d {}, bf16 q, k, v, {} threads, OMP_WAIT_POLICY {}\n\n",
             B, H, T, D, num_threads(), bench::omp_wait_policy());
  fmt::print("{:<8} {:<9} {:>6} {:>12} {:>10} {:>13} {:>11}\n", "mask", "products", "round", "forward ms", "GFLOP/s",
             "backward ms", "GFLOP/s");
  const bool before = cpu::sbgemm_native();
  for (bool causal : {false, true}) {
    cpu::AttentionGeom g;
    g.BH = BH, g.H = H, g.Tq = T, g.Tk = T, g.D = D, g.Dv = D;
    g.scale = 1.0 / std::sqrt(double(D));
    g.causal = causal, g.grad_operands = Precision::bf16;
    const double pairs = causal ? double(T) * (T + 1) / 2 : double(T) * T;
    const double gemm = 2.0 * double(BH) * pairs * double(D);
    auto forward = [&] { cpu::attention_forward_16(out.data(), lse.data(), q.data(), k.data(), v.data(), g); };
    auto backward = [&] {
      cpu::attention_backward_16(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                 out.data(), lse.data(), g);
    };
    // the two paths' results, once: out and dq from zeros
    std::vector<float> results[2];
    for (bool native : {false, true}) {
      cpu::set_sbgemm_native(native);
      std::fill(dq.begin(), dq.end(), 0.f);
      forward(), backward();
      results[native] = out;
      results[native].insert(results[native].end(), dq.begin(), dq.end());
    }
    double worst = 0, scale = 0;
    for (size_t i = 0; i < results[0].size(); ++i)
      worst = std::max(worst, double(std::abs(results[1][i] - results[0][i]))),
      scale = std::max(scale, double(std::abs(results[0][i])));
    for (int r = 0; r < rounds; ++r)
      for (bool native : r % 2 ? std::vector<bool>{true, false} : std::vector<bool>{false, true}) {
        cpu::set_sbgemm_native(native);
        const double fwd = bench::median_seconds(forward, reps, 2), bwd = bench::median_seconds(backward, reps, 2);
        const char* path = native ? "native" : "emulated";
        fmt::print("{:<8} {:<9} {:>6} {:>12.2f} {:>10.1f} {:>13.2f} {:>11.1f}\n", causal ? "causal" : "none", path, r,
                   fwd * 1e3, 2 * gemm / fwd / 1e9, bwd * 1e3, 5 * gemm / bwd / 1e9);
        fmt::print("{{\"bench\":\"attention_tiles_bf16\",\"B\":{},\"H\":{},\"T\":{},\"d\":{},\"mask\":\"{}\","
                   "\"scores\":\"{}\",\"round\":{},\"threads\":{},\"forward_ms\":{:.4f},\"backward_ms\":{:.4f},"
                   "\"max_diff_native_emulated\":{:.3e},\"max_abs\":{:.3e}}}\n",
                   B, H, T, D, causal ? "causal" : "none", path, r, num_threads(), fwd * 1e3, bwd * 1e3, worst, scale);
      }
  }
  cpu::set_sbgemm_native(before);
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"attograd: fused attention kernels, forward and backward apart"};
  int64_t B = 32, H = 4, T = 256, D = 32;
  int reps = 20;
  app.add_option("--batch", B, "batch")->check(CLI::PositiveNumber);
  app.add_option("--heads", H, "heads")->check(CLI::PositiveNumber);
  app.add_option("--T", T, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--d", D, "head size")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed repetitions (median reported)")->check(CLI::PositiveNumber);
  bool bf16_only = false;
  int rounds = 3;
  app.add_flag("--bf16", bf16_only,
               "instead: the kernels on bf16 q, k, v under bf16 autocast's rule, the products of bf16 operands on "
               "AVX512-BF16 (native) against f32 products of the widened values (emulated), in alternating rounds; "
               "a table and one JSON line each");
  app.add_option("--rounds", rounds, "--bf16: alternating rounds of the two paths")->check(CLI::PositiveNumber);
  if (const int rc = ag::apps::parse_command_line(app, argc, argv, "bench_attention_tiles"); rc >= 0) return rc;
  if (bf16_only) return bench_bf16(B, H, T, D, reps, rounds);

  const int64_t BH = B * H, n = BH * T * D;
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  auto random_floats = [&](int64_t size) {
    std::vector<float> x(size_t(size), 0.f);
    for (float& e : x) e = normal(rng);
    return x;
  };
  std::vector<float> q = random_floats(n), k = random_floats(n), v = random_floats(n), dout = random_floats(n);
  const size_t sz = size_t(n);
  std::vector<float> out(sz), lse(size_t(BH * T)), dq(sz), dk(sz), dv(sz);

  fmt::print("attograd bench_attention_tiles: B {} H {} T {} d {}, f32, {} threads, OMP_WAIT_POLICY {}\n\n", B, H, T,
             D, num_threads(), bench::omp_wait_policy());
  fmt::print("{:<8} {:>12} {:>10} {:>13} {:>11} {:>12} {:>13}\n", "mask", "forward ms", "GFLOP/s", "backward ms",
             "GFLOP/s", "fwd CPU ms", "bwd CPU ms");
  double max_err = 0;  // of out, dq, dk, dv against attention_head_naive
  for (bool causal : {false, true}) {
    cpu::AttentionGeom g;
    g.BH = BH, g.H = H, g.Tq = T, g.Tk = T, g.D = D, g.Dv = D;
    g.scale = 1.0 / std::sqrt(double(D));
    g.causal = causal, g.grad_operands = Precision::bf16;
    const double pairs = causal ? double(T) * (T + 1) / 2 : double(T) * T;  // visible (query, key) pairs
    const double gemm = 2.0 * double(BH) * pairs * double(D);              // FLOPs of one GEMM
    {  // correctness at these shapes, before timing
      std::fill(dq.begin(), dq.end(), 0.f), std::fill(dk.begin(), dk.end(), 0.f), std::fill(dv.begin(), dv.end(), 0.f);
      cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), g);
      cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                              lse.data(), g);
      for (int64_t bh : {int64_t(0), BH - 1}) {
        const int64_t o = bh * T * D;
        HeadReference r = attention_head_naive(q.data() + o, k.data() + o, v.data() + o, dout.data() + o, T, D, g.scale,
                                               causal);
        for (int64_t e = 0; e < T * D; ++e) {
          max_err = std::max({max_err, std::abs(out[size_t(o + e)] - r.out[size_t(e)]),
                              std::abs(dq[size_t(o + e)] - r.dq[size_t(e)]), std::abs(dk[size_t(o + e)] - r.dk[size_t(e)]),
                              std::abs(dv[size_t(o + e)] - r.dv[size_t(e)])});
        }
      }
    }
    auto forward = [&] { cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), g); };
    auto backward = [&] {
      cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                              lse.data(), g);
    };
    const double fwd = bench::median_seconds(forward, reps, 2), bwd = bench::median_seconds(backward, reps, 2);
    const double fwd_cpu = median_cpu_seconds(forward, reps), bwd_cpu = median_cpu_seconds(backward, reps);
    fmt::print("{:<8} {:>12.2f} {:>10.1f} {:>13.2f} {:>11.1f} {:>12.2f} {:>13.2f}\n", causal ? "causal" : "none",
               fwd * 1e3, 2 * gemm / fwd / 1e9, bwd * 1e3, 5 * gemm / bwd / 1e9, fwd_cpu * 1e3, bwd_cpu * 1e3);
  }
  fmt::print("\nmax |fused - naive double reference| over out, dq, dk, dv (heads 0 and {}): {:.2e}\n", BH - 1, max_err);

  // The whole op, forward + backward through the tape, as bench_attention times it, in CPU time:
  // the fused op against the same attention written with attograd's ops (matmul, masked_fill,
  // softmax, matmul). On a loaded machine this ratio is steadier than one of wall times.
  Generator gen(0);
  Tensor tq = randn({B, H, T, D}, DType::f32, &gen).set_requires_grad(true);
  Tensor tk = randn({B, H, T, D}, DType::f32, &gen).set_requires_grad(true);
  Tensor tv = randn({B, H, T, D}, DType::f32, &gen).set_requires_grad(true);
  Tensor tg = randn({B, H, T, D}, DType::f32, &gen);
  Tensor future = gt(arange(0, double(T)).reshape({1, T}), arange(0, double(T)).reshape({T, 1}));  // j > i
  auto op_step = [&](bool fused, bool causal) {
    tq.set_grad(Tensor()), tk.set_grad(Tensor()), tv.set_grad(Tensor());
    if (fused) {
      SdpaOptions o;
      o.causal = causal;
      scaled_dot_product_attention(tq, tk, tv, o).out.backward(tg);
    } else {
      Tensor s = mul(matmul(tq, tk.mT()), 1.0 / std::sqrt(double(D)));
      if (causal) s = masked_fill(s, future, -std::numeric_limits<double>::infinity());
      matmul(softmax(s, -1), tv).backward(tg);
    }
  };
  fmt::print("\n{:<8} {:>14} {:>16} {:>8}\n", "mask", "fused CPU ms", "unfused CPU ms", "speedup");
  for (bool causal : {false, true}) {
    const double f = median_cpu_seconds([&] { op_step(true, causal); }, reps);
    const double u = median_cpu_seconds([&] { op_step(false, causal); }, reps);
    fmt::print("{:<8} {:>14.2f} {:>16.2f} {:>8.2f}\n", causal ? "causal" : "none", f * 1e3, u * 1e3, u / f);
  }
  return max_err < 1e-4 ? 0 : 1;
}
