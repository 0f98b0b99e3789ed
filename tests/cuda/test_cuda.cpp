// The CUDA slot of the backend. On a machine without a GPU the GPU cases are reported by CTest as
// skipped (they print the marker matched by SKIP_REGULAR_EXPRESSION in CMakeLists.txt).
#include "core/dispatch.h"
#include "core/profile.h"
#include "cuda/memory.h"
#include "nn/linear.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

TEST_CASE("cuda: moving a tensor to a GPU that is not there is a clear error") {
  Tensor x = ones({2, 2});
  const int n = cuda::device_count();  // cuda:n is one past the last GPU (cuda:0 on a machine without)
  const std::string where = fmt::format("cuda:{}", n);
  AG_CHECK_ERROR(x.to(Device::cuda(n)), where.c_str());
  if (!cuda::available()) CHECK(n == 0);
}

TEST_CASE("cuda: host -> device -> host round trip keeps values and gradients") {
  if (skip_without_gpu()) return;
  Tensor x = arange(0, 12, 1, DType::f32).reshape({3, 4}).detach().set_requires_grad(true);
  Tensor d = x.to(Device::cuda(0));
  CHECK(d.device() == Device::cuda(0));
  Tensor back = d.cpu();
  check_close(back, x);
  back.backward(ones({3, 4}));  // the gradient flows back across both copies
  check_close(x.grad(), ones({3, 4}));
}

TEST_CASE("cuda: ops on a CUDA tensor run its kernels there and agree with the cpu") {
  if (skip_without_gpu()) return;
  Tensor x = arange(-2, 2, 0.5, DType::f32);
  Tensor d = exp(x.to(Device::cuda(0)));  // map1 on the device: no copy to the host in between
  CHECK(d.device() == Device::cuda(0));
  check_close(d.cpu(), exp(x));
  cuda::synchronize(0);
}

TEST_CASE("cuda: KERNEL runs the CUDA kernel of a CUDA tensor, or says why it cannot") {
  if (!kHasCuda) {  // a build without the CUDA backend names the kernel and the device
    Layout l;
    auto call = [&] { KERNEL(Device::cuda(0), fill<float>, nullptr, l, 0.0f); };
    AG_CHECK_ERROR(call(), "fill<float>", "cuda:0", "no CUDA kernel");
    return;
  }
  if (!cuda::available()) {  // a CUDA build on a machine without a GPU: the runtime's error, named
    Layout l;
    auto call = [&] { KERNEL(Device::cuda(0), fill<float>, nullptr, l, 0.0f); };
    AG_CHECK_ERROR(call(), "cudaSetDevice");
    return;
  }
  Tensor t = zeros({5}, DType::f32, Device::cuda(0));
  KERNEL(t.device(), fill<float>, t.data<float>(), layout(t), 3.0f);
  check_close(t.cpu(), full({5}, 3));
}

TEST_CASE("cuda: Module::to moves every parameter, and device() reports where they went") {
  if (skip_without_gpu()) return;
  nn::Linear layer(3, 2);
  CHECK(layer.device() == Device::cpu());
  layer.to(Device::cuda(0));
  CHECK(layer.device() == Device::cuda(0));
  for (const Tensor& p : layer.parameters()) CHECK(p.device() == Device::cuda(0));
  layer.to(Device::cpu());
  CHECK(layer.device() == Device::cpu());
}

TEST_CASE("cuda: the kernel profiler times GPU kernels by CUDA events, within the wall time") {
  if (skip_without_gpu()) return;
  Generator gen(3);
  Tensor a = randn({512, 512}, DType::f32, &gen).to(Device::cuda(0));
  Tensor b = randn({512, 512}, DType::f32, &gen).to(Device::cuda(0));
  (void)matmul(a, b).cpu();  // warm: cuBLAS's handle and the stream exist
  KernelProfiler prof;
  for (int i = 0; i < 4; ++i) (void)matmul(a, b);
  KernelReport r = prof.report();
  REQUIRE(r.kernels.size() == 1);
  CHECK(r.kernels[0].name == "matmul_forward");
  CHECK(r.kernels[0].device == Device::cuda(0));
  CHECK(r.kernels[0].calls == 4);
  CHECK(r.kernels[0].ms > 0);  // 4 x 268 MFLOP: tens of microseconds at least
  CHECK(r.kernel_ms(Device::CUDA) <= r.wall_ms);
  CHECK(r.kernel_ms(Device::CPU) == 0);
}
