// Matmul on attograd's own sgemm for f32 (core/cpu/gemm.cpp) and OpenBLAS's cblas_dgemm for f64.
// Shapes and contracts: core/kernels/matmul.h. Math: autograd/ops.h (matmul).
//
// Threads: every GEMM call is single-threaded (sgemm always; OpenBLAS is set to one thread in
// core/parallel.cpp) and this file splits the work over attograd's own pool. C is seen as one tall
// matrix of B*M rows; thread t of nt computes the rows [t*B*M/nt, (t+1)*B*M/nt), each boundary
// moved to the nearest multiple of kRowTile inside its matrix. So a batch of >= nt matrices is
// split by whole matrices (exactly, when nt divides B), one big GEMM by contiguous row blocks, and
// every piece is one single-threaded GEMM call. When there are too few rows (a vector-matrix
// product, say) the columns of C are split instead. sgemm sums each element of C in an order that
// does not depend on the rows or columns it is given, so f32 results are the same bits whatever
// the thread count. OpenBLAS (f64, and f32 under ATTOGRAD_GEMM=openblas) has no such promise: in
// deterministic mode (core/parallel.h) its pieces are fixed by the sizes, not by the thread count.
#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <type_traits>

#include "core/allocator.h"
#include "core/kernels.h"
#include "core/kernels/pointwise.h"
#include "core/parallel.h"

namespace ag::cpu {

template <>
void gemm_blas<float>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  sgemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}
template <>
void gemm_blas<double>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* a,
                       int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(M),
              blasint(N), blasint(K), alpha, a, blasint(lda), b, blasint(ldb), beta, c, blasint(ldc));
}

