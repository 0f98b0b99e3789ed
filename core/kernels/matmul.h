// Matmul kernels: C = A B over the last two dims, batched (math in autograd/ops.h, matmul).
//
// Shapes, the one legend of both backends (core/cpu/matmul.cpp, cuda/matmul.cu):
//   a (B, M, K), b (B, K, N), c and dout (B, M, N), da (B, M, K), db (B, K, N), bias (N)
//   B = the product of the batch dims (1 without any); a and b are read through their Gemm
//   description (trans flag, leading dim, batch strides), so they may be transposed or broadcast.
//
// Every operand is described as BLAS reads it (struct Gemm, core/kernels.h), so transposed views
// need no copy: element (i, k) of a (M, K) operand x is at x[i * ld + k] when !trans, at
// x[k * ld + i] when trans (x holds the transpose, a (K, M) row-major matrix). The batch is a Layout
// over the batch dims, shared by all operands (same shape) with each operand's own strides (0 where
// it is broadcast). The output is contiguous: (batch, M, N).
//
// No include guard: core/kernels.h reads this file inside namespace ag::cpu (core/cpu/matmul.cpp,
// core/cpu/gemm.cpp) and inside ag::cuda (cuda/matmul.cu), so each kernel is declared once for both
// backends. On the GPU: cuBLAS on the device's stream, with the same conventions (row-major
// operands, lda meaning, trans flags, batch Layouts, da/db written, not added); the batch runs as
// one strided-batched GEMM per run of uniformly strided batch dims (broadcast stride 0 included);
// f32 is cublasSgemm, f64 cublasDgemm. attograd's own sgemm (below) is CPU only.
#ifndef AG_KERNELS_CPU
#include "core/kernels.h"  // included on its own: the index reads this file for each backend
#else

using ag::Gemm;  // so that cpu::Gemm and cuda::Gemm name it too

// c (batch, M, N) = a (batch, M, K) @ b (batch, K, N). CPU: through single-threaded GEMM calls
// (sgemm below for f32, cblas_dgemm for f64); the kernel splits the batch, or the rows of one GEMM,
// over attograd's threads.
// With `bias` (N values) every row of every C gets it added: y = x W^T + b of a Linear in one pass.
template <class T> void matmul_forward(T* c, const T* a, const T* b, const Gemm& g, const T* bias = nullptr);
// The same product as a triple loop: the algorithmic reference the GEMM path is tested against.
template <class T> void matmul_forward_naive(T* c, const T* a, const T* b, const Gemm& g);
// da (batch, M, K) = dout @ b^T,  db (batch, K, N) = a^T @ dout;  dout (batch, M, N) contiguous.
// Either of da, db may be null (not needed). Unlike the other backward kernels these WRITE the
// gradients (GEMM beta = 0): the op front allocates them fresh, and zero-filling a buffer only to
// add into it would cost a noticeable fraction of the GEMM itself.
template <class T> void matmul_backward(T* da, T* db, const T* dout, const T* a, const T* b, const Gemm& g);

// Instantiated for f32 and f64 by both backends: core/cpu/matmul.cpp and cuda/matmul.cu end with
// AG_INSTANTIATE_MATMUL_KERNELS.
#define AG_MATMUL_KERNELS(T) \
  AG_INSTANTIATE(matmul_forward<T>) AG_INSTANTIATE(matmul_forward_naive<T>) AG_INSTANTIATE(matmul_backward<T>)
#define AG_INSTANTIATE_MATMUL_KERNELS AG_MATMUL_KERNELS(float) AG_MATMUL_KERNELS(double)

