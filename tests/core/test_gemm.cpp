// attograd's sgemm (core/cpu/gemm.cpp): every micro-kernel this CPU runs against a triple loop in
// f64, over all transpose flags, ragged sizes, leading dims, alpha/beta; and matmul's results
// the same bits at 1 and 2 threads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tests/helpers.h"

using ag::cpu::GemmKernel;

namespace {

const GemmKernel kAllKernels[] = {GemmKernel::avx512, GemmKernel::avx2, GemmKernel::portable};

// Values in [-1, 1) from a small linear congruential generator: deterministic and cheap.
std::vector<float> filled(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = float(seed >> 8) / float(1 << 23) - 1.f;
  }
  return v;
}

struct Case {
  bool ta, tb;
  int64_t M, N, K;
  float alpha, beta;
  int64_t pad = 0;  // extra elements per row of a, b and c beyond what the layout needs
};

// Runs sgemm_with(k) on case cs and compares every element of c with an f64 triple loop:
// |c - ref| <= 1e-5 * (|alpha| sum_k |a_ik b_kj| + |beta c0_ij|) + 1e-30. Returns c.
// With bf16, sbgemm instead, against the same loop over the operands rounded to bf16 (pw::round_bf16).
std::vector<float> check_case(GemmKernel k, const Case& cs, bool bf16 = false) {
  const int64_t M = cs.M, N = cs.N, K = cs.K;
  // a as stored: (M, K) or, transposed, (K, M); likewise b: (K, N) or (N, K)
  const int64_t lda = (cs.ta ? M : K) + cs.pad, ldb = (cs.tb ? K : N) + cs.pad, ldc = N + cs.pad;
  const std::vector<float> a = filled(size_t((cs.ta ? K : M) * lda + 1), 1);
  const std::vector<float> b = filled(size_t((cs.tb ? N : K) * ldb + 1), 2);
  std::vector<float> c0 = filled(size_t(M * ldc + 1), 3);
  if (cs.beta == 0.f) std::fill(c0.begin(), c0.end(), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> c = c0;
  if (bf16)
    ag::cpu::sbgemm(cs.ta, cs.tb, M, N, K, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, c.data(), ldc);
  else
    ag::cpu::sgemm_with(k, cs.ta, cs.tb, M, N, K, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, c.data(), ldc);
  auto operand = [bf16](float x) { return double(bf16 ? ag::pw::round_bf16(x) : x); };
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0, mag = 0;
      for (int64_t p = 0; p < K; ++p) {
        const double x = operand(cs.ta ? a[size_t(p * lda + i)] : a[size_t(i * lda + p)]);
        const double w = operand(cs.tb ? b[size_t(j * ldb + p)] : b[size_t(p * ldb + j)]);
        acc += x * w;
        mag += std::abs(x * w);
      }
      double ref = double(cs.alpha) * acc, bound = std::abs(double(cs.alpha)) * mag;
      if (cs.beta != 0.f) {
        ref += double(cs.beta) * c0[size_t(i * ldc + j)];
        bound += std::abs(double(cs.beta) * c0[size_t(i * ldc + j)]);
      }
      const double got = c[size_t(i * ldc + j)];
      if (!(std::abs(got - ref) <= 1e-5 * bound + 1e-30)) {
        FAIL_CHECK(fmt::format("kernel {} ta {} tb {} M {} N {} K {} alpha {} beta {} pad {}: c[{},{}] = {:.9g}, "
                               "expected {:.9g}",
                               bf16 ? "sbgemm" : ag::cpu::gemm_kernel_name(k), cs.ta, cs.tb, M, N, K, cs.alpha, cs.beta, cs.pad, i, j,
                               got, ref));
        return c;
      }
    }
  // the padding of c past each row's N columns is left as it was
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = N; j < ldc; ++j) {
      const float got = c[size_t(i * ldc + j)], was = c0[size_t(i * ldc + j)];
      if (!(got == was || (std::isnan(got) && std::isnan(was)))) {
        FAIL_CHECK(fmt::format("kernel {}: padding c[{},{}] was written", ag::cpu::gemm_kernel_name(k), i, j));
        return c;
      }
    }
  return c;
}

// The kernels this CPU runs; the others are named in a MESSAGE, so a skip is visible.
std::vector<GemmKernel> runnable_kernels() {
  std::vector<GemmKernel> ks;
  for (GemmKernel k : kAllKernels) {
    if (ag::cpu::sgemm_kernel_supported(k))
      ks.push_back(k);
    else
      MESSAGE("sgemm: skipping the " << ag::cpu::gemm_kernel_name(k) << " kernel: this CPU does not support it");
  }
  return ks;
}

}  // namespace

TEST_CASE("sgemm: every kernel against an f64 triple loop, all transposes and ragged sizes") {
  const int64_t sizes[] = {1, 2, 7, 13, 31, 33, 64, 100};
  for (GemmKernel k : runnable_kernels()) {
    int cases = 0;
    for (int t = 0; t < 4; ++t)
      for (int64_t M : sizes)
        for (int64_t N : sizes)
          for (int64_t K : {int64_t(1), int64_t(7), int64_t(33), int64_t(100)}) {
            // alpha, beta and padding vary with the case, so every combination of them is met
            const int v = cases++;
            const float alpha = v % 2 ? 0.5f : 1.f;
            const float beta = v % 3 == 0 ? 0.f : v % 3 == 1 ? 1.f : 0.25f;
            check_case(k, {bool(t & 1), bool(t & 2), M, N, K, alpha, beta, int64_t(v % 5 == 0 ? 3 : 0)});
          }
  }
}