namespace {

// Rows of C per tile: a multiple of the micro-kernel height of sgemm (6 rows, every kernel), so a
// row block cut on it leaves no ragged micro-tile in the middle of the matrix; 12 rather than 6
// for f64, whose OpenBLAS kernels are 4 to 16 rows tall.
constexpr int64_t kRowTile = 12;
// Columns of C per tile when the columns are split: the width of sgemm's AVX-512 tiles (64).
constexpr int64_t kColTile = 64;
// Multiply-adds below which a GEMM stays on one thread: waking the pool costs a few us, about
// what a single thread needs for 2^18 multiply-adds.
constexpr int64_t kMinWorkPerThread = int64_t(1) << 18;
// Pieces of C for an OpenBLAS GEMM in deterministic mode (see matmul_forward): enough for 8 threads
// to share evenly.
constexpr int64_t kFixedPieces = 24;

// Element offset of matrix p of a batch (row-major over the batch dims of l).
int64_t batch_offset(const Layout* l, int64_t p) {
  if (!l) return 0;
  int64_t off = 0;
  for (int d = l->ndim - 1; d >= 0; --d) {
    off += (p % l->shape[d]) * l->strides[d];
    p /= l->shape[d];
  }
  return off;
}

// Whether a product of few rows (M <= kSmallRows, by the whole matrix: never by a thread's piece)
// runs sgemm_small_m, which reads both operands where they are (and rounds autocast's as it reads).
bool small_m_path(const Gemm& g) { return g.M <= kSmallRows && sgemm_kernel() != GemmKernel::openblas; }

// Whether bf16 autocast's product runs sbgemm (native AVX512-BF16 products): more rows than
// sgemm_small_m takes, on a CPU where the bf16 products are native.
bool sbgemm_path(const Gemm& g) { return g.operands == Precision::bf16 && g.M > kSmallRows && sbgemm_native(); }

// Rows [i0, i1) and columns [j0, j1) of one C = op(A) op(B), C with leading dim N. Row i of op(A)
// starts at a + i*lda (stored as is) or at a + i (stored transposed); column j of op(B) at b + j
// or b + j*ldb. A block with K == 0 is all zeros (BLAS may leave C untouched then).
// With `bias`, C's columns [j0, j1) get bias[j0..j1) added to every row.
template <class T>
void gemm_block(T* c, const T* a, const T* b, const Gemm& g, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                const T* bias) {
  if (i1 <= i0 || j1 <= j0) return;
  T* cb = c + i0 * g.N + j0;
  const T* bb_ = bias ? bias + j0 : nullptr;
  if (g.K == 0) {
    for (int64_t i = i0; i < i1; ++i) {
      T* row = cb + (i - i0) * g.N;
      for (int64_t j = 0; j < j1 - j0; ++j) row[j] = bb_ ? bb_[j] : T(0);
    }
    return;
  }
  const T* ab = a + (g.trans_a ? i0 : i0 * g.lda);
  const T* bb = b + (g.trans_b ? j0 * g.ldb : j0);
  if constexpr (std::is_same_v<T, float>) {
    if (small_m_path(g))  // by the whole matrix's rows; rounds autocast's operands as it reads them
      sgemm_small_m(g.trans_a, g.trans_b, i1 - i0, j1 - j0, g.K, ab, g.lda, bb, g.ldb, cb, g.N, bb_, g.operands);
    else if (g.operands == Precision::bf16)  // only where matmul_forward chose the native bf16 products
      sbgemm(g.trans_a, g.trans_b, i1 - i0, j1 - j0, g.K, 1.f, ab, g.lda, bb, g.ldb, 0.f, cb, g.N, bb_);
    else
      sgemm(g.trans_a, g.trans_b, i1 - i0, j1 - j0, g.K, 1.f, ab, g.lda, bb, g.ldb, 0.f, cb, g.N, bb_);
  } else {  // f64 on OpenBLAS, then the bias
    gemm_blas(g.trans_a, g.trans_b, i1 - i0, j1 - j0, g.K, T(1), ab, g.lda, bb, g.ldb, T(0), cb, g.N);
    if (bb_)
      for (int64_t i = i0; i < i1; ++i) {
        T* row = cb + (i - i0) * g.N;
        for (int64_t j = 0; j < j1 - j0; ++j) row[j] += bb_[j];
      }
  }
}

// Boundary t of `parts` in [0, n) moved to the nearest multiple of `tile` within its period: rows of a
// batch of matrices (period M) or the columns of one matrix (period = n).
int64_t tile_boundary(int64_t n, int64_t period, int t, int parts, int64_t tile) {
  int64_t r = n * t / parts, base = r / period * period, i = r - base;
  return base + std::min(period, (i + tile / 2) / tile * tile);
}

// x[0, n) rounded to bf16 or fp16 (pw::round_operand), or bf16 values widened (exactly), in a
// buffer of the caching allocator: these copies are made at every product of every step, and a
// fresh heap buffer of their size would be zeroed and faulted in page by page each time.
class RoundedOperand {
 public:
  RoundedOperand(const float* x, int64_t n, Precision p) : RoundedOperand(n) {
    float* r = data_;
    parallel_for(n, 1 << 16, [&](int64_t i0, int64_t i1) {
      if (p == Precision::bf16)
        for (int64_t i = i0; i < i1; ++i) r[i] = pw::round_bf16(x[i]);
      else
        for (int64_t i = i0; i < i1; ++i) r[i] = pw::round_fp16(x[i]);
    });
  }
  RoundedOperand(const bf16* x, int64_t n) : RoundedOperand(n) {
    float* r = data_;
    parallel_for(n, 1 << 16, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) r[i] = float(x[i]);
    });
  }
  ~RoundedOperand() { device_free(Device::cpu(), data_, bytes_); }
  RoundedOperand(const RoundedOperand&) = delete;
  RoundedOperand& operator=(const RoundedOperand&) = delete;
  const float* data() const { return data_; }

 private:
  explicit RoundedOperand(int64_t n)
      : bytes_(size_t(std::max<int64_t>(n, 1)) * sizeof(float)),
        data_(static_cast<float*>(device_alloc(Device::cpu(), bytes_))) {}
  size_t bytes_;
  float* data_;
};

