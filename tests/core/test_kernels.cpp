// The kernel index (core/kernels.h): each kernel is declared once for both backends, so cpu:: and
// cuda:: have the same signatures by construction; and the stream that extensions launch their
// own CUDA kernels on (ag::cuda::stream, cuda/memory.h).
#include <type_traits>

#include "core/dispatch.h"
#include "cuda/memory.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

// One line of core/kernels/<family>.h declares both; a kernel whose two versions disagree cannot
// be written any more. A few of every family, at compile time:
static_assert(std::is_same_v<decltype(cpu::cast_copy<float, bool>), decltype(cuda::cast_copy<float, bool>)>);
static_assert(std::is_same_v<decltype(cpu::sum_forward<double>), decltype(cuda::sum_forward<double>)>);
static_assert(std::is_same_v<decltype(cpu::layer_norm_backward<float>), decltype(cuda::layer_norm_backward<float>)>);
static_assert(std::is_same_v<decltype(cpu::matmul_forward<float>), decltype(cuda::matmul_forward<float>)>);
static_assert(std::is_same_v<decltype(cpu::index_select_backward<float>),
                             decltype(cuda::index_select_backward<float>)>);
static_assert(std::is_same_v<decltype(cpu::attention_backward<float>), decltype(cuda::attention_backward<float>)>);
static_assert(std::is_same_v<decltype(cpu::adam_update<float>), decltype(cuda::adam_update<float>)>);
static_assert(std::is_same_v<decltype(cpu::map2<bool, float, float, pw::Lt>),
                             decltype(cuda::map2<bool, float, float, pw::Lt>)>);
// the argument types are shared too, under both backends' names
static_assert(std::is_same_v<cpu::Gemm, cuda::Gemm> && std::is_same_v<cpu::AttentionGeom, cuda::AttentionGeom>);

TEST_CASE("kernels: the CPU engine runs a listed (functor, dtype) pair through KERNEL") {
  // map2 with pw::Sub on i64 is instantiated by core/cpu/pointwise.cpp from the list in
  // core/kernels/pointwise.h; the caller sees only its declaration
  const std::vector<int64_t> a = {5, 7, 9}, b = {1, 2, 3};
  std::vector<int64_t> out(3);
  Layout l;
  l.ndim = 1;
  l.shape[0] = 3;
  l.strides[0] = 1;
  KERNEL(Device::cpu(), map2, out.data(), a.data(), l, b.data(), l, pw::Sub{});
  CHECK(out == std::vector<int64_t>{4, 5, 6});
}

TEST_CASE("kernels: cuda::stream without the CUDA backend is a clear error") {
  if (kHasCuda) return;  // the CUDA build checks the stream itself (the case below)
  AG_CHECK_ERROR(cuda::stream(0), "cuda:0", "no CUDA backend");
}

TEST_CASE("kernels: cuda::stream is the device's one stream, the one attograd's kernels use") {
  if (skip_without_gpu()) return;
  cuda::set_device(0);
  void* s = cuda::stream(0);
  CHECK(s != nullptr);
  CHECK(cuda::stream(0) == s);  // created once, then the same every call
}
