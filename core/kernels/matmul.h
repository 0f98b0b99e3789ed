#pragma once
// Matmul kernels: C = A B over the last two dims, batched (math in autograd/ops.h, matmul).
//
// Every operand is described as BLAS reads it, so transposed views need no copy: element (i, k)
// of a (M, K) operand x is at x[i * ld + k] when !trans, at x[k * ld + i] when trans (x holds the
// transpose, a (K, M) row-major matrix). The batch is a Layout over the batch dims, shared by all
// operands (same shape) with each operand's own strides (0 where it is broadcast). The output is
// contiguous: (batch, M, N).
#include <cstdint>

namespace ag { struct Layout; }

namespace ag::cpu {

struct Gemm {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0;
  const Layout* batch_a = nullptr;  // batch dims of a; nullptr = a single matrix
  const Layout* batch_b = nullptr;  // batch dims of b, same shape as batch_a
};

// c (batch, M, N) = a (batch, M, K) @ b (batch, K, N), through cblas_sgemm/dgemm (single-threaded
// BLAS calls; the kernel splits the batch, or the rows of one GEMM, over attograd's threads).
template <class T> void matmul_forward(T* c, const T* a, const T* b, const Gemm& g);
// The same product as a triple loop: the algorithmic reference the BLAS path is tested against.
template <class T> void matmul_forward_naive(T* c, const T* a, const T* b, const Gemm& g);
// da (batch, M, K) = dout @ b^T,  db (batch, K, N) = a^T @ dout;  dout (batch, M, N) contiguous.
// Either of da, db may be null (not needed). Unlike the other backward kernels these WRITE the
// gradients (BLAS beta = 0): the op front allocates them fresh, and zero-filling a buffer only to
// add into it would cost a noticeable fraction of the GEMM itself.
template <class T> void matmul_backward(T* da, T* db, const T* dout, const T* a, const T* b, const Gemm& g);

// One single-threaded BLAS call, row-major: c (M, N; leading dim ldc) = alpha op(a) op(b) + beta c,
// op(x) = x or x^T by the flag (a is (M, K) as read, b is (K, N)). For kernels that run their own
// small GEMMs inside a parallel loop (attention).
template <class T>
void gemm_blas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* a, int64_t lda, const T* b,
               int64_t ldb, T beta, T* c, int64_t ldc);

}  // namespace ag::cpu
