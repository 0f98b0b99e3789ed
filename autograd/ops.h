#pragma once
// Every differentiable op of attograd: the table of contents. Each entry gives the forward
// formula, the derivative its backward uses (as a vector-Jacobian product: g is the gradient of
// the output, dx the gradient of input x), the shapes, and what it saves for backward.
// The front of each op (checks, kernel dispatch, tape record) is in autograd/ops/<family>.cpp,
// its CPU kernels in core/cpu/<family>.cpp.
//
// Conventions: binary ops broadcast NumPy-style: both inputs are expand()ed to the common shape,
// so the reduction of a broadcast gradient lives in exactly one place, expand's backward (sum_to).
// Ops take f32 or f64 unless they say otherwise; both inputs of a binary op share one dtype.
#include <vector>

#include "autograd/tape.h"
#include "core/random.h"
#include "core/tensor.h"

namespace ag {

// ============================ views (autograd/ops/view.cpp) ==================================
// Views share storage with their input; their backward maps g back to the input's geometry.
//
// reshape(x, shape)       y = x with a new shape (one dim may be -1)      dx = g.reshape(x.shape)
//   a view when strides allow, else a copy. view() is the view-only form.
// permute(x, dims)        y[i_p0, i_p1, ...] = x[i_0, i_1, ...]            dx = g.permute(inverse)
// transpose(x, a, b)      permute swapping dims a and b                    dx = g.transpose(a, b)
// slice(x, d, s, e, k)    y = x[..., s:e:k, ...] along dim d               dx = 0 except dx[slice] = g
// narrow(x, d, s, n)      slice(x, d, s, s+n)                              (as slice)
// select(x, d, i)         y = x[..., i, ...], dim d removed                dx = 0 except dx[i] = g
// unsqueeze / squeeze     insert / remove a size-1 dim                     dx = g.reshape(x.shape)
// expand(x, shape)        broadcast size-1 (or missing leading) dims      dx = sum_to(g, x.shape)
//   (stride 0, no copy). broadcast_to is the same op.
// contiguous(x), clone(x) a dense copy (contiguous: x itself when already dense)   dx = g
// to(x, device|dtype)     a copy on another device or in another dtype     dx = g.to(x's)
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor permute(const Tensor& x, const Shape& dims);
Tensor transpose(const Tensor& x, int dim0, int dim1);
Tensor slice(const Tensor& x, int dim, int64_t start, int64_t end, int64_t step = 1);
Tensor narrow(const Tensor& x, int dim, int64_t start, int64_t length);
Tensor select(const Tensor& x, int dim, int64_t index);
Tensor unsqueeze(const Tensor& x, int dim);
Tensor squeeze(const Tensor& x, int dim);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor broadcast_to(const Tensor& x, const Shape& shape);
// index_select(x, d, idx)  y = x gathered at i64 indices idx (1-D) along dim d (a copy)
//   dx = 0, then dx[idx[j]] += g[j] along d (repeated indices accumulate)
Tensor index_select(const Tensor& x, int dim, const Tensor& index);
// sum_to(x, shape)        sums x over the dims broadcasting added, down to `shape`
//   dx = expand(g, x.shape). The one place where broadcast gradients are reduced.
Tensor sum_to(const Tensor& x, const Shape& shape);

// ====================== elementwise (autograd/ops/elementwise.cpp) ============================
// add(a, b)    y = a + b          da = g,            db = g
// sub(a, b)    y = a - b          da = g,            db = -g
// mul(a, b)    y = a * b          da = g * b,        db = g * a          saves a, b
// div(a, b)    y = a / b          da = g / b,        db = -g * a / b^2   saves a, b
// add/sub/mul also take i64 (not differentiable). Scalar forms take a double.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor sub(double a, const Tensor& b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor div(double a, const Tensor& b);
// neg(x)       y = -x             dx = -g
Tensor neg(const Tensor& x);
// pow(x, p)    y = x^p            dx = g * p * x^(p-1)                   saves x
// pow(x, t)    y = x^t            dx = g * t * x^(t-1),  dt = g * y * ln(x)   (0 where x == 0)
Tensor pow(const Tensor& x, double p);
Tensor pow(const Tensor& x, const Tensor& t);
// exp(x)       y = e^x            dx = g * y                              saves y
// log(x)       y = ln x           dx = g / x                              saves x
// sqrt(x)      y = x^(1/2)        dx = g / (2 y)                          saves y
// rsqrt(x)     y = x^(-1/2)       dx = -g * y^3 / 2                       saves y
// tanh(x)      y = tanh x         dx = g * (1 - y^2)                      saves y
// sigmoid(x)   y = 1/(1+e^-x)     dx = g * y * (1 - y)                    saves y
// relu(x)      y = max(x, 0)      dx = g * [x > 0]                        saves x
// abs(x)       y = |x|            dx = g * sign(x)  (0 at 0)              saves x
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor abs(const Tensor& x);
// gelu(x)             y = x * Phi(x) = x/2 * (1 + erf(x/sqrt 2))
//                     dx = g * (Phi(x) + x * phi(x)),  phi(x) = e^(-x^2/2)/sqrt(2 pi)   saves x
// gelu(x, "tanh")     y = x/2 * (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//                     dx = g * (1/2 (1 + t) + x/2 (1 - t^2) sqrt(2/pi) (1 + 3*0.044715 x^2)), t = tanh u
Tensor gelu(const Tensor& x, const char* approximate = "none");
// silu(x)      y = x * s,  s = sigmoid(x)     dx = g * s * (1 + x (1 - s))   saves x
Tensor silu(const Tensor& x);
// clamp(x, lo, hi)    y = min(max(x, lo), hi)   dx = g * [lo <= x <= hi]      saves x
Tensor clamp(const Tensor& x, double lo, double hi);
// maximum(a, b)   y = max(a, b)   da = g * ([a > b] + [a == b]/2),  db = g * ([b > a] + [a == b]/2)
// minimum(a, b)   y = min(a, b)   (mirror image; ties split the gradient as PyTorch does)
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
// Comparisons (not differentiable): b8 tensors of the broadcast shape.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
// where(c, a, b)  y = c ? a : b  (c is b8; all three broadcast)   da = where(c, g, 0), db = where(c, 0, g)
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// masked_fill(x, m, v)  y = m ? v : x  (m is b8, broadcast to x)  dx = where(m, 0, g)
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// ======================== reductions (autograd/ops/reduce.cpp) ================================
// Over `dims` (empty = all dims); keepdim keeps them as size 1.
// sum(x)        y = sum_i x_i                  dx = expand(g, x.shape)      (b8 sums to an i64 count)
// mean(x)       y = sum_i x_i / N              dx = expand(g, x.shape) / N
// max(x)        y = max_i x_i                  dx = g / k at the k positions equal to the max  saves x, y
//               (like torch.amax: ties share the gradient)
// var(x, c)     y = sum_i (x_i - mean)^2 / (N - c)    dx = g * 2 (x - mean) / (N - c)   saves x - mean
//               c = 1 (default) is the unbiased estimate, as in PyTorch
// argmax(x, d)  index of the first maximum along d (i64, not differentiable)
Tensor sum(const Tensor& x, const std::vector<int>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int>& dims = {}, bool keepdim = false);
Tensor max(const Tensor& x, const std::vector<int>& dims = {}, bool keepdim = false);
Tensor var(const Tensor& x, const std::vector<int>& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor argmax(const Tensor& x, int dim, bool keepdim = false);

// =========================== matmul (autograd/ops/matmul.cpp) =================================
// matmul(a, b)  C = A B  over the last two dims; batch dims broadcast; 1-D inputs are a row
//               (a) or column (b) vector, as in torch.matmul.
//   dA = g B^T,   dB = A^T g     (then sum_to over broadcast batch dims)      saves a, b
//   [M,K] @ [K,N] -> [M,N]. Runs attograd's sgemm (f32, core/cpu/gemm.cpp) or cblas_dgemm (f64);
//   transposed views go as transpose flags, not copies.
Tensor matmul(const Tensor& a, const Tensor& b);
// linear(x, w, b)  y = x W^T + b   x: [..., in], w: [out, in], b: [out] or undefined -> [..., out]
//   (torch.nn.functional.linear). One GEMM with the bias added in its epilogue, no second pass.
//   dX = g W,   dW = g^T X  (summed over every row of x),   db = sum over rows of g      saves x, w
//   dW is computed in W's own (out, in) layout: no transposed gradient to copy back.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

// ====================== normalisation & losses (autograd/ops/nn.cpp) ==========================
// softmax(x, d)      y_i = e^(x_i - m) / sum_j e^(x_j - m),  m = max_j x_j (for stability)
//                    dx_i = y_i (g_i - sum_j g_j y_j)                              saves y
//                    a row that is all -inf gives NaN, as in PyTorch
// log_softmax(x, d)  y_i = x_i - m - log sum_j e^(x_j - m)
//                    dx_i = g_i - e^(y_i) sum_j g_j                                saves y
Tensor softmax(const Tensor& x, int dim = -1);
Tensor log_softmax(const Tensor& x, int dim = -1);
// layer_norm(x, normalized_shape, w, b, eps)   over the last k = normalized_shape.size() dims,
//   N = their numel;  mu = mean(x), rstd = 1/sqrt(var_biased(x) + eps), xhat = (x - mu) rstd
//   y = xhat * w + b          (w, b of shape normalized_shape; either may be undefined)
//   dxhat = g * w;  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
//   dw = sum over rows of g * xhat;  db = sum over rows of g              saves x, mean, rstd
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// embedding(w, idx)  y[..., :] = w[idx[...], :]     w: [V, D], idx: i64 any shape -> [..., D]
//   dw[v, :] = sum over positions p with idx[p] == v of g[p, :]   (scatter-add)    saves idx
Tensor embedding(const Tensor& weight, const Tensor& indices);
// cross_entropy(logits, target)   logits [N, C], target i64 [N] in [0, C) or == ignore_index.
//   p = softmax(logits); q = (1 - s) onehot(target) + s / C   (s = label_smoothing)
//   loss_n = -sum_c q_c log p_c;  reduction "mean" (over non-ignored rows), "sum" or "none"
//   dlogits_n = (p_n - q_n) * g_n   (0 for ignored rows; divided by the count for "mean")
//   Fused: log-softmax and NLL in one pass, saves logits' log-softmax rows.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const char* reduction = "mean",
                     int64_t ignore_index = -100, double label_smoothing = 0.0);
// dropout(x, p, train)  y = x * m / (1 - p),  m_i ~ Bernoulli(1 - p) from Philox(seed, offset)
//   dx = g * m / (1 - p). The mask is recomputed from (seed, offset) in backward, not stored.
//   Identity when !train or p == 0.
Tensor dropout(const Tensor& x, double p, bool train, Generator* gen = nullptr);

// ====================== attention (autograd/ops/attention.cpp) ================================
// scaled_dot_product_attention(q, k, v, o)   q [B, H, Tq, d], k [B, H, Tk, d], v [B, H, Tk, dv]
//   S = scale Q K^T (scale = 1/sqrt(d) unless given),  S_ij = -inf where key j is hidden from query i,
//   P = softmax(S) over j,  out = dropout(P) V                                  -> [B, H, Tq, dv]
//   hidden: causal (j > i + Tk - Tq: bottom-right aligned, so a query block at the end of a KV
//   cache works; equal to PyTorch's is_causal when Tq == Tk), window (|i + Tk - Tq - j| > w),
//   key_padding_lengths (j >= len[b]) or key_padding_mask (mask[b, j] true). A query that sees no
//   key gets zeros (and zero gradients), not NaN.
//   dV = P^T dO,  dP = dO V^T,  dS = P (dP - rowsum(dO * O)),  dQ = scale dS K,  dK = scale dS^T Q
//   Fused (default): online softmax over key tiles; saves q, k, v, out and lse = log sum_j e^S_ij
//   (one number per row) and rebuilds P tile by tile in backward: memory O(T), not O(T^2).
//   return_weights: the composed matmul-softmax-matmul path, returning P [B, H, Tq, Tk] too.
//   Dropout uses the same Philox elements in both paths, so they agree for a seed.
struct SdpaOptions {
  bool causal = false;
  Tensor key_padding_lengths;  // i64 [B]: valid keys per sequence
  Tensor key_padding_mask;     // b8 [B, Tk]: true = ignore that key (PyTorch's convention)
  int64_t window = -1;         // >= 0: local attention within +-window (causal: the last window+1)
  double dropout = 0;          // on the attention weights; pass 0 in eval
  Generator* generator = nullptr;
  double scale = 0;            // 0: 1/sqrt(d)
  bool return_weights = false;
};
struct SdpaResult {
  Tensor out;      // [B, H, Tq, dv]
  Tensor weights;  // [B, H, Tq, Tk], only with return_weights
};
SdpaResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const SdpaOptions& options = {});

