// The GPU elementwise engine (declared, with its shapes, in core/kernels/core.h): the twin of
// cpu::map1/map2/map3 (core/cpu/loops.h), running the same functors of core/kernels/pointwise.h,
// which are __host__ __device__ (AG_HD), for the same list of (functor, dtype) pairs (the end of
// that header). Math of each functor: autograd/ops.h.
//
// One thread per output element, in grid-stride loops; the layouts are coalesced on the host
// (cuda/loops.cuh), so the common all-contiguous case indexes with no division. out may be one of
// the inputs (add_, mul_): each thread reads its element before writing it.
#include "core/kernels/pointwise.h"
#include "cuda/loops.cuh"

namespace ag::cuda {

namespace {

template <class R, class A, class F>
__global__ void map1_kernel(R* out, const A* a, Plan<1> p, F f) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[1];
    plan_offsets(p, i, off);
    out[i] = f(a[off[0]]);
  }
}

template <class R, class A, class B, class F>
__global__ void map2_kernel(R* out, const A* a, const B* b, Plan<2> p, F f) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    plan_offsets(p, i, off);
    out[i] = f(a[off[0]], b[off[1]]);
  }
}

template <class R, class A, class B, class C, class F>
__global__ void map3_kernel(R* out, const A* a, const B* b, const C* c, Plan<3> p, F f) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[3];
    plan_offsets(p, i, off);
    out[i] = f(a[off[0]], b[off[1]], c[off[2]]);
  }
}

}  // namespace

template <class R, class A, class F>
void map1(R* out, const A* a, const Layout& la, F f) {
  const Layout* const in[1] = {&la};
  const Plan<1> p = make_plan<1>(in);
  if (p.n == 0) return;
  map1_kernel<<<blocks_for(p.n), kThreads, 0, stream()>>>(out, a, p, f);
  kernelCheck();
}

template <class R, class A, class B, class F>
void map2(R* out, const A* a, const Layout& la, const B* b, const Layout& lb, F f) {
  const Layout* const in[2] = {&la, &lb};
  const Plan<2> p = make_plan<2>(in);
  if (p.n == 0) return;
  map2_kernel<<<blocks_for(p.n), kThreads, 0, stream()>>>(out, a, b, p, f);
  kernelCheck();
}

template <class R, class A, class B, class C, class F>
void map3(R* out, const A* a, const Layout& la, const B* b, const Layout& lb, const C* c, const Layout& lc, F f) {
  const Layout* const in[3] = {&la, &lb, &lc};
  const Plan<3> p = make_plan<3>(in);
  if (p.n == 0) return;
  map3_kernel<<<blocks_for(p.n), kThreads, 0, stream()>>>(out, a, b, c, p, f);
  kernelCheck();
}

// Every (functor, dtype) pair the op fronts use, listed in core/kernels/pointwise.h.
AG_INSTANTIATE_POINTWISE_KERNELS

}  // namespace ag::cuda