// Whether the threads of a native bf16 product (sbgemm) split the columns of C rather than its
// rows. sbgemm packs op(b) whole for every piece of rows and op(a) whole for every piece of
// columns (a bf16 op(a) stored as is is read in place: no packing), so a row split has each thread
// round and pack all K x N of op(b), a column split all M x K of op(a): the cut goes across the
// larger operand. The case is a narrowing Linear's dW = g^T x (fc2's: M = d rows, N = 4d, K =
// tokens), where each of two threads packed the whole saved input for half of the rows. The f32
// sgemm reads a row-major op(b) in place for pieces of <= kDirectBMaxM rows (the apps' dW), so
// rows stay its split. Any split gives the same bits (each element's sum does not depend on it).
// (split_gemm cuts columns only of a single matrix with enough of them.)
bool sbgemm_split_columns(const Gemm& g) { return g.M < g.N; }

// Calls block(p, i0, i1, j0, j1) for the pieces of C = op(a) op(b) (batch of P matrices) that
// matmul_forward gives its threads, one piece per thread; same_bits_any_split: the GEMM gives each
// element of C the same bits whatever piece it falls in (else, in deterministic mode, the pieces
// depend on the sizes alone); columns: cut one matrix's columns (into tiles of kColTile) where
// there are enough of them, not its rows.
template <class Block>
void split_gemm(const Gemm& g, bool same_bits_any_split, bool columns, Block block) {
  const int64_t P = g.batch_a ? g.batch_a->numel() : 1, M = g.M, N = g.N;
  const int64_t work = P * M * N * std::max<int64_t>(g.K, 1);
  const int64_t max_pieces = same_bits_any_split || !is_deterministic() ? num_threads() : kFixedPieces;
  const int nt = int(std::clamp<int64_t>(work / kMinWorkPerThread, 1, max_pieces));
  if (P * M >= nt * kRowTile && !(columns && P == 1 && N >= nt * kColTile)) {  // split the B*M rows of C
    parallel_for(nt, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        int64_t r = tile_boundary(P * M, M, int(t), nt, kRowTile);
        const int64_t r1 = tile_boundary(P * M, M, int(t) + 1, nt, kRowTile);
        while (r < r1) {  // the range may span several matrices: one GEMM call per matrix piece
          const int64_t p = r / M, i0 = r % M, i1 = std::min(M, i0 + (r1 - r));
          block(p, i0, i1, 0, N);
          r += i1 - i0;
        }
      }
    });
    return;
  }
  for (int64_t p = 0; p < P; ++p) {  // few rows: split the columns of each matrix
    parallel_for(nt, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        block(p, 0, M, tile_boundary(N, N, int(t), nt, kColTile), tile_boundary(N, N, int(t) + 1, nt, kColTile));
    });
  }
}

// The rows [i0, i1), columns [j0, j1) of one C = op(a) op(b) with a or b bf16 values, as gemm_block
// does with f32 ones: sgemm_small_m_b16 for few rows (an f32 a), else sbgemm_b16 or sbgemm_a16
// (where sbgemm_path holds).
template <class TA, class TB>
void gemm_block_16(float* c, const TA* a, const TB* b, const Gemm& g, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                   const float* bias) {
  if (i1 <= i0 || j1 <= j0) return;
  const TA* ab = a + (g.trans_a ? i0 : i0 * g.lda);
  const TB* bb = b + (g.trans_b ? j0 * g.ldb : j0);
  float* cb = c + i0 * g.N + j0;
  const float* bb_ = bias ? bias + j0 : nullptr;
  if constexpr (std::is_same_v<TA, float>) {
    if (small_m_path(g))
      sgemm_small_m_b16(g.trans_a, g.trans_b, i1 - i0, j1 - j0, g.K, ab, g.lda, bb, g.ldb, cb, g.N, bb_);
    else
      sbgemm_b16(g.trans_a, g.trans_b, i1 - i0, j1 - j0, g.K, 1.f, ab, g.lda, bb, g.ldb, 0.f, cb, g.N, bb_);
  } else {
    sbgemm_a16(g.trans_a, g.trans_b, i1 - i0, j1 - j0, g.K, 1.f, ab, g.lda, bb, g.ldb, 0.f, cb, g.N, bb_);
  }
}