// ===================== joining & splitting (autograd/ops/join.cpp) ============================
// cat(xs, d)     y = [x_0 | x_1 | ...] along dim d        dx_k = narrow(g, d, offset_k, size_k)
// stack(xs, d)   cat of unsqueeze(x_k, d)                 dx_k = select(g, d, k)
// split(x, s, d) views of size s along d (last may be smaller)   each: narrow's backward
// chunk(x, n, d) n views of nearly equal size along d
Tensor cat(const std::vector<Tensor>& xs, int dim = 0);
Tensor stack(const std::vector<Tensor>& xs, int dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int dim = 0);

// ============================== operators ======================================================
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& x) { return neg(x); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return div(a, b); }
inline Tensor operator+(double a, const Tensor& b) { return add(b, a); }
inline Tensor operator-(double a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
inline Tensor operator/(double a, const Tensor& b) { return div(a, b); }

}  // namespace ag

// =============================== losses (autograd/ops/loss.cpp) ===============================
// Elementwise losses over input and target of one shape (no broadcasting: a shape mismatch is
// almost always a bug, e.g. [N] vs [N,1]), then reduction "mean" (default), "sum" or "none".
//
// mse_loss(x, t)       l = (x - t)^2                       dx = 2 (x - t) g,  dt = -dx
//   composed from sub, mul and the reduction, so its gradient is theirs.
// binary_cross_entropy_with_logits(x, t)   t in [0, 1] (soft labels allowed)
//   l = -[t log s + (1 - t) log(1 - s)],  s = sigmoid(x);  since log s = -log(1 + e^-x):
//   l = max(x, 0) - x t + log(1 + e^-|x|)        (never exponentiates a positive number)
//   dx = (s - t) g,   dt = -x g                  saves x, t
//   log(1 + e^-|x|) is formed as log of a sum: for |x| > ~17 (f32) it rounds to 0, an absolute
//   error below 6e-8 next to torch's log1p.
namespace ag {
Tensor mse_loss(const Tensor& input, const Tensor& target, const char* reduction = "mean");
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        const char* reduction = "mean");
}  // namespace ag