TEST_CASE("sgemm: K beyond kc, M beyond mc, N beyond nc") {
  for (GemmKernel k : runnable_kernels())
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      check_case(k, {ta, tb, 13, 33, 1000, 1.f, 0.f});       // 4 kc blocks
      check_case(k, {ta, tb, 31, 17, 300, 0.5f, 0.25f, 2});  // 2 uneven kc blocks, with beta
      check_case(k, {ta, tb, 1000, 7, 20, 1.f, 1.f});        // 3 mc blocks
    }
  for (GemmKernel k : runnable_kernels()) check_case(k, {false, true, 5, 4200, 9, 1.f, 0.f});  // 2 nc blocks
}

TEST_CASE("sgemm: K = 0 scales c by beta, zeros it when beta = 0") {
  for (GemmKernel k : {GemmKernel::portable, GemmKernel::avx2, GemmKernel::avx512, GemmKernel::openblas}) {
    if (!ag::cpu::sgemm_kernel_supported(k)) continue;
    std::vector<float> c(6, std::numeric_limits<float>::quiet_NaN());
    const float a = 1.f, b = 1.f;  // never read
    ag::cpu::sgemm_with(k, false, false, 2, 3, 0, 1.f, &a, 1, &b, 3, 0.f, c.data(), 3);
    for (float x : c) CHECK(x == 0.f);
    std::vector<float> d = {1, 2, 3, 4, 5, 6};
    ag::cpu::sgemm_with(k, false, false, 2, 3, 0, 1.f, &a, 1, &b, 3, 0.5f, d.data(), 3);
    CHECK(d == std::vector<float>{0.5f, 1.f, 1.5f, 2.f, 2.5f, 3.f});
  }
}

TEST_CASE("sgemm: known values") {
  // [1 2; 3 4] @ [5 6; 7 8] = [1*5+2*7  1*6+2*8; 3*5+4*7  3*6+4*8] = [19 22; 43 50]
  // then alpha 2, beta 0.5 on c = [1 1; 1 1]:  [38.5 44.5; 86.5 100.5]
  const float a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8};
  for (GemmKernel k : runnable_kernels()) {
    float c[] = {1, 1, 1, 1};
    ag::cpu::sgemm_with(k, false, false, 2, 2, 2, 2.f, a, 2, b, 2, 0.5f, c, 2);
    CHECK(c[0] == 38.5f);
    CHECK(c[1] == 44.5f);
    CHECK(c[2] == 86.5f);
    CHECK(c[3] == 100.5f);
    // a^T b^T = (b a)^T: b a = [5+18 10+24; 7+24 14+32] = [23 34; 31 46], transposed [23 31; 34 46]
    ag::cpu::sgemm_with(k, true, true, 2, 2, 2, 1.f, a, 2, b, 2, 0.f, c, 2);
    CHECK(c[0] == 23.f);
    CHECK(c[1] == 31.f);
    CHECK(c[2] == 34.f);
    CHECK(c[3] == 46.f);
  }
}

TEST_CASE("sgemm: the kernels agree with each other") {
  const std::vector<GemmKernel> ks = runnable_kernels();
  for (int t = 0; t < 4; ++t) {
    const Case cs{bool(t & 1), bool(t & 2), 77, 45, 300, 1.f, 0.25f};
    const std::vector<float> ref = check_case(GemmKernel::portable, cs);
    for (GemmKernel k : ks) {
      const std::vector<float> c = check_case(k, cs);
      for (size_t i = 0; i < c.size(); ++i)
        if (!(std::abs(c[i] - ref[i]) <= 1e-5 * (std::abs(ref[i]) + 1.0))) {
          FAIL_CHECK(fmt::format("{} vs portable, element {}: {:.9g} vs {:.9g}", ag::cpu::gemm_kernel_name(k), i,
                                 c[i], ref[i]));
          break;
        }
    }
  }
}

TEST_CASE("sgemm: a piece of C is the same bits whatever rows and columns it is computed with") {
  // matmul computes C in pieces, one per thread; each element must not depend on the cut, even
  // where the cut makes it fall in a ragged edge tile of one piece and a full tile of the other
  const int64_t M = 50, N = 70, K = 600;  // K > kc: several k blocks
  for (GemmKernel k : runnable_kernels())
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const int64_t lda = ta ? M : K, ldb = tb ? K : N;
      const std::vector<float> a = filled(size_t(M * K), 4), b = filled(size_t(K * N), 5);
      const std::vector<float> c0 = filled(size_t(M * N), 6);
      std::vector<float> whole = c0, piece = c0;
      ag::cpu::sgemm_with(k, ta, tb, M, N, K, 0.3f, a.data(), lda, b.data(), ldb, 0.7f, whole.data(), N);
      const int64_t i0 = 5, i1 = 41, j0 = 7, j1 = 66;  // rows [i0, i1), columns [j0, j1)
      const float* ap = a.data() + (ta ? i0 : i0 * lda);
      const float* bp = b.data() + (tb ? j0 * ldb : j0);
      ag::cpu::sgemm_with(k, ta, tb, i1 - i0, j1 - j0, K, 0.3f, ap, lda, bp, ldb, 0.7f, piece.data() + i0 * N + j0,
                          N);
      CAPTURE(ag::cpu::gemm_kernel_name(k));
      CAPTURE(t);
      int64_t differ = 0;
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j) differ += whole[size_t(i * N + j)] != piece[size_t(i * N + j)];
      CHECK(differ == 0);
      CHECK(piece[0] == c0[0]);  // outside the piece: untouched
    }
}

