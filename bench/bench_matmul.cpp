// bench_matmul: ag::matmul against raw OpenBLAS, f32, on the shapes a small transformer uses.
//
// For each shape [M,K] @ [K,N]:
//   raw       cblas_sgemm with OpenBLAS's own threads (openblas_set_num_threads(ag::num_threads()))
//   ag        ag::matmul(a, b): attograd's pool splits the GEMM, OpenBLAS single-threaded inside
//   raw NT    cblas_sgemm(NoTrans, Trans) on w (N, K): the nn.Linear layout
//   ag a@w^T  ag::matmul(a, w.mT()): the transposed view goes to BLAS as a flag
// Times are medians over >= 20 runs after warm-up, taken in two interleaved rounds with pauses in
// between, so that neither side runs while the other's idle threads still spin.
// Usage: bench_matmul [min_reps]      (OMP_NUM_THREADS sets attograd's thread count)
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include "attograd.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_of(const std::function<void()>& f) {
  auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

struct Variant {
  const char* name;
  std::function<void()> run;
  std::vector<double> times;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  const int min_reps = argc > 1 ? std::max(20, std::atoi(argv[1])) : 20;
  const int nt = ag::num_threads();
  std::printf("attograd threads: %d (OpenBLAS %s, core %s; single-threaded inside attograd's pool)\n", nt,
              openblas_get_config(), openblas_get_corename());
  std::printf("f32, GFLOP/s = 2*M*N*K / median time; ratio = attograd / raw OpenBLAS with %d threads\n\n", nt);
  std::printf("%-22s %9s %9s %7s   %9s %9s %7s\n", "shape [M,K]@[K,N]", "raw", "ag", "ratio", "raw NT", "ag a@w^T",
              "ratio");

  struct Dims {
    int64_t M, K, N;
  };
  const Dims shapes[] = {{256, 256, 256}, {512, 512, 512}, {1024, 1024, 1024}, {4096, 128, 384}, {4096, 512, 128}};
  ag::NoGradGuard no_grad;
  ag::Generator gen(0);
  {  // wake the cores and attograd's pool for half a second before the first measurement
    const ag::Tensor x = ag::randn({512, 512}, ag::DType::f32, &gen);
    for (auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::milliseconds(500);) ag::matmul(x, x);
  }
  for (const Dims& s : shapes) {
    const ag::Tensor a = ag::randn({s.M, s.K}, ag::DType::f32, &gen);
    const ag::Tensor b = ag::randn({s.K, s.N}, ag::DType::f32, &gen);
    const ag::Tensor w = ag::randn({s.N, s.K}, ag::DType::f32, &gen);  // b's transpose, stored (N, K)
    std::vector<float> c(size_t(s.M * s.N));
    const float *pa = a.data<float>(), *pb = b.data<float>(), *pw = w.data<float>();
    const int M = int(s.M), N = int(s.N), K = int(s.K);

    std::vector<Variant> vs;
    vs.push_back({"raw", [&] {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.f, pa, K, pb, N, 0.f, c.data(), N);
                  }, {}});
    vs.push_back({"ag", [&] { ag::matmul(a, b); }, {}});
    vs.push_back({"raw NT", [&] {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.f, pa, K, pw, K, 0.f, c.data(), N);
                  }, {}});
    vs.push_back({"ag a@w^T", [&] { ag::matmul(a, w.mT()); }, {}});

    // enough runs for ~0.4 s per variant, and at least min_reps
    const double once = seconds_of(vs[0].run);
    const int reps = std::max(min_reps, int(0.4 / std::max(once, 1e-6)));
    for (int round = 0; round < 2; ++round) {
      for (Variant& v : vs) {
        const bool raw = v.name[0] == 'r';
        if (raw) openblas_set_num_threads(nt);  // OpenBLAS's own threading for the reference
        for (int i = 0; i < 3; ++i) v.run();    // warm-up: caches, thread wake-up, allocator
        for (int i = 0; i < (reps + 1) / 2; ++i) v.times.push_back(seconds_of(v.run));
        if (raw) openblas_set_num_threads(1);  // back to attograd's setting
        settle();
      }
    }
    const double flop = 2.0 * double(s.M) * double(s.N) * double(s.K);
    double g[4];
    for (int i = 0; i < 4; ++i) g[i] = flop / median(vs[i].times) * 1e-9;
    char name[64];
    std::snprintf(name, sizeof name, "[%lld,%lld]@[%lld,%lld]", (long long)s.M, (long long)s.K, (long long)s.K,
                  (long long)s.N);
    std::printf("%-22s %9.1f %9.1f %7.3f   %9.1f %9.1f %7.3f\n", name, g[0], g[1], g[1] / g[0], g[2], g[3],
                g[3] / g[2]);
    std::fflush(stdout);
  }
  return 0;
}
