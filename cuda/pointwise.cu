// The GPU elementwise engine (declared in core/kernels/pointwise.h): the twin of cpu::map1/map2/
// map3 (core/cpu/loops.h), running the same functors of core/kernels/pointwise.h, which are
// __host__ __device__ (AG_HD). Math of each functor: autograd/ops.h.
//
//   out (n) contiguous in the layouts' shape;  a, b, c strided by la, lb, lc (already expanded to
//   that shape: a broadcast dim has stride 0)
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

// ---- instantiations: every (functor, dtype) of autograd/ops/elementwise.cpp ----------------------
// map_float1/2/3 (f32, f64), map_numeric2 and neg/add_/mul_ (f32, f64, i64), compare and where
// (every dtype). An op that pairs a functor with a new dtype adds one line here.
#define AG_MAP1(T, F) template void map1<T, T, pw::F>(T*, const T*, const Layout&, pw::F);
#define AG_MAP2(T, F) template void map2<T, T, T, pw::F>(T*, const T*, const Layout&, const T*, const Layout&, pw::F);
#define AG_CMP(T, F) \
  template void map2<bool, T, T, pw::F>(bool*, const T*, const Layout&, const T*, const Layout&, pw::F);
#define AG_MAP3(T, F)                                                                                         \
  template void map3<T, T, T, T, pw::F>(T*, const T*, const Layout&, const T*, const Layout&, const T*, \
                                        const Layout&, pw::F);
#define AG_WHERE(T)                                                                                                \
  template void map3<T, bool, T, T, pw::Where>(T*, const bool*, const Layout&, const T*, const Layout&, const T*, \
                                               const Layout&, pw::Where);
#define AG_FLOATING(T)                                                                                          \
  AG_MAP1(T, PowScalar) AG_MAP1(T, Exp) AG_MAP1(T, Log) AG_MAP1(T, Sqrt) AG_MAP1(T, Rsqrt) AG_MAP1(T, Tanh)    \
  AG_MAP1(T, Sigmoid) AG_MAP1(T, Relu) AG_MAP1(T, Abs) AG_MAP1(T, Silu) AG_MAP1(T, Gelu) AG_MAP1(T, GeluTanh) \
  AG_MAP1(T, Clamp)                                                                                             \
  AG_MAP2(T, ExpBackward) AG_MAP2(T, LogBackward) AG_MAP2(T, SqrtBackward) AG_MAP2(T, RsqrtBackward)            \
  AG_MAP2(T, TanhBackward) AG_MAP2(T, SigmoidBackward) AG_MAP2(T, ReluBackward) AG_MAP2(T, AbsBackward)        \
  AG_MAP2(T, SiluBackward) AG_MAP2(T, GeluBackward) AG_MAP2(T, GeluTanhBackward) AG_MAP2(T, ClampBackward)     \
  AG_MAP2(T, PowScalarBackward) AG_MAP2(T, Div) AG_MAP2(T, Pow) AG_MAP2(T, Maximum) AG_MAP2(T, Minimum)        \
  AG_MAP3(T, DivBackwardB) AG_MAP3(T, PowBackwardX) AG_MAP3(T, PowBackwardT) AG_MAP3(T, MaximumBackwardA)      \
  AG_MAP3(T, MinimumBackwardA)
#define AG_NUMERIC(T) \
  AG_MAP1(T, Neg) AG_MAP1(T, Scale) AG_MAP2(T, Add) AG_MAP2(T, Sub) AG_MAP2(T, Mul) AG_MAP2(T, AddScaled)
#define AG_ANY(T) AG_CMP(T, Eq) AG_CMP(T, Ne) AG_CMP(T, Lt) AG_CMP(T, Le) AG_CMP(T, Gt) AG_CMP(T, Ge) AG_WHERE(T)

AG_FLOATING(float) AG_FLOATING(double)
AG_MAP1(float, RoundBf16) AG_MAP1(float, RoundFp16)  // autocast: f32 only
AG_NUMERIC(float) AG_NUMERIC(double) AG_NUMERIC(int64_t)
AG_ANY(float) AG_ANY(double) AG_ANY(int64_t) AG_ANY(bool)

#undef AG_ANY
#undef AG_NUMERIC
#undef AG_FLOATING
#undef AG_WHERE
#undef AG_MAP3
#undef AG_CMP
#undef AG_MAP2
#undef AG_MAP1

}  // namespace ag::cuda