TEST_CASE("sgemm: matmul is the same bits at 1 and 2 threads") {
  const int before = ag::num_threads();
  ag::Generator gen(7);
  const ag::Tensor a = ag::randn({300, 257}, ag::DType::f32, &gen);
  const ag::Tensor b = ag::randn({257, 190}, ag::DType::f32, &gen);
  const ag::Tensor at = ag::randn({257, 300}, ag::DType::f32, &gen);  // read as its transpose
  const ag::Tensor bt = ag::randn({190, 257}, ag::DType::f32, &gen);
  // few rows and enough work for two threads: the columns are split (packed path at 5 rows, the
  // small-M path at 1 and 3)
  const ag::Tensor wide = ag::randn({257, 2000}, ag::DType::f32, &gen);
  const ag::Tensor wide_t = ag::randn({2000, 257}, ag::DType::f32, &gen);  // a Linear's weight layout
  const ag::Tensor r5 = ag::randn({5, 257}, ag::DType::f32, &gen), r3 = ag::randn({3, 257}, ag::DType::f32, &gen),
                   r1 = ag::randn({1, 257}, ag::DType::f32, &gen);
  auto products = [&] {
    return std::vector<std::vector<float>>{ag::matmul(a, b).to_vector<float>(),
                                           ag::matmul(at.mT(), bt.mT()).to_vector<float>(),
                                           ag::matmul(r5, wide).to_vector<float>(),
                                           ag::matmul(r3, wide).to_vector<float>(),
                                           ag::matmul(r1, wide_t.mT()).to_vector<float>()};
  };
  ag::set_num_threads(1);
  const auto one = products();
  ag::set_num_threads(2);
  const auto two = products();
  ag::set_num_threads(before);
  for (size_t i = 0; i < one.size(); ++i) {
    CAPTURE(i);
    CHECK(one[i] == two[i]);
  }
}

TEST_CASE("sgemm: the few-rows path (generation) against an f64 triple loop") {
  // sgemm_small_m: M <= kSmallRows, both operands read in place; every transpose, ragged N and K,
  // padded leading dims
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t M = 1; M <= ag::cpu::kSmallRows; ++M)
        for (int64_t N : {1, 7, 33})
          for (int64_t K : {1, 16, 129}) {
            const int64_t pad = 3, lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
            const std::vector<float> a = filled(size_t((ta ? K : M) * lda), 11), b = filled(size_t((tb ? N : K) * ldb), 12);
            std::vector<float> c(size_t(M * ldc), std::numeric_limits<float>::quiet_NaN());
            ag::cpu::sgemm_small_m(ta, tb, M, N, K, a.data(), lda, b.data(), ldb, c.data(), ldc);
            for (int64_t i = 0; i < M; ++i)
              for (int64_t j = 0; j < N; ++j) {
                double acc = 0, mag = 0;
                for (int64_t p = 0; p < K; ++p) {
                  const double x = ta ? a[size_t(p * lda + i)] : a[size_t(i * lda + p)];
                  const double w = tb ? b[size_t(j * ldb + p)] : b[size_t(p * ldb + j)];
                  acc += x * w, mag += std::abs(x * w);
                }
                const double got = c[size_t(i * ldc + j)];
                if (!(std::abs(got - acc) <= 1e-5 * mag + 1e-30))
                  FAIL_CHECK(fmt::format("small_m ta {} tb {} M {} N {} K {}: c[{},{}] = {}, expected {}", ta, tb, M,
                                         N, K, i, j, got, acc));
              }
            for (int64_t i = 0; i < M; ++i)  // the padding of c is not written
              for (int64_t j = N; j < ldc; ++j) CHECK(std::isnan(c[size_t(i * ldc + j)]));
          }
}

