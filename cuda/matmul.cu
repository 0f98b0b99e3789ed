// Matmul on the GPU through cuBLAS. Shapes and contracts: core/kernels/matmul.h. Math:
// autograd/ops.h (matmul).
//
// Row-major operands, column-major cuBLAS. A row-major (R, C) matrix with leading dim ld is, read
// column-major with the same ld, its transpose (C, R). So instead of C = op(A) op(B) we ask cuBLAS
// for C^T = op(B)^T op(A)^T, which it writes column-major as (N, M) with ldc = N: exactly the
// row-major (M, N) C. Element by element:
//   b stored as is   (k, j) at b[k*ldb + j]: column-major that is X[j, k], X = op(B)^T  -> CUBLAS_OP_N
//   b stored trans   (k, j) at b[j*ldb + k]: column-major that is X[k, j], X = op(B)   -> CUBLAS_OP_T
// and the same for a. So each operand's trans flag IS its cuBLAS flag, and the call is
//   gemm(op_b, op_a, m = N, n = M, k = K, alpha, b, ldb, a, lda, beta, c, N)
// with cuBLAS's leading-dim rules (op N: ld >= rows, op T: ld >= cols of the stored matrix) being
// those of row-major BLAS that the front already honours. No operand is ever copied.
//
// Batches. Matrix p of the batch starts at offset(p) = sum_d idx_d(p) strides[d] in each operand.
// When that is p * s for one stride s (contiguous batches, or broadcast: s = 0), the whole batch is
// one cublas<t>gemmStridedBatched call. Otherwise (e.g. a (2, 3) batch broadcast along its first
// dim only) the batch dims split into an outer part, looped over, and the longest inner run of dims
// that is uniformly strided in both operands, one strided-batched call per outer index.
// C is contiguous, so it is uniform over any run of dims.
//
// The bias epilogue: C is first filled with the bias broadcast to every row (one small kernel),
// then the GEMM runs with beta = 1: c = a b + c. One extra write of C, no second read-modify pass.
//
// TF32: whether cuBLAS may use it for f32 is the handle's math mode (cuda/common.cuh); its default
// is full f32, which the CPU == GPU tests rely on.
//
// Autocast (Gemm::operands bf16 or fp16, autograd/autocast.h): a and b are first converted to
// bfloat16 or half copies (one pass over each operand's span, same element offsets, so the
// descriptions above still hold), then cublasGemmEx / cublasGemmStridedBatchedEx multiply them on
// the tensor cores with f32 accumulation (CUBLAS_COMPUTE_32F) into the f32 C. The conversions round
// to nearest even, the bits of the CPU's pw::round_bf16 / pw::round_fp16, so both backends
// multiply the same numbers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include <type_traits>

#include "core/kernels.h"
#include "core/kernels/pointwise.h"
#include "cuda/common.cuh"

