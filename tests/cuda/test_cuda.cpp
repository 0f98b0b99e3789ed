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

TEST_CASE("cuda: bf16 and f16 tensors convert, copy and fill on the GPU with the CPU's bits") {
  if (skip_without_gpu()) return;
  // ties, carries, both formats' range ends, subnormals, NaN; a transposed view (strided copies)
  const std::vector<float> v = {1.f, 1.f + 0x1p-8f, 1.f + 3 * 0x1p-8f, 1.f + 0x1p-11f, 1.99999f, -0.1f,
                                65519.f, 65520.f, 3e38f, 0x1p-24f, 0x1p-25f, 1e-40f,
                                -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                                0.f, -0.f};
  const Tensor x = from_vector<float>(v, {4, 4});
  for (DType t : {DType::bf16, DType::f16}) {
    CAPTURE(name(t));
    const Tensor cpu = x.transpose(0, 1).to(t);
    const Tensor gpu = x.to(Device::cuda(0)).transpose(0, 1).to(t);
    CHECK(gpu.device() == Device::cuda(0));
    CHECK(gpu.dtype() == t);
    const Tensor back = gpu.cpu();
    CHECK(std::memcmp(back.raw_data(), cpu.raw_data(), cpu.nbytes()) == 0);
    // and back to f32 on the device: exact
    CHECK(std::memcmp(gpu.to(DType::f32).cpu().raw_data(), cpu.to(DType::f32).raw_data(), 64) == 0);
    Tensor f = zeros({3}, t, Device::cuda(0));
    f.fill_(0.1);
    CHECK(std::memcmp(f.cpu().raw_data(), full({3}, 0.1, t).raw_data(), 6) == 0);
  }
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