TEST_CASE("sgemm: the few-rows path rounds autocast's operands as it reads them: the bits of rounded copies") {
  // sgemm_small_m(..., bf16 / fp16) against the same call on copies of a and b rounded by
  // pw::round_bf16 / pw::round_fp16 (a copy-based autocast: a whole weight copied per token)
  // and an f64 loop over the rounded operands; both differ from the f32 result. The loops only:
  // with native bf16 products a transposed b runs VDPBF16PS (the next test case)
  const bool native_before = ag::cpu::sbgemm_native();
  if (ag::cpu::sbgemm_supported()) ag::cpu::set_sbgemm_native(false);
  for (ag::Precision p : {ag::Precision::bf16, ag::Precision::fp16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int64_t M : {int64_t(1), ag::cpu::kSmallRows}) {
          const int64_t N = 33, K = 129, pad = 2, lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad;
          const std::vector<float> a = filled(size_t((ta ? K : M) * lda), 21), b = filled(size_t((tb ? N : K) * ldb), 22);
          auto r = [p](float x) { return ag::pw::round_operand(x, p); };
          std::vector<float> ar(a.size()), br(b.size()), bias = filled(size_t(N), 23);
          std::transform(a.begin(), a.end(), ar.begin(), r);
          std::transform(b.begin(), b.end(), br.begin(), r);
          std::vector<float> got(size_t(M * N)), want(size_t(M * N)), plain(size_t(M * N));
          ag::cpu::sgemm_small_m(ta, tb, M, N, K, a.data(), lda, b.data(), ldb, got.data(), N, bias.data(), p);
          ag::cpu::sgemm_small_m(ta, tb, M, N, K, ar.data(), lda, br.data(), ldb, want.data(), N, bias.data());
          ag::cpu::sgemm_small_m(ta, tb, M, N, K, a.data(), lda, b.data(), ldb, plain.data(), N, bias.data());
          CAPTURE(int(p));
          CAPTURE(ta);
          CAPTURE(tb);
          CAPTURE(M);
          CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
          CHECK(got != plain);
          double acc = bias[0];
          for (int64_t k = 0; k < K; ++k)
            acc += double(ta ? ar[size_t(k * lda)] : ar[size_t(k)]) * double(tb ? br[size_t(k)] : br[size_t(k * ldb)]);
          CHECK(std::abs(got[0] - acc) < 1e-5 * (1 + std::abs(acc)));
        }
  if (ag::cpu::sbgemm_supported()) ag::cpu::set_sbgemm_native(native_before);
  // and through matmul: a (1, K) row times a Linear's weight, as generation runs it
  ag::Generator gen(3);
  const ag::Tensor x = ag::randn({1, 40}, ag::DType::f64, &gen), w = ag::randn({24, 40}, ag::DType::f64, &gen);
  ag::test::check_close(ag::matmul(x.to(ag::DType::f32), w.to(ag::DType::f32).mT()), ag::matmul(x, w.mT()).to_vector<double>(),
              1e-5, 1e-5);
}

TEST_CASE("sgemm: a bias added in the epilogue, every kernel") {
  // c = alpha op(a) op(b) + beta c + bias: with several k blocks (K 600), edge tiles (M 13, N 70),
  // beta 0 (c NaN beforehand) and 1; against the same call without a bias plus the bias in f64
  for (GemmKernel k : {GemmKernel::avx512, GemmKernel::avx2, GemmKernel::portable, GemmKernel::openblas}) {
    if (!ag::cpu::sgemm_kernel_supported(k)) {
      MESSAGE("skipped on this CPU: ", ag::cpu::gemm_kernel_name(k));
      continue;
    }
    for (float beta : {0.f, 1.f})
      for (bool tb : {false, true}) {
        const int64_t M = 13, N = 70, K = 600;
        const std::vector<float> a = filled(size_t(M * K), 21), b = filled(size_t(K * N), 22),
                                 bias = filled(size_t(N), 23), c0 = filled(size_t(M * N), 24);
        std::vector<float> plain = c0, with = c0;
        if (beta == 0.f) std::fill(with.begin(), with.end(), std::numeric_limits<float>::quiet_NaN());
        ag::cpu::sgemm_with(k, false, tb, M, N, K, 0.5f, a.data(), K, b.data(), tb ? K : N, beta, plain.data(), N);
        ag::cpu::sgemm_with(k, false, tb, M, N, K, 0.5f, a.data(), K, b.data(), tb ? K : N, beta, with.data(), N,
                            bias.data());
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            const double want = double(plain[size_t(i * N + j)]) + bias[size_t(j)];
            if (!(std::abs(with[size_t(i * N + j)] - want) <= 1e-4 * (1 + std::abs(want))))
              FAIL_CHECK(fmt::format("kernel {} beta {} tb {}: c[{},{}] = {}, expected {}",
                                     ag::cpu::gemm_kernel_name(k), beta, tb, i, j, with[size_t(i * N + j)], want));
          }
      }
  }
}

TEST_CASE("sgemm: an unknown or unsupported kernel is an error") {
  const GemmKernel before = ag::cpu::sgemm_kernel();
  AG_CHECK_ERROR(ag::cpu::gemm_kernel_named("avx1024"), "sgemm", "ATTOGRAD_GEMM=avx1024", "unknown kernel");
  CHECK(ag::cpu::gemm_kernel_named("portable") == GemmKernel::portable);
  for (GemmKernel k : kAllKernels)
    if (!ag::cpu::sgemm_kernel_supported(k)) {
      AG_CHECK_ERROR(ag::cpu::set_sgemm_kernel(k), "set_sgemm_kernel", ag::cpu::gemm_kernel_name(k));
      AG_CHECK_ERROR(ag::cpu::gemm_kernel_named(ag::cpu::gemm_kernel_name(k)), "does not support");
    }
  ag::cpu::set_sgemm_kernel(GemmKernel::portable);
  CHECK(std::string(ag::cpu::sgemm_kernel_name()) == "portable");
  ag::cpu::set_sgemm_kernel(before);
}

// ---- sbgemm: bf16 operands on AVX512-BF16 ---------------------------------------------------------
namespace {

// Whether this CPU runs sbgemm; where not, a MESSAGE that CTest reads as a skip.
bool have_bf16() {
  if (ag::cpu::sbgemm_supported()) return true;
  MESSAGE("[skipped: no avx512_bf16] sbgemm needs AVX512-BF16; the emulated bf16 path is tested elsewhere");
  return false;
}

}  // namespace

