// bench_matmul: ag::matmul on attograd's own sgemm against OpenBLAS, f32, on the products the app
// models run (forward, and the two backward GEMMs dX = dY W^T-style and dW = X^T dY), plus squares.
//
// For each shape op(A) [M,K] @ op(B) [K,N] (TN: A stored (K, M) and read transposed):
//   raw       cblas_sgemm with OpenBLAS's own threads (openblas_set_num_threads(ag::num_threads()))
//   ag+oblas  ag::matmul with sgemm switched to OpenBLAS (set_sgemm_kernel(openblas)): attograd's
//             pool splits the rows, OpenBLAS single-threaded inside
//   ag        ag::matmul on attograd's own sgemm (kernel chosen at first use, printed below)
//   ratio     ag / raw, and ag / ag+oblas
// Then the same products on one thread (ours vs OpenBLAS, both in ag::matmul): the micro-kernel's
// efficiency without threading effects. Times are medians over >= 20 runs after warm-up, taken in
// two interleaved rounds with pauses in between, so that neither side runs while the other's idle
// threads still spin. Run with libgomp's default wait policy (OMP_WAIT_POLICY unset) or with
// OMP_PROC_BIND=true: with OMP_WAIT_POLICY=passive a woken OpenMP worker is often placed on the core
// of the thread that woke it, and the "ag" columns of the short-K products then run at one core's
// speed (docs/benchmarks.md). `env -u OPENBLAS_CORETYPE` lets OpenBLAS pick its AVX-512
// (Cooperlake/SkylakeX) kernels instead of Haswell's AVX2 ones.
// With --bf16 (on a CPU with AVX512-BF16), instead: the products of one Linear layer (forward
// y = x W^T, "NT": W stored (N, K); dX, NN; dW, TN) and large squares in ag::matmul three ways,
// at the thread count and then on one thread: f32; bf16 autocast emulated (operands rounded into
// copies, the f32 GEMM); bf16 autocast native (ag::cpu::sbgemm: rounding while packing,
// VDPBF16PS). --json PATH appends one JSON line per measured row. It first measures this CPU's
// peak for the two kernels' instructions (peak_gflops below) and gives the f32 and the native
// column of each row as a share of its instruction's peak: how much a faster micro-kernel could
// still give at that shape.
// Usage: bench_matmul [min_reps] [--bf16] [--json PATH]   (OMP_NUM_THREADS sets attograd's threads)
#include <cblas.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "attograd.h"
#include "bench/bench_util.h"

