// GPU optimizer kernels, multi-tensor, the twins of core/cpu/optim.cpp, whose arithmetic they
// follow op for op. Shapes and contracts: core/kernels/optim.h. Rules: optim/sgd.h, optim/adam.h,
// optim/clip.h.
//
// Launches. A list of tensors is cut into chunks of kChunk elements, one block per chunk; a launch
// takes a Table, passed by value as the kernel's parameter (no host-to-device copy, no staging
// buffer, nothing to wait for): up to kTableTensors<Item> tensors and kTableBlocks chunks, each
// block finding its tensor and chunk in the table. A Table stays under 4 KB, the parameter limit of
// every CUDA version. So AdamW over the ~50 tensors of a toy model is 1 launch, not 50, and over
// a GPT of 85M parameters 6 (kTableBlocks x kChunk = 16.8M elements per launch).
//
// grad_norm_partial: every chunk's partial (|x|^p summed, or max |x|) goes to a scratch array in
// chunk order (a fixed tree in each block, no atomics), then one block per tensor combines its
// chunks' partials in order into out[k]: the same bits every run, written to device memory, so the
// caller reads the partials of all its tensors back in one copy.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/kernels.h"
#include "cuda/common.cuh"

namespace ag::cuda {

namespace {

constexpr int64_t kChunk = 65536;
constexpr int kTableBlocks = 256;
constexpr size_t kTableBytes = 4000;  // under the 4 KB of kernel parameters
// tensors per table: what the bytes left after the block map hold (at most 255: uint8 indices)
template <class Item>
constexpr int kTableTensors =
    int(std::min<size_t>(255, (kTableBytes - 16 - kTableBlocks * (sizeof(int32_t) + sizeof(uint8_t))) / sizeof(Item)));

template <class Item>
struct Table {
  Item items[kTableTensors<Item>];
  int32_t chunk[kTableBlocks];   // block b works on chunk chunk[b] of tensor tensor[b]
  uint8_t tensor[kTableBlocks];
  int64_t first_block;           // the list-wide index of block 0 (grad_norm's partials)
};

// launch(table, blocks) for each table that covers items[0 .. count): the chunks in order, tensor
// by tensor (a tensor that does not fit goes on in the next table). Empty tensors get no block.
template <class Item, class Launch>
void for_each_table(const Item* items, int64_t count, Launch&& launch) {
  static_assert(sizeof(Table<Item>) <= kTableBytes, "a Table must fit in the kernel parameters");
  Table<Item> t;
  int nt = 0, nb = 0;
  int64_t last = -1, done = 0;  // the item in slot nt - 1; blocks launched so far
  auto flush = [&] {
    if (nb > 0) launch(t, nb);
    t.first_block = done += nb;
    nt = nb = 0;
    last = -1;
  };
  t.first_block = 0;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t nchunk = (items[k].n + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < nchunk; ++c) {
      if (last != k) {
        if (nt == kTableTensors<Item>) flush();
        t.items[nt++] = items[k];
        last = k;
      }
      t.tensor[nb] = uint8_t(nt - 1);
      t.chunk[nb] = int32_t(c);
      if (++nb == kTableBlocks) flush();
    }
  }
  flush();
}

// this block's range [b, e) of its tensor
template <class Item>
__device__ inline void block_range(const Table<Item>& t, const Item*& item, int64_t& b, int64_t& e) {
  item = &t.items[t.tensor[blockIdx.x]];
  b = int64_t(t.chunk[blockIdx.x]) * kChunk;
  e = min(item->n, b + kChunk);
}

// ---- SGD: the list items as they come (core/kernels/optim.h) ----
template <class T>
__global__ void sgd_kernel(const __grid_constant__ Table<SgdTensor<T>> t, T neg_lr, T mu, T damp, T wd,
                           bool use_momentum, bool nesterov) {
  const SgdTensor<T>* it;
  int64_t b, e;
  block_range(t, it, b, e);
  T* param = it->param;
  T* buf = it->buf;
  const T* grad = it->grad;
  const bool first = it->first;
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) {
    T g = grad[i] + wd * param[i];
    if (use_momentum) {
      const T m = first ? g : mu * buf[i] + damp * g;
      buf[i] = m;
      g = nesterov ? g + mu * m : m;
    }
    param[i] = param[i] + neg_lr * g;
  }
}