TEST_CASE("sgemm: the few-rows bf16 product on VDPBF16PS: an f64 loop of the rounded operands, a bf16 b read as "
          "it is with the same bits, any split of the columns") {
  // sgemm_small_m(..., bf16) with b stored transposed (a Linear's weight) where bf16 products are
  // native, and sgemm_small_m_b16 (b already bf16: a weight autocast keeps in bf16). Odd K (the
  // last pair half empty), K past one and two 32-value steps, ragged column groups, padded ld.
  if (!have_bf16()) return;
  const bool native_before = ag::cpu::sbgemm_native();
  ag::cpu::set_sbgemm_native(true);
  REQUIRE(ag::cpu::sbgemm_native());
  auto r = [](float x) { return ag::pw::round_bf16(x); };
  int cases = 0, differ = 0;
  for (bool ta : {false, true})
    for (int64_t M = 1; M <= ag::cpu::kSmallRows; ++M)
      for (int64_t N : {1, 5, 33})
        for (int64_t K : {1, 2, 31, 32, 33, 64, 129}) {
          const int64_t pad = 3, lda = (ta ? M : K) + pad, ldb = K + pad;
          const std::vector<float> a = filled(size_t((ta ? K : M) * lda), 31), b = filled(size_t(N * ldb), 32),
                                   bias = filled(size_t(N), 33);
          std::vector<ag::bf16> b16(b.size());
          std::transform(b.begin(), b.end(), b16.begin(), [](float x) { return ag::bf16(x); });
          std::vector<float> got(size_t(M * N)), from_b16(size_t(M * N)), split(size_t(M * N)), emulated(size_t(M * N));
          ag::cpu::sgemm_small_m(ta, true, M, N, K, a.data(), lda, b.data(), ldb, got.data(), N, bias.data(),
                                 ag::Precision::bf16);
          ag::cpu::sgemm_small_m_b16(ta, true, M, N, K, a.data(), lda, b16.data(), ldb, from_b16.data(), N, bias.data());
          // columns [0, j) and [j, N) as two calls, as a thread split gives them
          const int64_t j = N / 2 + 1 < N ? N / 2 + 1 : N;
          ag::cpu::sgemm_small_m_b16(ta, true, M, j, K, a.data(), lda, b16.data(), ldb, split.data(), N, bias.data());
          ag::cpu::sgemm_small_m_b16(ta, true, M, N - j, K, a.data(), lda, b16.data() + j * ldb, ldb, split.data() + j,
                                     N, bias.data() + j);
          ag::cpu::set_sbgemm_native(false);
          ag::cpu::sgemm_small_m(ta, true, M, N, K, a.data(), lda, b.data(), ldb, emulated.data(), N, bias.data(),
                                 ag::Precision::bf16);
          std::vector<float> emulated_b16(size_t(M * N));
          ag::cpu::sgemm_small_m_b16(ta, true, M, N, K, a.data(), lda, b16.data(), ldb, emulated_b16.data(), N,
                                     bias.data());
          ag::cpu::set_sbgemm_native(true);
          CHECK(emulated_b16 == emulated);
          CAPTURE(ta);
          CAPTURE(M);
          CAPTURE(N);
          CAPTURE(K);
          CHECK(std::memcmp(got.data(), from_b16.data(), got.size() * sizeof(float)) == 0);
          CHECK(std::memcmp(got.data(), split.data(), got.size() * sizeof(float)) == 0);
          differ += got != emulated;
          for (int64_t i = 0; i < M; ++i)
            for (int64_t jj = 0; jj < N; ++jj) {
              double acc = bias[size_t(jj)], mag = std::abs(acc);
              for (int64_t k = 0; k < K; ++k) {
                const double x = r(ta ? a[size_t(k * lda + i)] : a[size_t(i * lda + k)]);
                const double w = r(b[size_t(jj * ldb + k)]);
                acc += x * w, mag += std::abs(x * w);
              }
              const double g = got[size_t(i * N + jj)], e = emulated[size_t(i * N + jj)];
              if (!(std::abs(g - acc) <= 2e-6 * mag) || !(std::abs(e - acc) <= 2e-6 * mag))
                FAIL_CHECK(fmt::format("c[{},{}] = {} (loops: {}), expected {} (sum of |products| {})", i, jj, g, e,
                                       acc, mag));
            }
          ++cases;
        }
  CHECK(cases == 2 * 4 * 3 * 7);
  MESSAGE(differ, " of ", cases, " products differ from the loops' bits in some element");
  CHECK(differ >= cases / 4);  // it ran VDPBF16PS, not the loops (which would differ nowhere)
  // b stored as is keeps the loops (the same bits as with native products off), and the b16
  // entry point gives them too
  const int64_t M = 3, N = 40, K = 37;
  const std::vector<float> a = filled(size_t(M * K), 34), b = filled(size_t(K * N), 35);
  std::vector<ag::bf16> b16(b.size());
  std::transform(b.begin(), b.end(), b16.begin(), [](float x) { return ag::bf16(x); });
  std::vector<float> native(size_t(M * N)), from_b16(size_t(M * N)), loops(size_t(M * N));
  ag::cpu::sgemm_small_m(false, false, M, N, K, a.data(), K, b.data(), N, native.data(), N, nullptr, ag::Precision::bf16);
  ag::cpu::sgemm_small_m_b16(false, false, M, N, K, a.data(), K, b16.data(), N, from_b16.data(), N);
  ag::cpu::set_sbgemm_native(false);
  ag::cpu::sgemm_small_m(false, false, M, N, K, a.data(), K, b.data(), N, loops.data(), N, nullptr, ag::Precision::bf16);
  ag::cpu::set_sbgemm_native(native_before);
  CHECK(native == loops);
  CHECK(from_b16 == loops);
}