#if AG_KERNELS_CPU
// ---- CPU only ----------------------------------------------------------------------------------
// matmul_forward<float> with b holding bf16 values (a 16-bit tensor: what linear keeps of its input
// under bf16 autocast), for bf16 operands (g.operands): where matmul_forward would run sbgemm, the
// same pieces on sbgemm_b16, which pairs b as it is (no widened copy); elsewhere b is widened
// (exactly) and matmul_forward runs; a product of few rows (M <= kSmallRows) runs
// sgemm_small_m_b16. The same bits as matmul_forward on b widened, either way; `bias` as there.
void matmul_forward_b16(float* c, const float* a, const bf16* b, const Gemm& g, const float* bias = nullptr);
// The same with a holding bf16 values instead (linear's input under bf16 autocast, rounded once
// for backward: its forward product reads that copy), on sbgemm_a16; elsewhere a is widened. The
// same bits as matmul_forward on a widened.
void matmul_forward_a16(float* c, const bf16* a, const float* b, const Gemm& g, const float* bias = nullptr);

// How many elements from operand x's first to its last one (batch included): a (M, K) operand read
// as (rows, cols) = (M, K), or (K, M) when trans, with leading dim ld, over a batch of `batch`'s
// strides (null: one matrix). What a rounded copy of the operand must cover; 0 when it is empty.
int64_t operand_span(bool trans, int64_t rows, int64_t cols, int64_t ld, const Layout* batch);

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

// sgemm's contract with both operands rounded to bf16 (as autocast rounds them) and the products
// summed in f32 by AVX512-BF16's VDPBF16PS, two at a time (faster than the f32 kernel on large
// products: docs/benchmarks.md, "bf16 on the CPU").
// Against sgemm on rounded copies it differs by f32 rounding (another order of the same sums),
// and bf16 subnormals count as zero. ag::Error where the CPU has no avx512_bf16.
void sbgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
            const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias = nullptr);
// The same with b holding bf16 values already (a 16-bit tensor): paired as it is packed, not
// rounded. The same bits as sbgemm on b widened to f32.
void sbgemm_b16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                const bf16* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias = nullptr);
// The same with a holding bf16 values already: its rows read in place where a is stored as is and
// K, the K blocks and lda are even (else paired as it is packed). The same bits as sbgemm on a
// widened to f32.
void sbgemm_a16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias = nullptr);
bool sbgemm_supported();            // whether this CPU has AVX512-BF16
// Whether bf16 autocast's products run sbgemm instead of the emulation (rounded copies, f32 GEMM):
// by default wherever the CPU has AVX512-BF16, while the sgemm kernel is avx512 (ATTOGRAD_GEMM=avx2,
// portable or openblas keep the emulation). set_sbgemm_native(false) keeps the emulation too: the
// same products, summed in another order (a comparison, bench_train --bf16-gemm).
bool sbgemm_native();
void set_sbgemm_native(bool on);    // ag::Error for true where the CPU has no AVX512-BF16

// c (M, N; ldc) = op(a) op(b) for a few rows (M <= kSmallRows), reading both operands where they
// are: packing B for one row (a token's activations against a weight, in generation) costs ten
// times the product itself. op(b) stored transposed (a Linear's weight, (N, K)): one dot product
// along K per element; stored as is: rows of B scaled and added. matmul picks it by the rows of the
// whole matrix (never of a thread's piece), so a result never depends on the thread count.
// With `operands` bf16 or fp16 (autocast) both are read rounded to that format as they are read
// (pw::round_operand), without making copies of a whole weight for one token's row: the numbers
// of the same loops on rounded copies, except for bf16 with op(b) stored transposed where bf16
// products are native (sbgemm_native()): there the dot products run on VDPBF16PS, two products per
// lane and step, the lanes summed at the end (the same products in another order: within f32
// rounding of those loops, bf16 subnormals counted as zero as in sbgemm).
inline constexpr int64_t kSmallRows = 4;
void sgemm_small_m(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float* c, int64_t ldc, const float* bias = nullptr,
                   Precision operands = Precision::fp32);
// sgemm_small_m with bf16 operands and b holding bf16 values already (a weight kept in bf16 by
// autocast, autograd/autocast.h): a is rounded as it is read, b read as it is (half the bytes of
// an f32 weight). The same bits as sgemm_small_m(..., Precision::bf16) on b widened to f32.
void sgemm_small_m_b16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const bf16* b,
                       int64_t ldb, float* c, int64_t ldc, const float* bias = nullptr);
#endif

#endif  // AG_KERNELS_CPU
