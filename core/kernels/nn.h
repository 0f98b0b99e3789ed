// Kernels of the normalisation & loss ops: softmax, log_softmax, layer_norm, embedding,
// cross_entropy, dropout, and of rope (core/cpu/nn.cpp, cuda/nn.cu). Math: autograd/ops.h, under
// each op's name. Every buffer is contiguous. Backward kernels add into their gradient buffers
// (+=); the front hands them zeroed ones (except layer_norm's dx and rope, written with =, see
// below).
//
// Shapes, the one legend of both backends (R = rows, i.e. the product of the leading dims):
//   softmax, log_softmax   x, y, dy, dx (outer, C, inner): normalised over C, the middle dim
//   layer_norm             x, y, dy, dx (R, N); mean, rstd (R); w, b, dw, db (N) or null
//   embedding              w, dw (V, D); idx (R), each in [0, V); y, dy (R, D)
//   cross_entropy          logits, logp, dlogits (N, C); target (N); loss (N);
//                          dloss (N) read with stride dloss_stride (0: one scalar for every row)
//   dropout                x, y, dy, dx (n)
//   rope                   x, y (R, T, D), D even: R slices of T positions
//   *_naive                the shapes of the kernel they are the reference of
//
// No include guard: core/kernels.h reads this file inside namespace ag::cpu (core/cpu/nn.cpp) and
// inside ag::cuda (cuda/nn.cu), so each kernel is declared once for both backends. The GPU's have
// the same contracts (+= except layer_norm's dx) and use no atomics: each output is summed by one
// thread or one block in a fixed order; dropout's mask is the CPU's, bit for bit. The *_naive
// references are CPU only.
#ifndef AG_KERNELS_CPU
#include "core/kernels.h"  // included on its own: the index reads this file for each backend
#else

// ---- softmax / log_softmax over the middle dim of [outer, C, inner] --------------------------
template <class T> void softmax_forward(T* y, const T* x, int64_t outer, int64_t C, int64_t inner);
template <class T> void softmax_backward(T* dx, const T* dy, const T* y, int64_t outer, int64_t C, int64_t inner);
template <class T> void log_softmax_forward(T* y, const T* x, int64_t outer, int64_t C, int64_t inner);
template <class T> void log_softmax_backward(T* dx, const T* dy, const T* y, int64_t outer, int64_t C, int64_t inner);

// ---- layer_norm over rows of N; w, b may be null (as 1 and 0), and so may dx, dw, db ----------
template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t R, int64_t N, double eps);
// dw, db are added into (+=), but unlike the other backward kernels dx is WRITTEN (=): the op
// front allocates it fresh, and zero-filling it only to add into it would cost a full write and
// read of dx, about a fifth of the memory traffic of the whole backward.
template <class T>
void layer_norm_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                         int64_t R, int64_t N);

// ---- embedding: a gather of rows, and its scatter-add (indices already checked in [0, V)) ------
template <class T> void embedding_forward(T* y, const T* w, const int64_t* idx, int64_t R, int64_t D);
template <class T> void embedding_backward(T* dw, const T* dy, const int64_t* idx, int64_t R, int64_t V, int64_t D);

// ---- cross_entropy: fused log-softmax + NLL with label smoothing s, one loss per row ----------
// loss[n] = 0 and logp's row is still written for rows whose target == ignore_index.
template <class T>
void cross_entropy_forward(T* loss, T* logp, const T* logits, const int64_t* target, int64_t N, int64_t C,
                           int64_t ignore_index, double smoothing);
// dlogits[n, :] += (exp(logp[n, :]) - q_n) * dloss[n * dloss_stride] * scale  (0 for ignored rows)
template <class T>
void cross_entropy_backward(T* dlogits, const T* dloss, int64_t dloss_stride, const T* logp, const int64_t* target,
                            int64_t N, int64_t C, int64_t ignore_index, double smoothing, double scale);

// ---- dropout: the mask and factor of core/kernels/dropout_mask.h, drawn from (seed, offset) ---
template <class T> void dropout_forward(T* y, const T* x, int64_t n, double p, uint64_t seed, uint64_t offset);
template <class T> void dropout_backward(T* dx, const T* dy, int64_t n, double p, uint64_t seed, uint64_t offset);

// ---- rope: rotary position embedding over rows of D (autograd/ops.h) --------------------------
// Row t of each of the R slices stands at position offset + t, and pair k (k < D/2) of it,
// (x[k], x[k + D/2]) or with interleaved (x[2k], x[2k+1]), turns by the angle
// a = rope_angle(offset + t, k, D, base) (core/kernels.h), or by -a with inverse (rope's
// backward). y is written (=), not added into; y == x (in place) is allowed.
template <class T>
void rope_forward(T* y, const T* x, int64_t R, int64_t Tn, int64_t D, int64_t offset, double base, bool interleaved,
                  bool inverse);

// Instantiated for f32 and f64 by both backends: core/cpu/nn.cpp and cuda/nn.cu end with
// AG_INSTANTIATE_NN_KERNELS.
#define AG_NN_KERNELS(T)                                                                                       \
  AG_INSTANTIATE(softmax_forward<T>) AG_INSTANTIATE(softmax_backward<T>) AG_INSTANTIATE(log_softmax_forward<T>) \
  AG_INSTANTIATE(log_softmax_backward<T>) AG_INSTANTIATE(layer_norm_forward<T>)                                \
  AG_INSTANTIATE(layer_norm_backward<T>) AG_INSTANTIATE(embedding_forward<T>) AG_INSTANTIATE(embedding_backward<T>) \
  AG_INSTANTIATE(cross_entropy_forward<T>) AG_INSTANTIATE(cross_entropy_backward<T>)                           \
  AG_INSTANTIATE(dropout_forward<T>) AG_INSTANTIATE(dropout_backward<T>) AG_INSTANTIATE(rope_forward<T>)
#define AG_INSTANTIATE_NN_KERNELS AG_NN_KERNELS(float) AG_NN_KERNELS(double)

#if AG_KERNELS_CPU
// ---- CPU only: the reference loops the fast kernels are tested against (single-threaded, one
// element at a time; layer_norm_backward_naive adds into dx too). core/cpu/nn.cpp instantiates
// them for f32 and f64.
template <class T> void softmax_forward_naive(T* y, const T* x, int64_t outer, int64_t C, int64_t inner);
template <class T> void softmax_backward_naive(T* dx, const T* dy, const T* y, int64_t outer, int64_t C, int64_t inner);
template <class T>
void layer_norm_forward_naive(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t R, int64_t N,
                              double eps);
template <class T>
void layer_norm_backward_naive(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                               int64_t R, int64_t N);
#endif

#endif  // AG_KERNELS_CPU