TEST_CASE("sbgemm: against an f64 triple loop of the bf16-rounded operands, all transposes, ragged sizes") {
  if (!have_bf16()) return;
  const int64_t sizes[] = {1, 5, 7, 33, 64, 100};
  int cases = 0;
  for (int t = 0; t < 4; ++t)
    for (int64_t M : sizes)
      for (int64_t N : sizes)
        for (int64_t K : {int64_t(1), int64_t(2), int64_t(7), int64_t(33), int64_t(100)}) {  // odd K: a zero pair
          const int v = cases++;
          const float alpha = v % 2 ? 0.5f : 1.f;
          const float beta = v % 3 == 0 ? 0.f : v % 3 == 1 ? 1.f : 0.25f;
          check_case(GemmKernel::avx512, {bool(t & 1), bool(t & 2), M, N, K, alpha, beta, int64_t(v % 5 == 0 ? 3 : 0)},
                     true);
        }
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    // the bf16 kernel's kc blocks are up to 512 long (the f32 kernels': 256)
    check_case(GemmKernel::avx512, {ta, tb, 13, 33, 2000, 1.f, 0.f}, true);       // 4 kc blocks
    check_case(GemmKernel::avx512, {ta, tb, 31, 17, 601, 0.5f, 0.25f, 2}, true);  // 2 kc blocks of odd length
    check_case(GemmKernel::avx512, {ta, tb, 1000, 70, 20, 1.f, 1.f}, true);       // 3 mc blocks
  }
  check_case(GemmKernel::avx512, {false, true, 5, 4200, 9, 1.f, 0.f}, true);  // 2 nc blocks
}