// ---- Adam / AdamW: each tensor carries its bias corrections (its own step count) ----
template <class T>
struct AdamItem {
  T* param;
  T* exp_avg;
  T* exp_avg_sq;
  const T* grad;
  int64_t n;
  T bc2;            // sqrt(1 - beta2^t)
  T neg_step_size;  // -lr / (1 - beta1^t)
};

template <class T>
__global__ void adam_kernel(const __grid_constant__ Table<AdamItem<T>> t, bool decoupled, T decay, T l2, T b1,
                            T one_minus_b1, T b2, T one_minus_b2, T e_ps) {
  const AdamItem<T>* it;
  int64_t b, e;
  block_range(t, it, b, e);
  T* param = it->param;
  T* exp_avg = it->exp_avg;
  T* exp_avg_sq = it->exp_avg_sq;
  const T* grad = it->grad;
  const T bc2 = it->bc2, neg_step_size = it->neg_step_size;
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) {
    T p = param[i];
    if (decoupled) p = p * decay;
    const T g = grad[i] + l2 * p;
    const T m = b1 * exp_avg[i] + one_minus_b1 * g;
    const T v = b2 * exp_avg_sq[i] + one_minus_b2 * g * g;
    const T denom = sqrt(v) / bc2 + e_ps;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p + neg_step_size * m / denom;
  }
}

// ---- norms ----
// |x|^p summed (NaN propagates through the sum), or max |x| with NaN winning
struct NormSum {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct NormMax {
  __device__ double operator()(double a, double b) const { return (a != a || a > b) ? a : b; }
};

template <class T>
__device__ inline double norm_term(T x, double p, bool inf) {
  const double a = fabs(double(x));
  return inf || p == 1 ? a : p == 2 ? a * a : pow(a, p);
}

// partial[first_block + b] = this block's chunk reduced
template <class T, class Op>
__global__ void norm_chunks_kernel(const __grid_constant__ Table<TensorSpan<T>> t, double* partial, double p,
                                   bool inf, Op op) {
  __shared__ double sh[kThreads];
  const TensorSpan<T>* it;
  int64_t b, e;
  block_range(t, it, b, e);
  double acc = 0;
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) acc = op(acc, norm_term(it->data[i], p, inf));
  acc = block_reduce(acc, op, sh);
  if (threadIdx.x == 0) partial[t.first_block + blockIdx.x] = acc;
}

// out[k] for the tensors of one table of ranges: block j combines partial[first[j] .. first[j] + count[j])
constexpr int kFinalTensors = 240;
struct FinalTable {
  int64_t first[kFinalTensors];
  int32_t count[kFinalTensors];
  int32_t out[kFinalTensors];
};
static_assert(sizeof(FinalTable) <= kTableBytes, "a FinalTable must fit in the kernel parameters");

template <class Op>
__global__ void norm_final_kernel(const __grid_constant__ FinalTable t, double* out, const double* partial, Op op) {
  __shared__ double sh[kThreads];
  const int j = blockIdx.x;
  double acc = 0;
  for (int64_t c = threadIdx.x; c < t.count[j]; c += blockDim.x) acc = op(acc, partial[t.first[j] + c]);
  acc = block_reduce(acc, op, sh);
  if (threadIdx.x == 0) out[t.out[j]] = acc;
}

template <class T, class Op>
void grad_norm_lists(double* out, const TensorSpan<T>* xs, int64_t count, double p, bool inf, Op op) {
  int64_t nblocks = 0;
  for (int64_t k = 0; k < count; ++k) nblocks += (xs[k].n + kChunk - 1) / kChunk;
  Scratch partial(size_t(std::max<int64_t>(nblocks, 1)) * sizeof(double));
  for_each_table(xs, count, [&](const Table<TensorSpan<T>>& t, int nb) {
    norm_chunks_kernel<T><<<unsigned(nb), kThreads, 0, stream()>>>(t, partial.as<double>(), p, inf, op);
    kernelCheck();
  });
  // tensor k's chunks are partial[first_k .. first_k + nchunk_k), in the order for_each_table walked them
  FinalTable f;
  int nf = 0;
  auto flush = [&] {
    if (nf == 0) return;
    norm_final_kernel<<<unsigned(nf), kThreads, 0, stream()>>>(f, out, partial.as<double>(), op);
    kernelCheck();
    nf = 0;
  };
  int64_t first = 0;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t nchunk = (xs[k].n + kChunk - 1) / kChunk;
    f.first[nf] = first;
    f.count[nf] = int32_t(nchunk);  // 0 for an empty tensor: out[k] = 0
    f.out[nf] = int32_t(k);
    first += nchunk;
    if (++nf == kFinalTensors) flush();
  }
  flush();
}