namespace ag::cuda {

namespace {

// Element offset of matrix p of a batch over the dims [d0, ndim) of l (row-major over those dims).
int64_t batch_offset(const Layout* l, int64_t p, int d0 = 0) {
  if (!l) return 0;
  int64_t off = 0;
  for (int d = l->ndim - 1; d >= d0; --d) {
    off += (p % l->shape[d]) * l->strides[d];
    p /= l->shape[d];
  }
  return off;
}

// Whether the dims [d0, ndim) of l step by one stride s: offset(p) = p s. True for a null layout.
bool uniform_from(const Layout* l, int d0, int64_t& s) {
  s = 0;
  if (!l) return true;
  int64_t inner = 1;  // matrices per step of dim d
  bool have = false;
  for (int d = l->ndim - 1; d >= d0; --d) {
    if (l->shape[d] != 1) {
      if (!have) s = l->strides[d], have = true;  // the innermost dim that moves: inner is 1 there
      if (l->strides[d] != s * inner) return false;
    }
    inner *= l->shape[d];
  }
  return true;
}

// c (rows, N) = bias broadcast to every row
template <class T>
__global__ void fill_rows_kernel(T* c, const T* bias, int64_t rows, int64_t N) {
  const int64_t n = rows * N;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    c[e] = bias[e % N];
}

// The naive product, one thread per element of C: the reference the cuBLAS path is tested against.
// With 16-bit operands (f32 only) each is rounded as it is read, as the CPU's naive kernel does.
template <class T>
__global__ void matmul_naive_kernel(T* c, const T* a, const T* b, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                                    int64_t lda, int64_t ldb, Precision operands) {
  const int64_t n = M * N;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / N, j = e % N;
    T acc = 0;
    for (int64_t k = 0; k < K; ++k) {
      T x = ta ? a[k * lda + i] : a[i * lda + k], w = tb ? b[j * ldb + k] : b[k * ldb + j];
      if constexpr (std::is_same_v<T, float>)
        x = pw::round_operand(x, operands), w = pw::round_operand(w, operands);
      acc += x * w;
    }
    c[e] = acc;
  }
}

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

// count GEMMs, matrix p at a + p*sa, b + p*sb, c + p*M*N (see the top of the file for the mapping)
void gemm_batched(const float* a, int64_t sa, const float* b, int64_t sb, float* c, int64_t count, const Gemm& g,
                  float beta) {
  const float alpha = 1;
  if (count == 1)
    cublasCheck(cublasSgemm(cublas(), op(g.trans_b), op(g.trans_a), int(g.N), int(g.M), int(g.K), &alpha, b,
                            int(g.ldb), a, int(g.lda), &beta, c, int(g.N)));
  else
    cublasCheck(cublasSgemmStridedBatched(cublas(), op(g.trans_b), op(g.trans_a), int(g.N), int(g.M), int(g.K),
                                          &alpha, b, int(g.ldb), sb, a, int(g.lda), sa, &beta, c, int(g.N),
                                          g.M * g.N, int(count)));
}
void gemm_batched(const double* a, int64_t sa, const double* b, int64_t sb, double* c, int64_t count, const Gemm& g,
                  double beta) {
  const double alpha = 1;
  if (count == 1)
    cublasCheck(cublasDgemm(cublas(), op(g.trans_b), op(g.trans_a), int(g.N), int(g.M), int(g.K), &alpha, b,
                            int(g.ldb), a, int(g.lda), &beta, c, int(g.N)));
  else
    cublasCheck(cublasDgemmStridedBatched(cublas(), op(g.trans_b), op(g.trans_a), int(g.N), int(g.M), int(g.K),
                                          &alpha, b, int(g.ldb), sb, a, int(g.lda), sa, &beta, c, int(g.N),
                                          g.M * g.N, int(count)));
}

// 16-bit operands (bf16 or half), f32 C: tensor cores, f32 accumulation
template <class H> constexpr cudaDataType_t cuda_type();
template <> constexpr cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }
template <> constexpr cudaDataType_t cuda_type<__half>() { return CUDA_R_16F; }