namespace {
// sbgemm_b16 (b holds bf16 values) or sbgemm_a16 (a does) against sbgemm on the widened values: the
// same bits. Operands with padded rows (lda = the stored row + pad_a), the 16-bit one starting
// `skew` elements into its buffer; alpha, beta and a bias varied with `v`.
void check_16bit_operand(bool a16, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t pad_a, int64_t skew,
                         int v, std::mt19937& rng) {
  CAPTURE(a16);
  CAPTURE(ta);
  CAPTURE(tb);
  CAPTURE(M);
  CAPTURE(N);
  CAPTURE(K);
  CAPTURE(pad_a);
  CAPTURE(skew);
  std::normal_distribution<float> normal;
  const int64_t lda = (ta ? M : K) + pad_a, ldb = (tb ? K : N) + 5;
  const size_t na = size_t((ta ? K : M) * lda), nb = size_t((tb ? N : K) * ldb);
  // the 16-bit operand and its widened values, `skew` elements in; the other one in f32
  std::vector<ag::bf16> h(size_t(a16 ? na : nb) + size_t(skew));
  std::vector<float> hw(h.size()), other(a16 ? nb : na);
  for (size_t i = 0; i < h.size(); ++i) h[i] = ag::bf16(normal(rng)), hw[i] = float(h[i]);
  for (float& x : other) x = normal(rng);
  const float alpha = v % 2 ? 0.5f : 1.f, beta = v % 3 == 0 ? 0.f : 0.25f;
  std::vector<float> bias(static_cast<size_t>(N));
  for (float& x : bias) x = normal(rng);
  const float* bias_p = v % 4 == 1 ? bias.data() : nullptr;
  std::vector<float> want(size_t(M * N)), got(want.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = got[i] = normal(rng);
  if (a16) {
    ag::cpu::sbgemm(ta, tb, M, N, K, alpha, hw.data() + skew, lda, other.data(), ldb, beta, want.data(), N, bias_p);
    ag::cpu::sbgemm_a16(ta, tb, M, N, K, alpha, h.data() + skew, lda, other.data(), ldb, beta, got.data(), N, bias_p);
  } else {
    ag::cpu::sbgemm(ta, tb, M, N, K, alpha, other.data(), lda, hw.data() + skew, ldb, beta, want.data(), N, bias_p);
    ag::cpu::sbgemm_b16(ta, tb, M, N, K, alpha, other.data(), lda, h.data() + skew, ldb, beta, got.data(), N, bias_p);
  }
  CHECK(got == want);
}
}  // namespace

TEST_CASE("sbgemm_b16: a bf16 b gives the bits of sbgemm on its widened values, both layouts, ragged and odd K") {
  if (!have_bf16()) return;
  std::mt19937 rng(23);
  int cases = 0;
  for (int t = 0; t < 4; ++t)
    for (int64_t M : {int64_t(1), int64_t(7), int64_t(33)})
      for (int64_t N : {int64_t(1), int64_t(17), int64_t(64), int64_t(100)})
        for (int64_t K : {int64_t(1), int64_t(2), int64_t(7), int64_t(601)})  // odd K: a zero pair; 601: 2 kc blocks
          check_16bit_operand(false, t & 1, t & 2, M, N, K, 3, 0, cases++, rng);
}

TEST_CASE("sbgemm_a16: a bf16 a gives the bits of sbgemm on its widened values, read in place or packed") {
  // a stored as is with K, the K blocks and lda even and 4-byte aligned is read in place (its last
  // rows short of 6 copied); anything else is packed: odd K (a zero pair), K = 602 (2 blocks of 301),
  // odd lda, a start 2 bytes off, a transposed a
  if (!have_bf16()) return;
  std::mt19937 rng(31);
  int cases = 0;
  for (int t = 0; t < 4; ++t)
    for (int64_t M : {int64_t(1), int64_t(7), int64_t(12), int64_t(500)})
      for (int64_t N : {int64_t(1), int64_t(17), int64_t(100)})
        for (int64_t K : {int64_t(1), int64_t(2), int64_t(7), int64_t(300), int64_t(602)})
          for (int64_t pad : {int64_t(3), int64_t(4)})
            for (int64_t skew : {int64_t(0), int64_t(1)})
              if (M != 500 || (N == 100 && pad == 4))  // 2 row blocks of 480: a few cases suffice
                check_16bit_operand(true, t & 1, t & 2, M, N, K, pad, skew, cases++, rng);
}

namespace {

// matmul_forward_a16 / _b16 against matmul_forward on the widened values, with native bf16
// products or the emulation: under bf16 autocast linear keeps its input x as a bf16 tensor; its
// forward x W^T and its dW = g^T x read it as it is where the CPU has AVX512-BF16 (else widened):
// either way the bits of matmul_forward on the widened values, whose products round x to what it
// already is. in = 38: the forward reads x's rows in place; dW's x has 301 rows, an odd count of pairs
void check_a16_b16(bool native) {
  std::mt19937 rng(37);
  std::normal_distribution<float> normal;
  const int64_t rows = 301, in = 38, out = 70;
  std::vector<float> w(size_t(out * in)), g(size_t(rows * out)), xw(size_t(rows * in)), bias(static_cast<size_t>(out));
  std::vector<ag::bf16> x(xw.size());
  for (float& v : w) v = normal(rng);
  for (float& v : g) v = normal(rng);
  for (float& v : bias) v = normal(rng);
  for (size_t i = 0; i < x.size(); ++i) x[i] = ag::bf16(normal(rng)), xw[i] = float(x[i]);
  const ag::Gemm fwd{rows, out, in, false, true, in, in, nullptr, nullptr, ag::Precision::bf16};
  const ag::Gemm dw{out, in, rows, true, false, out, in, nullptr, nullptr, ag::Precision::bf16};
  const bool before = ag::cpu::sbgemm_native();
  ag::cpu::set_sbgemm_native(native);  // false is accepted everywhere; true only with AVX512-BF16
  REQUIRE(ag::cpu::sbgemm_native() == native);
  std::vector<float> want(size_t(rows * out)), got(want.size(), std::numeric_limits<float>::quiet_NaN());
  ag::cpu::matmul_forward(want.data(), xw.data(), w.data(), fwd, bias.data());
  ag::cpu::matmul_forward_a16(got.data(), x.data(), w.data(), fwd, bias.data());
  CHECK(got == want);
  std::vector<float> want_dw(size_t(out * in)), got_dw(want_dw.size(), std::numeric_limits<float>::quiet_NaN());
  ag::cpu::matmul_forward(want_dw.data(), g.data(), xw.data(), dw);
  ag::cpu::matmul_forward_b16(got_dw.data(), g.data(), x.data(), dw);
  CHECK(got_dw == want_dw);
  ag::cpu::set_sbgemm_native(before);
}

}  // namespace

TEST_CASE("matmul_forward_a16, _b16: linear's forward and dW from its bf16 input, the bits of the widened products, emulated") {
  check_a16_b16(false);
}

TEST_CASE("matmul_forward_a16, _b16: linear's forward and dW from its bf16 input, the bits of the widened products, on VDPBF16PS") {
  if (!have_bf16()) return;
  check_a16_b16(true);
}

TEST_CASE("sbgemm: known values, a bias, and K = 0") {
  if (!have_bf16()) return;
  // 1 + 2^-9 rounds to 1 in bf16 (8 significant bits): [1+2^-9, 2; 3, 4] @ [5 6; 7 8] = [19 22; 43 50]
  const float a[] = {1.f + 1.f / 512.f, 2, 3, 4}, b[] = {5, 6, 7, 8}, bias[] = {0.5f, -1.f};
  float c[] = {1, 1, 1, 1};
  ag::cpu::sbgemm(false, false, 2, 2, 2, 2.f, a, 2, b, 2, 0.5f, c, 2, bias);
  CHECK(std::vector<float>(c, c + 4) == std::vector<float>{39.f, 43.5f, 87.f, 99.5f});
  std::vector<float> z(4, std::numeric_limits<float>::quiet_NaN());
  ag::cpu::sbgemm(false, false, 2, 2, 0, 1.f, a, 2, b, 2, 0.f, z.data(), 2, bias);
  CHECK(z == std::vector<float>{0.5f, -1.f, 0.5f, -1.f});
}

TEST_CASE("sbgemm: its packing rounds as pw::round_bf16 does: ties to even, carries, NaN, all layouts") {
  if (!have_bf16()) return;
  // c = op(a) @ I picks out the rounded entries of a one by one, and a @ op(b) those of b: the
  // packing of A (rows or panels) and of B (panels, from either layout) each checked for exact bits
  const float specials[] = {1.f + 0x1p-8f,           // a tie: to 1 (even)
                            1.f + 3 * 0x1p-8f,       // a tie: to 1 + 2^-6 (even)
                            -(1.f + 0x1p-8f),        // the same below zero
                            1.f + 0x1p-8f + 0x1p-20f,  // just past the tie: up
                            1.99999f,                // a carry into the exponent: 2
                            0x1.fffffep-100f,        // a carry in a small normal
                            3.0e38f,                 // large, finite in bf16
                            -0.f};
  const int64_t M = 13, K = 37;  // odd K: a zero pair; M over three panels of 6
  std::vector<float> x(size_t(M * K));
  uint32_t seed = 5;
  for (size_t i = 0; i < x.size(); ++i) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = i % 5 == 0 ? specials[(i / 5) % 8] : std::ldexp(float(seed >> 8) / float(1 << 23) - 1.f, int(seed % 7));
  }
  std::vector<float> xt(x.size()), eye(size_t(K * K), 0.f);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) xt[size_t(k * M + i)] = x[size_t(i * K + k)];
  for (int64_t k = 0; k < K; ++k) eye[size_t(k * K + k)] = 1.f;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    CAPTURE(ta);
    CAPTURE(tb);
    std::vector<float> c(size_t(M * K), -7.f), d(size_t(K * M), -7.f);
    ag::cpu::sbgemm(ta, tb, M, K, K, 1.f, ta ? xt.data() : x.data(), ta ? M : K, eye.data(), K, 0.f, c.data(), K);
    // d = I @ op(b) with op(b) = x^T (K x M): b stored as xt (as is) or as x (transposed)
    ag::cpu::sbgemm(ta, tb, K, M, K, 1.f, eye.data(), K, tb ? x.data() : xt.data(), tb ? K : M, 0.f, d.data(), M);
    int bad = 0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k) {
        const uint32_t want = ag::pw::float_bits(ag::pw::round_bf16(x[size_t(i * K + k)]));
        // + 0.f: -0 @ 1 summed from +0 gives +0 either way
        const uint32_t want_sum = ag::pw::float_bits(ag::pw::round_bf16(x[size_t(i * K + k)]) + 0.f);
        bad += ag::pw::float_bits(c[size_t(i * K + k)]) != want_sum && ag::pw::float_bits(c[size_t(i * K + k)]) != want;
        bad += ag::pw::float_bits(d[size_t(k * M + i)]) != want_sum && ag::pw::float_bits(d[size_t(k * M + i)]) != want;
      }
    CHECK(bad == 0);
  }
  // NaN stays NaN through the rounding (made quiet, never turned into inf)
  const float nan_payload = ag::pw::bits_float(0x7f800001u), one = 1.f;
  float y = 0.f;
  ag::cpu::sbgemm(false, false, 1, 1, 1, 1.f, &nan_payload, 1, &one, 1, 0.f, &y, 1);
  CHECK(std::isnan(y));
  ag::cpu::sbgemm(false, false, 1, 1, 1, 1.f, &one, 1, &nan_payload, 1, 0.f, &y, 1);
  CHECK(std::isnan(y));
}