namespace {

using Clock = std::chrono::steady_clock;
using bench::seconds_of;

void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

struct Variant {
  const char* name;
  std::function<void()> run;
  std::vector<double> times;
};

// The median, the mean of the two middle values for an even count (bench::median takes the upper
// one): the definition behind the figures of docs/benchmarks.md, "GEMM".
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Shape {
  const char* model;  // which app model runs it ("" for the squares)
  bool ta;            // A stored (K, M) and read transposed: the dW = X^T dY products
  int64_t M, K, N;
  bool tb = false;    // B stored (N, K) and read transposed: a Linear's forward x W^T
};

// Medians in GFLOP/s of the variants, measured as described at the top.
std::vector<double> measure(const Shape& s, std::vector<Variant>& vs, int min_reps, int nt) {
  const double once = seconds_of(vs.back().run);
  const int reps = std::max(min_reps, int(0.3 / std::max(once, 1e-6)));  // ~0.3 s per variant, >= min_reps
  for (int round = 0; round < 2; ++round) {
    for (Variant& v : vs) {
      const bool raw = std::string(v.name) == "raw";
      if (raw) openblas_set_num_threads(nt);  // OpenBLAS's own threading for the reference
      for (int i = 0; i < 3; ++i) v.run();    // warm-up: caches, thread wake-up, allocator
      for (int i = 0; i < (reps + 1) / 2; ++i) v.times.push_back(seconds_of(v.run));
      if (raw) openblas_set_num_threads(1);  // back to attograd's setting
      settle();
    }
  }
  const double flop = 2.0 * double(s.M) * double(s.N) * double(s.K);
  std::vector<double> g;
  for (const Variant& v : vs) g.push_back(flop / median(v.times) * 1e-9);
  return g;
}

std::string shape_name(const Shape& s) {
  char name[80];
  std::snprintf(name, sizeof name, "%s %s[%lld,%lld]@[%lld,%lld]", s.model, s.ta ? "TN " : s.tb ? "NT " : "",
                (long long)s.M, (long long)s.K, (long long)s.K, (long long)s.N);
  return name;
}

#if defined(__x86_64__)
// n steps of 24 independent multiply-adds on registers, as the GEMMs' micro-kernels keep 24
// accumulators in zmm registers: VDPBF16PS (32 multiply-adds each) when kBf16, else the f32 FMA
// (16). Nothing is read from memory. Returns the flops done (2 per multiply-add).
template <bool kBf16>
__attribute__((target("avx512f,avx512bf16,fma"))) double register_loop(int64_t n) {
  __m512 acc[24];
  for (int r = 0; r < 24; ++r) acc[r] = _mm512_set1_ps(float(r));
  __m512 x = _mm512_castsi512_ps(_mm512_set1_epi32(0x3f003f00)), y = x;  // bf16 pairs (0.5, 0.5); f32 ~0.5
  for (int64_t i = 0; i < n; ++i) {
#pragma GCC unroll 24
    for (int r = 0; r < 24; ++r)
      acc[r] = kBf16 ? _mm512_dpbf16_ps(acc[r], (__m512bh)x, (__m512bh)y) : _mm512_fmadd_ps(acc[r], x, y);
    asm volatile("" : "+v"(x));  // x may have changed: the loop is not folded
  }
  for (int r = 1; r < 24; ++r) acc[0] = _mm512_add_ps(acc[0], acc[r]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc[0]);
  asm volatile("" : : "r"(lanes) : "memory");  // the sums are used
  return double(n) * 24 * (kBf16 ? 64 : 32);
}

// The machine's peak GFLOP/s for the micro-kernels' instruction on `threads` threads at once (each
// runs register_loop for about 0.2 s; the best of 3 tries): the roof that the GEMM rows are a
// share of. Measured here, it tells the CPU in use, which matters on a VM whose host can change
// (a Zen 4 core does one 512-bit FMA per cycle, a Zen 5 core two).
template <bool kBf16>
double peak_gflops(int threads) {
  const int64_t n = int64_t(kBf16 ? 20 : 10) * 1000 * 1000;
  double best = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<double> flops(size_t(threads), 0.0);
    std::vector<std::thread> pool;
    const auto t0 = Clock::now();
    for (int t = 0; t < threads; ++t) pool.emplace_back([&flops, t, n] { flops[size_t(t)] = register_loop<kBf16>(n); });
    for (std::thread& th : pool) th.join();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    double total = 0;
    for (double f : flops) total += f;
    best = std::max(best, total / s * 1e-9);
  }
  return best;
}
#endif