// ---- scale and clamp ----
template <class T>
__global__ void scale_kernel(const __grid_constant__ Table<TensorSpan<T>> t, T f) {
  const TensorSpan<T>* it;
  int64_t b, e;
  block_range(t, it, b, e);
  T* x = it->data;
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) x[i] = x[i] * f;
}

template <class T>
__global__ void clip_kernel(const __grid_constant__ Table<TensorSpan<T>> t, T lo, T hi) {
  const TensorSpan<T>* it;
  int64_t b, e;
  block_range(t, it, b, e);
  T* x = it->data;
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) {
    const T v = x[i];
    x[i] = v != v ? v : (v < lo ? lo : (v > hi ? hi : v));
  }
}

}  // namespace

// SGD, torch.optim.SGD: the rule of optim/sgd.h.
template <class T>
void sgd_update(const SgdTensor<T>* ts, int64_t count, double lr, double momentum, double dampening,
                double weight_decay, bool nesterov) {
  for_each_table(ts, count, [&](const Table<SgdTensor<T>>& t, int nb) {
    sgd_kernel<T><<<unsigned(nb), kThreads, 0, stream()>>>(t, T(-lr), T(momentum), T(1 - dampening),
                                                          T(weight_decay), momentum != 0, nesterov);
    kernelCheck();
  });
}

// Adam / AdamW, torch.optim.Adam(W): the rule of optim/adam.h, in cpu::adam_update's op order; the
// scalars are computed in double on the host and cast once, as there.
template <class T>
void adam_update(const AdamTensor<T>* ts, int64_t count, double lr, double beta1, double beta2, double eps,
                 double weight_decay, bool decoupled) {
  std::vector<AdamItem<T>> items(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    const AdamTensor<T>& a = ts[k];
    const double bias_correction1 = 1 - std::pow(beta1, double(a.step));
    const double bias_correction2_sqrt = std::sqrt(1 - std::pow(beta2, double(a.step)));
    items[size_t(k)] = {a.param, a.exp_avg, a.exp_avg_sq, a.grad, a.n, T(bias_correction2_sqrt),
                        T(-lr / bias_correction1)};
  }
  for_each_table(items.data(), count, [&](const Table<AdamItem<T>>& t, int nb) {
    adam_kernel<T><<<unsigned(nb), kThreads, 0, stream()>>>(t, decoupled, T(1 - lr * weight_decay),
                                                           T(decoupled ? 0 : weight_decay), T(beta1), T(1 - beta1),
                                                           T(beta2), T(1 - beta2), T(eps));
    kernelCheck();
  });
}

template <class T>
void grad_norm_partial(double* out, const TensorSpan<T>* xs, int64_t count, double p) {
  if (count == 0) return;
  if (std::isinf(p))
    grad_norm_lists(out, xs, count, p, true, NormMax{});
  else
    grad_norm_lists(out, xs, count, p, false, NormSum{});
}

template <class T>
void scale_inplace(const TensorSpan<T>* xs, int64_t count, double factor) {
  for_each_table(xs, count, [&](const Table<TensorSpan<T>>& t, int nb) {
    scale_kernel<T><<<unsigned(nb), kThreads, 0, stream()>>>(t, T(factor));
    kernelCheck();
  });
}

template <class T>
void clip_value(const TensorSpan<T>* xs, int64_t count, double clip) {
  for_each_table(xs, count, [&](const Table<TensorSpan<T>>& t, int nb) {
    clip_kernel<T><<<unsigned(nb), kThreads, 0, stream()>>>(t, T(-clip), T(clip));
    kernelCheck();
  });
}

// The kernels of core/kernels/optim.h for the dtypes listed there.
AG_INSTANTIATE_OPTIM_KERNELS

}  // namespace ag::cuda