// matmul_forward_b16 and matmul_forward_a16: the operand in bf16 read as it is where the products
// are native (few rows: only a bf16 b, sgemm_small_m_b16), else widened for matmul_forward.
template <class TA, class TB>
void matmul_forward_16(float* c, const TA* a, const TB* b, const Gemm& g, const float* bias) {
  const int64_t P = g.batch_a ? g.batch_a->numel() : 1, M = g.M, N = g.N;
  if (P == 0 || M == 0 || N == 0) return;
  sgemm_kernel();  // reads ATTOGRAD_GEMM (may throw) outside the threads
  const bool small = std::is_same_v<TA, float> && small_m_path(g) && g.operands == Precision::bf16;
  if (!small && !sbgemm_path(g)) {
    // where matmul_forward would not run sbgemm or sgemm_small_m: the bf16 operand widened
    // (exactly) and the f32 entry point
    if constexpr (std::is_same_v<TA, bf16>) {
      const RoundedOperand wide(a, operand_span(g.trans_a, g.M, g.K, g.lda, g.batch_a));
      matmul_forward(c, wide.data(), b, g, bias);
    } else {
      const RoundedOperand wide(b, operand_span(g.trans_b, g.K, g.N, g.ldb, g.batch_b));
      matmul_forward(c, a, wide.data(), g, bias);
    }
    return;
  }
  const bool columns = !small && sbgemm_split_columns(g);
  split_gemm(g, true, columns, [&](int64_t p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    gemm_block_16(c + p * M * N, a + batch_offset(g.batch_a, p), b + batch_offset(g.batch_b, p), g, i0, i1, j0, j1,
                  bias);
  });
}

}  // namespace

int64_t operand_span(bool trans, int64_t rows, int64_t cols, int64_t ld, const Layout* batch) {
  const int64_t r = trans ? cols : rows, c = trans ? rows : cols;  // the dims as stored
  if (r <= 0 || c <= 0) return 0;
  int64_t last = (r - 1) * ld + (c - 1);
  for (int d = 0; batch && d < batch->ndim; ++d) {
    if (batch->shape[d] == 0) return 0;
    last += (batch->shape[d] - 1) * batch->strides[d];
  }
  return last + 1;
}

template <class T>
void matmul_forward(T* c, const T* a, const T* b, const Gemm& g, const T* bias) {
  const int64_t P = g.batch_a ? g.batch_a->numel() : 1, M = g.M, N = g.N;
  if (P == 0 || M == 0 || N == 0) return;
  // autocast bf16 on a CPU with AVX512-BF16: sbgemm rounds while it packs and sums the products
  // two at a time in f32 (gemm_block below); a few rows (M <= kSmallRows: a generated token's)
  // run sgemm_small_m, which rounds as it reads (no copy of the weight per token)
  if (g.operands != Precision::fp32 && !sbgemm_path(g) && !(std::is_same_v<T, float> && small_m_path(g))) {
    // autocast: the same GEMM on copies of a and b rounded to bf16 or fp16. Every product of two
    // such values (8 or 11 significant bits each) is exact in f32, so this sums the very products
    // a tensor core would, in f32; only the order of the additions can differ from a GPU's.
    if constexpr (std::is_same_v<T, float>) {
      const RoundedOperand ra(a, operand_span(g.trans_a, g.M, g.K, g.lda, g.batch_a), g.operands);
      const RoundedOperand rb(b, operand_span(g.trans_b, g.K, g.N, g.ldb, g.batch_b), g.operands);
      Gemm f32 = g;
      f32.operands = Precision::fp32;
      matmul_forward(c, ra.data(), rb.data(), f32, bias);
      return;
    } else {
      assert(!"matmul_forward: 16-bit operands are f32 only (the op front casts nothing else)");
    }
  }
  if constexpr (std::is_same_v<T, float>) sgemm_kernel();  // reads ATTOGRAD_GEMM (may throw) outside the threads
  // C is cut into pieces, one per thread. attograd's sgemm gives every element of C the same
  // bits whatever piece it falls in; OpenBLAS (dgemm for f64, and sgemm under
  // ATTOGRAD_GEMM=openblas) promises nothing of the kind, so in deterministic mode its pieces are
  // fixed by the sizes alone (at most kFixedPieces, shared out over the threads), never by the
  // thread count. Cost: a less even share when kFixedPieces is not a multiple of the threads.
  const bool same_bits_any_split = std::is_same_v<T, float> && sgemm_kernel() != GemmKernel::openblas;
  // rows [i0, i1) and columns [j0, j1) of matrix p of the batch
  const bool columns = std::is_same_v<T, float> && sbgemm_path(g) && sbgemm_split_columns(g);
  split_gemm(g, same_bits_any_split, columns, [&](int64_t p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    gemm_block(c + p * M * N, a + batch_offset(g.batch_a, p), b + batch_offset(g.batch_b, p), g, i0, i1, j0, j1, bias);
  });
}