// The bf16 section (--bf16): f32, bf16 emulated and bf16 native, each through ag::matmul.
int run_bf16(int min_reps, const std::string& json_path) {
  if (!ag::cpu::sbgemm_supported()) {
    std::fprintf(stderr, "bench_matmul: --bf16: this CPU has no AVX512-BF16 (avx512_bf16)\n");
    return 2;
  }
  const int nt = ag::num_threads();
  std::ofstream json;
  if (!json_path.empty()) {
    json.open(json_path, std::ios::app);
    if (!json) {
      std::fprintf(stderr, "bench_matmul: --json %s: cannot open for appending\n", json_path.c_str());
      return 2;
    }
  }
  const bool native_default = ag::cpu::sbgemm_native();
  std::printf("attograd threads: %d; sgemm kernel %s; bf16 products native by default: %s\n", nt,
              ag::cpu::sgemm_kernel_name(), native_default ? "yes" : "no");
  std::printf("GFLOP/s = 2*M*N*K / median time, ag::matmul in f32 and under bf16 autocast\n");
#if defined(__x86_64__)
  double peak_f32[2] = {}, peak_bf16[2] = {};  // [0]: nt threads, [1]: one thread
  for (int pass = 0; pass < 2; ++pass) {
    const int threads = pass == 0 ? nt : 1;
    peak_f32[pass] = peak_gflops<false>(threads), peak_bf16[pass] = peak_gflops<true>(threads);
    std::printf("peak on %d thread%s (24 independent multiply-adds on registers): f32 FMA %.1f GFLOP/s, "
                "VDPBF16PS %.1f GFLOP/s\n", threads, threads == 1 ? "" : "s", peak_f32[pass], peak_bf16[pass]);
    if (json)
      json << "{\"bench\":\"bench_matmul --bf16\",\"peak\":true,\"threads\":" << threads
           << ",\"gflops_f32\":" << peak_f32[pass] << ",\"gflops_bf16\":" << peak_bf16[pass] << "}\n";
  }
  std::printf("f32 %%pk, nat %%pk: the f32 and native columns as a share of that peak\n");
#endif
  // dW of a widening Linear (qkv, fc1: more rows than columns) and of a narrowing one (fc2: fewer)
  const Shape shapes[] = {{"V fwd", false, 6400, 64, 192, true}, {"V dX", false, 6400, 192, 64},
                          {"V dW", true, 192, 6400, 64},         {"V fc2 dW", true, 64, 6400, 256},
                          {"G fwd", false, 4096, 128, 512, true}, {"G dX", false, 4096, 512, 128},
                          {"G dW", true, 512, 4096, 128},        {"G fc2 dW", true, 128, 4096, 512},
                          {"C fwd", false, 8192, 128, 512, true}, {"C dX", false, 8192, 512, 128},
                          {"C dW", true, 512, 8192, 128},
                          {"L fc2 dW", true, 768, 8192, 3072},   {"", false, 1024, 1024, 1024},
                          {"NT", false, 4096, 1024, 1024, true}, {"", false, 4096, 1024, 1024},
                          {"TN", true, 1024, 4096, 1024}};
  ag::NoGradGuard no_grad;
  ag::Generator gen(0);
  for (int pass = 0; pass < 2; ++pass) {
    const int threads = pass == 0 ? nt : 1;
    ag::set_num_threads(threads);
    std::printf("\n%d thread%s\n%-34s %9s %9s %9s %8s %8s %7s %7s\n", threads, threads == 1 ? "" : "s", "shape",
                "f32", "bf16 emu", "bf16 nat", "nat/f32", "nat/emu", "f32 %pk", "nat %pk");
    for (const Shape& s : shapes) {
      const ag::Tensor a = ag::randn(s.ta ? ag::Shape{s.K, s.M} : ag::Shape{s.M, s.K}, ag::DType::f32, &gen);
      const ag::Tensor b = ag::randn(s.tb ? ag::Shape{s.N, s.K} : ag::Shape{s.K, s.N}, ag::DType::f32, &gen);
      const ag::Tensor opa = s.ta ? a.mT() : a, opb = s.tb ? b.mT() : b;
      auto bf16 = [&](bool native) {
        ag::cpu::set_sbgemm_native(native);
        ag::AutocastGuard guard(ag::Precision::bf16);
        ag::matmul(opa, opb);
      };
      std::vector<Variant> vs = {{"f32", [&] { ag::matmul(opa, opb); }, {}},
                                 {"bf16 emulated", [&] { bf16(false); }, {}},
                                 {"bf16 native", [&] { bf16(true); }, {}}};
      const std::vector<double> g = measure(s, vs, min_reps, threads);
      double share_f32 = 0, share_bf16 = 0;  // of the peak (0: not measured)
#if defined(__x86_64__)
      share_f32 = 100 * g[0] / peak_f32[pass], share_bf16 = 100 * g[2] / peak_bf16[pass];
#endif
      std::printf("%-34s %9.1f %9.1f %9.1f %8.3f %8.3f %7.1f %7.1f\n", shape_name(s).c_str(), g[0], g[1], g[2],
                  g[2] / g[0], g[2] / g[1], share_f32, share_bf16);
      std::fflush(stdout);
      if (json)
        json << "{\"bench\":\"bench_matmul --bf16\",\"shape\":\"" << shape_name(s) << "\",\"threads\":" << threads
             << ",\"gflops_f32\":" << g[0] << ",\"gflops_bf16_emulated\":" << g[1]
             << ",\"gflops_bf16_native\":" << g[2] << ",\"pct_peak_f32\":" << share_f32
             << ",\"pct_peak_bf16_native\":" << share_bf16 << "}\n";
    }
  }
  ag::cpu::set_sbgemm_native(native_default);
  ag::set_num_threads(nt);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using ag::cpu::GemmKernel;
  int min_reps = 20;
  bool bf16 = false;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf("bench_matmul: attograd's sgemm against OpenBLAS at the app models' GEMM shapes, f32; with --bf16,\n"
                  "f32 against bf16 autocast's products (emulated and native AVX512-BF16)\n"
                  "Usage: bench_matmul [min_reps] [--bf16] [--json PATH]\n"
                  "  min_reps     timed runs per variant at least (default and minimum 20)\n"
                  "  --bf16       the bf16 section (needs AVX512-BF16), with this CPU's peak for the f32 FMA\n"
                  "               and VDPBF16PS and each row's share of it\n"
                  "  --json PATH  with --bf16: append one JSON line per measured row to PATH\n"
                  "OMP_NUM_THREADS sets attograd's threads.\n");
      return 0;
    }
    if (std::strcmp(argv[i], "--bf16") == 0) {
      bf16 = true;
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      char* end = nullptr;
      const long n = std::strtol(argv[i], &end, 10);
      if (end == argv[i] || *end != '\0' || n < 1 || n > 1000000) {
        std::fprintf(stderr, "bench_matmul: unexpected argument '%s' (usage: bench_matmul [min_reps] [--bf16] "
                             "[--json PATH])\n", argv[i]);
        return 2;
      }
      min_reps = std::max(20, int(n));
    }
  }
  if (bf16) return run_bf16(min_reps, json_path);
  const int nt = ag::num_threads();
  const GemmKernel ours = ag::cpu::sgemm_kernel();
  std::printf("attograd threads: %d; our sgemm kernel: %s; OpenBLAS %s, core %s\n", nt, ag::cpu::gemm_kernel_name(ours),
              openblas_get_config(), openblas_get_corename());
  std::printf("f32, GFLOP/s = 2*M*N*K / median time\n\n");
  std::printf("%-34s %9s %9s %9s %8s %8s\n", "shape op(A)[M,K]@op(B)[K,N]", "raw", "ag+oblas", "ag", "ag/raw",
              "ag/oblas");

  const Shape shapes[] = {
      {"V", false, 6400, 64, 192},  {"V", false, 6400, 64, 256},  {"V", false, 6400, 256, 64},
      {"V", true, 64, 6400, 256},   {"G", false, 4096, 128, 384}, {"G", false, 4096, 128, 512},
      {"G", false, 4096, 512, 128}, {"G", true, 128, 4096, 512},  {"", false, 512, 512, 512},
      {"", false, 1024, 1024, 1024}};
  ag::NoGradGuard no_grad;
  ag::Generator gen(0);
  {  // wake the cores and attograd's pool for half a second before the first measurement
    const ag::Tensor x = ag::randn({512, 512}, ag::DType::f32, &gen);
    for (auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::milliseconds(500);) ag::matmul(x, x);
  }
  std::vector<std::vector<double>> one_thread;
  for (int pass = 0; pass < 2; ++pass) {  // pass 0: nt threads, pass 1: one thread
    if (pass == 1) {
      ag::set_num_threads(1);
      std::printf("\none thread, both inside ag::matmul\n%-34s %9s %9s %8s\n", "shape", "oblas", "ag", "ag/oblas");
    }
    for (const Shape& s : shapes) {
      // A as stored: (M, K), or (K, M) for TN; B (K, N)
      const ag::Tensor a = ag::randn(s.ta ? ag::Shape{s.K, s.M} : ag::Shape{s.M, s.K}, ag::DType::f32, &gen);
      const ag::Tensor b = ag::randn({s.K, s.N}, ag::DType::f32, &gen);
      const ag::Tensor opa = s.ta ? a.mT() : a;
      std::vector<float> c(size_t(s.M * s.N));
      const float *pa = a.data<float>(), *pb = b.data<float>();
      const int M = int(s.M), N = int(s.N), K = int(s.K);
      std::vector<Variant> vs;
      if (pass == 0)
        vs.push_back({"raw", [&] {
                        cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, CblasNoTrans, M, N, K, 1.f, pa,
                                    s.ta ? M : K, pb, N, 0.f, c.data(), N);
                      }, {}});
      vs.push_back({"ag+oblas", [&] {
                      ag::cpu::set_sgemm_kernel(GemmKernel::openblas);
                      ag::matmul(opa, b);
                      ag::cpu::set_sgemm_kernel(ours);
                    }, {}});
      vs.push_back({"ag", [&] { ag::matmul(opa, b); }, {}});
      const std::vector<double> g = measure(s, vs, min_reps, pass == 0 ? nt : 1);
      if (pass == 0)
        std::printf("%-34s %9.1f %9.1f %9.1f %8.3f %8.3f\n", shape_name(s).c_str(), g[0], g[1], g[2], g[2] / g[0],
                    g[2] / g[1]);
      else
        std::printf("%-34s %9.1f %9.1f %8.3f\n", shape_name(s).c_str(), g[0], g[1], g[1] / g[0]);
      std::fflush(stdout);
    }
  }
  ag::set_num_threads(nt);
  return 0;
}