TEST_CASE("sbgemm: bf16 autocast's matmul, native against the emulation, and the same bits at 1 and 2 threads") {
  if (!have_bf16()) return;
  const int before = ag::num_threads();
  const bool native_before = ag::cpu::sbgemm_native();
  ag::cpu::set_sbgemm_native(true);
  REQUIRE(ag::cpu::sbgemm_native());
  ag::Generator gen(17);
  const ag::Tensor a = ag::randn({300, 257}, ag::DType::f32, &gen), b = ag::randn({257, 190}, ag::DType::f32, &gen);
  ag::Tensor w = ag::randn({190, 257}, ag::DType::f32, &gen).set_requires_grad(true);
  const ag::Tensor g = ag::randn({300, 190}, ag::DType::f32, &gen);
  const ag::Tensor few = ag::randn({60, 257}, ag::DType::f32, &gen);
  // forward (matmul, linear) and backward (dW = g^T x, dx = g W): every product of the op. At 2
  // threads dW (190 rows < 257 columns) and few @ b (60 < 190) split C's columns, the others its rows
  auto run = [&] {
    ag::AutocastGuard bf16(ag::Precision::bf16);
    w.set_grad(ag::Tensor());
    const ag::Tensor x = a.detach().set_requires_grad(true);
    const ag::Tensor y = ag::linear(x, w);
    y.backward(g);
    return std::vector<std::vector<float>>{ag::matmul(a, b).to_vector<float>(), y.to_vector<float>(),
                                           x.grad().to_vector<float>(), w.grad().to_vector<float>(),
                                           ag::matmul(few, b).to_vector<float>()};
  };
  ag::set_num_threads(1);
  const auto one = run();
  ag::set_num_threads(2);
  const auto two = run();
  ag::cpu::set_sbgemm_native(false);
  const auto emulated = run();
  ag::cpu::set_sbgemm_native(native_before);
  ag::set_num_threads(before);
  for (size_t i = 0; i < one.size(); ++i) {
    CAPTURE(i);
    CHECK(one[i] == two[i]);
    // the same products of rounded operands, summed in another order: f32 rounding apart
    REQUIRE(one[i].size() == emulated[i].size());
    double worst = 0, scale = 0;
    for (size_t j = 0; j < one[i].size(); ++j) {
      worst = std::max(worst, double(std::abs(one[i][j] - emulated[i][j])));
      scale = std::max(scale, double(std::abs(emulated[i][j])));
    }
    CHECK(worst <= 1e-5 * scale);
    CHECK(one[i] != emulated[i]);  // and it did run another path
  }
}

TEST_CASE("sbgemm: refused with a message where the CPU has no AVX512-BF16, switchable where it has") {
  float c = 0, x = 1;
  // on by default wherever it runs (each test case is a process of its own under CTest)
  CHECK(ag::cpu::sbgemm_native() == (ag::cpu::sbgemm_supported() && ag::cpu::sgemm_kernel() == GemmKernel::avx512));
  if (ag::cpu::sbgemm_supported()) {
    const bool before = ag::cpu::sbgemm_native();
    ag::cpu::set_sbgemm_native(false);
    CHECK_FALSE(ag::cpu::sbgemm_native());
    ag::cpu::set_sbgemm_native(true);
    CHECK(ag::cpu::sbgemm_native() == (ag::cpu::sgemm_kernel() == GemmKernel::avx512));
    ag::cpu::set_sbgemm_native(before);
    ag::cpu::sbgemm(false, false, 1, 1, 1, 1.f, &x, 1, &x, 1, 0.f, &c, 1);
    CHECK(c == 1.f);
    return;
  }
  AG_CHECK_ERROR(ag::cpu::sbgemm(false, false, 1, 1, 1, 1.f, &x, 1, &x, 1, 0.f, &c, 1), "sbgemm", "avx512_bf16");
  AG_CHECK_ERROR(ag::cpu::set_sbgemm_native(true), "set_sbgemm_native", "avx512_bf16");
  CHECK_FALSE(ag::cpu::sbgemm_native());
}
