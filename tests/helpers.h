#pragma once
// Shared test helpers: closeness checks with the tolerance in the message, error assertions,
// and gradcheck wrapped for doctest.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "attograd.h"
#include "cuda/memory.h"

namespace ag::test {

// The GPU cases: true (and the marker CTest lists as a skip, CMakeLists.txt) when no GPU is usable.
inline bool skip_without_gpu() {
  if (cuda::available()) return false;
  MESSAGE("[skipped: no CUDA device]");
  return true;
}

// Every |a_i - b_i| <= atol + rtol |b_i| (NaN equals NaN), with the first offender in the message.
inline void check_close(const std::vector<double>& a, const std::vector<double>& b, double atol = 1e-6,
                        double rtol = 1e-5) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    bool both_nan = std::isnan(a[i]) && std::isnan(b[i]);
    bool ok = both_nan || (a[i] == b[i]) || std::abs(a[i] - b[i]) <= atol + rtol * std::abs(b[i]);
    if (!ok) {
      FAIL_CHECK(fmt::format("element {}: got {:.9g}, expected {:.9g} (atol {}, rtol {})", i, a[i], b[i], atol, rtol));
      return;
    }
  }
}
inline void check_close(const Tensor& a, const std::vector<double>& b, double atol = 1e-6, double rtol = 1e-5) {
  check_close(a.to_vector<double>(), b, atol, rtol);
}
inline void check_close(const Tensor& a, const Tensor& b, double atol = 1e-6, double rtol = 1e-5) {
  CHECK(a.shape() == b.shape());
  check_close(a.to_vector<double>(), b.to_vector<double>(), atol, rtol);
}

// f64 leaf with values from a seeded normal, requiring grad.
inline Tensor leaf64(const Shape& shape, uint64_t seed = 1, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(shape, DType::f64, &g), scale).detach().set_requires_grad(true);
}

// The values the reference scripts under tools/ use for weights and inputs:
// v_k = 0.5 sin(1.3 k + phase), k the row-major element index.
inline Tensor vals(const Shape& shape, double phase, DType dtype = DType::f32) {
  std::vector<double> v(size_t(shape.numel()));
  for (size_t k = 0; k < v.size(); ++k) v[k] = 0.5 * std::sin(1.3 * double(k) + phase);
  return from_vector(v, shape).to(dtype);
}

// A fresh folder for one test case, removed with everything in it at the end.
struct TempDir {
  std::filesystem::path dir;
  explicit TempDir(const std::string& tag) {
    dir = std::filesystem::temp_directory_path() / fmt::format("attograd_test_{}_{}", tag, ::getpid());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string file(const std::string& name) const { return (dir / name).string(); }
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  return std::string(std::istreambuf_iterator<char>(f), {});
}
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  REQUIRE(f.good());
}

// Runs gradcheck and reports its worst element on failure.
inline void expect_gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                             const std::vector<Tensor>& inputs, GradcheckOptions opt = {}) {
  GradcheckResult r = gradcheck(f, inputs, opt);
  INFO(r.message);
  CHECK(r.ok);
}

// Asserts that `expr` throws ag::Error whose message contains every fragment.
#define AG_CHECK_ERROR(expr, ...)                                                 \
  do {                                                                            \
    std::string ag_msg_;                                                          \
    try {                                                                         \
      (void)(expr);                                                               \
    } catch (const ::ag::Error& e) {                                              \
      ag_msg_ = e.what();                                                         \
    }                                                                             \
    INFO("message: " << ag_msg_);                                                 \
    CHECK_MESSAGE(!ag_msg_.empty(), "expected ag::Error from " #expr);            \
    for (const char* frag : {__VA_ARGS__}) CHECK(ag_msg_.find(frag) != std::string::npos); \
  } while (0)

}  // namespace ag::test