template <class H>
void gemm_batched(const H* a, int64_t sa, const H* b, int64_t sb, float* c, int64_t count, const Gemm& g, float beta) {
  const float alpha = 1;
  constexpr cudaDataType_t t = cuda_type<H>();
  if (count == 1)
    cublasCheck(cublasGemmEx(cublas(), op(g.trans_b), op(g.trans_a), int(g.N), int(g.M), int(g.K), &alpha, b, t,
                             int(g.ldb), a, t, int(g.lda), &beta, c, CUDA_R_32F, int(g.N), CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT));
  else
    cublasCheck(cublasGemmStridedBatchedEx(cublas(), op(g.trans_b), op(g.trans_a), int(g.N), int(g.M), int(g.K),
                                           &alpha, b, t, int(g.ldb), sb, a, t, int(g.lda), sa, &beta, c, CUDA_R_32F,
                                           int(g.N), g.M * g.N, int(count), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// y[0, n) = x[0, n) as bfloat16 or half, rounded to nearest even
__device__ inline void to_16(__nv_bfloat16& y, float x) { y = __float2bfloat16_rn(x); }
__device__ inline void to_16(__half& y, float x) { y = __float2half_rn(x); }
template <class H>
__global__ void to_16bit_kernel(H* y, const float* x, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    to_16(y[e], x[e]);
}

// The GEMMs of one forward call: the batch in strided-batched runs (see the top of the file).
// A is the operands' element type (T, or bf16 / half for autocast), C's is T.
template <class A, class T>
void gemm_runs(T* c, const A* a, const A* b, const Gemm& g, T beta) {
  const Layout* lay = g.batch_a ? g.batch_a : g.batch_b;
  const int64_t P = lay ? lay->numel() : 1, M = g.M, N = g.N;
  // the outer dims [0, d0) are looped over; the inner run [d0, ndim) is uniform in a and b
  const int nd = lay ? lay->ndim : 0;
  int d0 = 0;
  int64_t sa = 0, sb = 0;
  while (d0 < nd && !(uniform_from(g.batch_a, d0, sa) && uniform_from(g.batch_b, d0, sb))) ++d0;
  int64_t inner = 1;
  for (int d = d0; d < nd; ++d) inner *= lay->shape[d];
  for (int64_t o = 0; o < P / inner; ++o) {
    const int64_t p = o * inner;  // the first matrix of this run
    // count is an int in cuBLAS: a longer run goes in pieces
    for (int64_t p0 = 0; p0 < inner; p0 += (int64_t(1) << 30)) {
      const int64_t n = std::min<int64_t>(inner - p0, int64_t(1) << 30);
      gemm_batched(a + batch_offset(g.batch_a, p) + p0 * sa, sa, b + batch_offset(g.batch_b, p) + p0 * sb, sb,
                   c + (p + p0) * M * N, n, g, beta);
    }
  }
}

// autocast: 16-bit copies of both operands (H: __nv_bfloat16 or __half), then tensor-core GEMMs
template <class H>
void gemm_16bit(float* c, const float* a, const float* b, const Gemm& g, float beta) {
  const int64_t na = cpu::operand_span(g.trans_a, g.M, g.K, g.lda, g.batch_a);
  const int64_t nb = cpu::operand_span(g.trans_b, g.K, g.N, g.ldb, g.batch_b);
  Scratch ra(size_t(na) * sizeof(H)), rb(size_t(nb) * sizeof(H));
  to_16bit_kernel<H><<<blocks_for(na), kThreads, 0, stream()>>>(ra.as<H>(), a, na);
  kernelCheck();
  to_16bit_kernel<H><<<blocks_for(nb), kThreads, 0, stream()>>>(rb.as<H>(), b, nb);
  kernelCheck();
  gemm_runs(c, ra.as<const H>(), rb.as<const H>(), g, beta);
}

}  // namespace

template <class T>
void matmul_forward(T* c, const T* a, const T* b, const Gemm& g, const T* bias) {
  const Layout* lay = g.batch_a ? g.batch_a : g.batch_b;
  const int64_t P = lay ? lay->numel() : 1, M = g.M, N = g.N;
  if (P == 0 || M == 0 || N == 0) return;
  if (bias) {  // c = bias in every row, then c = a b + c
    fill_rows_kernel<T><<<blocks_for(P * M * N), 256, 0, stream()>>>(c, bias, P * M, N);
    kernelCheck();
  } else if (g.K == 0) {  // an empty sum: C = 0 (cuBLAS need not write C when k = 0)
    cudaCheck(cudaMemsetAsync(c, 0, size_t(P * M * N) * sizeof(T), stream()));
  }
  if (g.K == 0) return;
  const T beta = bias ? T(1) : T(0);
  if constexpr (std::is_same_v<T, float>) {
    if (g.operands == Precision::bf16) return gemm_16bit<__nv_bfloat16>(c, a, b, g, beta);
    if (g.operands == Precision::fp16) return gemm_16bit<__half>(c, a, b, g, beta);
  }
  if (g.operands != Precision::fp32) raise("cuda matmul: 16-bit operands are f32 only (the op front casts nothing else)");
  gemm_runs(c, a, b, g, beta);
}

template <class T>
void matmul_forward_naive(T* c, const T* a, const T* b, const Gemm& g) {
  const Layout* lay = g.batch_a ? g.batch_a : g.batch_b;
  const int64_t P = lay ? lay->numel() : 1;
  for (int64_t p = 0; p < P; ++p) {
    if (g.M * g.N == 0) break;
    matmul_naive_kernel<T><<<blocks_for(g.M * g.N), 256, 0, stream()>>>(
        c + p * g.M * g.N, a + batch_offset(g.batch_a, p), b + batch_offset(g.batch_b, p), g.M, g.N, g.K, g.trans_a,
        g.trans_b, g.lda, g.ldb, g.operands);
    kernelCheck();
  }
}

template <class T>
void matmul_backward(T* da, T* db, const T* dout, const T* a, const T* b, const Gemm& g) {
  // da = dout @ b^T and db = a^T @ dout (math: autograd/ops.h, matmul) are GEMMs of the forward
  // kernel (beta = 0: written, not added); transposing a stored operand only flips its cuBLAS
  // flag. Same structure as cpu::matmul_backward. (Calls are qualified, so that they name cuda::
  // whatever argument-dependent lookup would add.)
  const Layout* lay = g.batch_a ? g.batch_a : g.batch_b;
  Layout dense;  // dout's batch strides: contiguous (B, M, N)
  if (lay) {
    dense.ndim = lay->ndim;
    int64_t st = g.M * g.N;
    for (int d = dense.ndim - 1; d >= 0; --d) {
      dense.shape[d] = lay->shape[d];
      dense.strides[d] = st;
      st *= dense.shape[d];
    }
  }
  const Layout* batch_dout = lay ? &dense : nullptr;
  if (da) {
    Gemm gd{g.M, g.K, g.N, false, !g.trans_b, g.N, g.ldb, batch_dout, g.batch_b, g.operands};
    cuda::matmul_forward<T>(da, dout, b, gd, nullptr);
  }
  if (db) {
    Gemm gd{g.K, g.N, g.M, !g.trans_a, false, g.lda, g.N, g.batch_a, batch_dout, g.operands};
    cuda::matmul_forward<T>(db, a, dout, gd, nullptr);
  }
}

// The kernels of core/kernels/matmul.h for the dtypes listed there.
AG_INSTANTIATE_MATMUL_KERNELS

}  // namespace ag::cuda