void matmul_forward_b16(float* c, const float* a, const bf16* b, const Gemm& g, const float* bias) {
  matmul_forward_16(c, a, b, g, bias);
}
void matmul_forward_a16(float* c, const bf16* a, const float* b, const Gemm& g, const float* bias) {
  matmul_forward_16(c, a, b, g, bias);
}

// snippet-begin: matmul-forward-naive
template <class T>
void matmul_forward_naive(T* c, const T* a, const T* b, const Gemm& g) {
  const int64_t P = g.batch_a ? g.batch_a->numel() : 1;
  for (int64_t p = 0; p < P; ++p) {
    const T* ap = a + batch_offset(g.batch_a, p);
    const T* bp = b + batch_offset(g.batch_b, p);
    T* cp = c + p * g.M * g.N;
    for (int64_t i = 0; i < g.M; ++i) {
      for (int64_t j = 0; j < g.N; ++j) {
        T acc = 0;
        for (int64_t k = 0; k < g.K; ++k) {
          T x = g.trans_a ? ap[k * g.lda + i] : ap[i * g.lda + k];
          T w = g.trans_b ? bp[j * g.ldb + k] : bp[k * g.ldb + j];
          if constexpr (std::is_same_v<T, float>)
            x = pw::round_operand(x, g.operands), w = pw::round_operand(w, g.operands);
          acc += x * w;
        }
        cp[i * g.N + j] = acc;
      }
    }
  }
}
// snippet-end: matmul-forward-naive

template <class T>
void matmul_backward(T* da, T* db, const T* dout, const T* a, const T* b, const Gemm& g) {
  // da = dout @ b^T and db = a^T @ dout (math: autograd/ops.h, matmul) are GEMMs of the forward
  // kernel: transposing a stored operand only flips its BLAS flag.
  // When the front folded a's batch into M (b shared by every matrix), db is ONE GEMM whose inner
  // dim runs over all B*M rows: dW = X^T dY, never per-matrix products summed afterwards.
  Layout dense;  // dout's batch strides: contiguous (B, M, N)
  if (g.batch_a) {
    dense.ndim = g.batch_a->ndim;
    int64_t st = g.M * g.N;
    for (int d = dense.ndim - 1; d >= 0; --d) {
      dense.shape[d] = g.batch_a->shape[d];
      dense.strides[d] = st;
      st *= dense.shape[d];
    }
  }
  const Layout* batch_dout = g.batch_a ? &dense : nullptr;
  // snippet-begin: matmul-backward
  if (da) {
    Gemm gd{g.M, g.K, g.N, false, !g.trans_b, g.N, g.ldb, batch_dout, g.batch_b, g.operands};
    matmul_forward(da, dout, b, gd);
  }
  if (db) {
    Gemm gd{g.K, g.N, g.M, !g.trans_a, false, g.lda, g.N, g.batch_a, batch_dout, g.operands};
    matmul_forward(db, a, dout, gd);
  }
  // snippet-end: matmul-backward
}

// The kernels of core/kernels/matmul.h for the dtypes listed there.
AG_INSTANTIATE_MATMUL_KERNELS

}  // namespace ag::cpu
