#pragma once
// Matmul kernels: C = A B over the last two dims, batched (math in autograd/ops.h, matmul).
//
// Every operand is described as BLAS reads it, so transposed views need no copy: element (i, k)
// of a (M, K) operand x is at x[i * ld + k] when !trans, at x[k * ld + i] when trans (x holds the
// transpose, a (K, M) row-major matrix). The batch is a Layout over the batch dims, shared by all
// operands (same shape) with each operand's own strides (0 where it is broadcast). The output is
// contiguous: (batch, M, N).
#include <cstdint>

#include "core/precision.h"

namespace ag { struct Layout; }

namespace ag::cpu {

struct Gemm {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0;
  const Layout* batch_a = nullptr;  // batch dims of a; nullptr = a single matrix
  const Layout* batch_b = nullptr;  // batch dims of b, same shape as batch_a
  // autocast (autograd/autocast.h; f32 only): bf16 or fp16 reads both operands rounded to that
  // format and sums the products in f32. The backward GEMMs inherit it (dout is rounded too).
  Precision operands = Precision::fp32;
};

// How many elements from operand x's first to its last one (batch included): a (M, K) operand read
// as (rows, cols) = (M, K), or (K, M) when trans, with leading dim ld, over a batch of `batch`'s
// strides (null: one matrix). What a rounded copy of the operand must cover; 0 when it is empty.
int64_t operand_span(bool trans, int64_t rows, int64_t cols, int64_t ld, const Layout* batch);

// c (batch, M, N) = a (batch, M, K) @ b (batch, K, N), through single-threaded GEMM calls (sgemm
// below for f32, cblas_dgemm for f64); the kernel splits the batch, or the rows of one GEMM, over
// attograd's threads.
// With `bias` (N values) every row of every C gets it added: y = x W^T + b of a Linear in one pass.
template <class T> void matmul_forward(T* c, const T* a, const T* b, const Gemm& g, const T* bias = nullptr);
// The same product as a triple loop: the algorithmic reference the GEMM path is tested against.
template <class T> void matmul_forward_naive(T* c, const T* a, const T* b, const Gemm& g);
// da (batch, M, K) = dout @ b^T,  db (batch, K, N) = a^T @ dout;  dout (batch, M, N) contiguous.
// Either of da, db may be null (not needed). Unlike the other backward kernels these WRITE the
// gradients (GEMM beta = 0): the op front allocates them fresh, and zero-filling a buffer only to
// add into it would cost a noticeable fraction of the GEMM itself.
template <class T> void matmul_backward(T* da, T* db, const T* dout, const T* a, const T* b, const Gemm& g);

// One single-threaded GEMM, row-major: c (M, N; leading dim ldc) = alpha op(a) op(b) + beta c,
// op(x) = x or x^T by the flag (a is (M, K) as read, b is (K, N)); beta == 0 means c is not read,
// K == 0 means c = beta c. f32 runs attograd's own sgemm below, f64 cblas_dgemm. Also for kernels
// that run their own small GEMMs inside a parallel loop.
template <class T>
void gemm_blas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* a, int64_t lda, const T* b,
               int64_t ldb, T beta, T* c, int64_t ldc);

// ---- attograd's sgemm (core/cpu/gemm.cpp) ----------------------------------------------------
// The micro-kernels: AVX-512F, AVX2+FMA, plain C++; openblas is cblas_sgemm (for comparison).
enum class GemmKernel { avx512, avx2, portable, openblas };

// gemm_blas<float>'s contract, single-threaded, on the kernel sgemm_kernel() names; with `bias`
// (N floats) c = alpha op(a) op(b) + beta c + bias, the bias added to every row in the same pass
// (Linear layers: no second pass over c).
void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias = nullptr);
// The same on kernel k, which must be supported by this CPU (tests and benches compare kernels).
void sgemm_with(GemmKernel k, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                const float* bias = nullptr);
// The kernel sgemm runs. Chosen at first use: ATTOGRAD_GEMM=avx512|avx2|portable|openblas when
// set (ag::Error when unknown or not supported by this CPU), else the widest the CPU supports.
// Call it outside parallel regions first (matmul does), so that a bad setting throws there.
GemmKernel sgemm_kernel();
const char* sgemm_kernel_name();                // "avx512", ... of sgemm_kernel()
const char* gemm_kernel_name(GemmKernel k);     // "avx512", ... of k
bool sgemm_kernel_supported(GemmKernel k);      // whether this CPU runs k
GemmKernel gemm_kernel_named(const char* name); // "avx512" -> avx512 ... (ag::Error: unknown/unsupported)
void set_sgemm_kernel(GemmKernel k);            // replaces the choice (ag::Error when unsupported)

// c (M, N; ldc) = op(a) op(b) for a few rows (M <= kSmallRows), reading both operands where they
// are: packing B for one row (a token's activations against a weight, in generation) costs ten
// times the product itself. op(b) stored transposed (a Linear's weight, (N, K)): one dot product
// along K per element; stored as is: rows of B scaled and added. matmul picks it by the rows of the
// whole matrix (never of a thread's piece), so a result never depends on the thread count.
inline constexpr int64_t kSmallRows = 4;
void sgemm_small_m(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float* c, int64_t ldc, const float* bias = nullptr);

}  // namespace ag::cpu

// ---- the same kernels on the GPU (cuda/matmul.cu): cuBLAS on the device's stream ---------------
// Same signatures and conventions as above (row-major operands, lda meaning, trans flags, batch
// Layouts, da/db written, not added). The batch runs as one strided-batched GEMM per run of
// uniformly strided batch dims (broadcast stride 0 included); f32 is cublasSgemm, f64 cublasDgemm.
namespace ag::cuda {

using Gemm = cpu::Gemm;

template <class T> void matmul_forward(T* c, const T* a, const T* b, const Gemm& g, const T* bias = nullptr);
template <class T> void matmul_forward_naive(T* c, const T* a, const T* b, const Gemm& g);
template <class T> void matmul_backward(T* da, T* db, const T* dout, const T* a, const T* b, const Gemm& g);

}  // namespace ag::cuda
