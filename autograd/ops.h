#pragma once
// Every op of attograd: the table of contents. Each entry gives the forward formula, the
// derivative its backward uses (as a vector-Jacobian product), the shapes, and what it saves for
// backward. The front of each op (checks, kernel dispatch, tape record) is in
// autograd/ops/<family>.cpp, its CPU kernels in core/cpu/<family>.cpp.
//
// Spec format. Each op's declarations are preceded by one block of this form:
//
//   // name: what it computes, in a few words
//   //   forward: the formula of the output
//   //   vjp:     the gradient of each input given g, the gradient of the output: what backward computes
//   //   shapes:  input shapes -> output shape
//   //   saves:   what backward keeps from the forward
//   //   note:    (optional) edge cases, dtypes, how it is computed
//   //   math:    (optional) docs/math/<page>.md, the walkthrough that derives it step by step
//
// The four fields come in this order, each once, then at most one note and one math; a field goes on over lines
// indented deeper than its name. `name` is the function declared right below the block (overloads
// share a block; "a, b: ..." covers several functions); Tensor::name is a method of Tensor declared
// in core/tensor.h. An op without a gradient says "vjp: none (not differentiable)". Each section
// opens with "// ==== family (file) ====", the file that holds the fronts and backwards of its ops.
// tools/opsdoc.cpp renders these blocks into docs/ops.md; the test "docs: ops.md is up to date"
// fails when that file is stale: regenerate it with build/opsdoc.
//
// Notation: g is the gradient of the output and dx the gradient of input x (dL/dx, for a scalar
// loss L). [c] is 1 where c holds, else 0. Between tensors, * and / are elementwise and A B is a
// matrix product. Shapes are written [d0, d1], "..." standing for any leading dims.
//
// Conventions: binary ops broadcast NumPy-style: both inputs are expand()ed to the common shape,
// so the reduction of a broadcast gradient lives in exactly one place, expand's backward (sum_to).
// Ops take f32 or f64 unless they say otherwise; both inputs of a binary op share one dtype.
// Every op takes a last parameter `Site site = Site::current()`: the source line of its call,
// filled in by the compiler (never passed by hand), which anomaly mode reports (autograd/tape.h).
// Each op opens with `CallSite at("op", site);` so that an op called inside another reports the
// outermost call's line: the user's.
#include <vector>

#include "autograd/tape.h"
#include "core/precision.h"
#include "core/random.h"
#include "core/tensor.h"

namespace ag {

// ============================ views (autograd/ops/view.cpp) ==================================
// Views share storage with their input (no copy); their backward maps g back to the input's
// geometry. Most are also methods of Tensor (x.reshape(shape), ...), declared in core/tensor.h.
// Here too: sum_to, expand's backward, and the copies clone and to.
//
// reshape: the same elements in a new shape
//   forward: y = the elements of x in row-major order, laid out in `shape` (one dim may be -1)
//   vjp:     dx = g.reshape(x.shape)
//   shapes:  x [...] -> y `shape`, of the same numel
//   saves:   x.shape only
//   note:    a view when the strides allow it, else a contiguous copy of x first
Tensor reshape(const Tensor& x, const Shape& shape, Site site = Site::current());

// Tensor::view, Tensor::flatten: reshape without a copy; dims start..end merged into one
//   forward: view: y = x.reshape(shape) as a view, an error when the strides would need a copy;
//            flatten(s, e): y = x.reshape with dims s..e replaced by their product
//   vjp:     dx = g.reshape(x.shape)
//   shapes:  x [a, b, c] -> flatten(1, 2): y [a, b*c];  view: y `shape`, of the same numel
//   saves:   x.shape only

// permute: reorder the dims
//   forward: y = x with its dims reordered: dim k of y is dim dims[k] of x (strides permuted)
//   vjp:     dx = g.permute(inverse), where inverse[dims[k]] = k
//   shapes:  x [d_0, d_1, ..., d_n-1] -> y [d_dims[0], d_dims[1], ..., d_dims[n-1]]
//   saves:   the inverse permutation
Tensor permute(const Tensor& x, const Shape& dims, Site site = Site::current());

// transpose, Tensor::mT: swap two dims (mT: the last two)
//   forward: y = transpose(x, a, b): permute(x) swapping dims a and b
//   vjp:     dx = g.transpose(a, b)
//   shapes:  x [.., d_a, .., d_b, ..] -> y [.., d_b, .., d_a, ..]
//   saves:   the inverse permutation (transpose is recorded as a permute)
Tensor transpose(const Tensor& x, int dim0, int dim1, Site site = Site::current());

// slice: every k-th element of a range along one dim, as Python's x[s:e:k]
//   forward: y = slice(x, d, s, e, k) = x[..., s:e:k, ...] along dim d; negative s, e count from
//            the end, out-of-range bounds are clamped (Python semantics); k >= 1
//   vjp:     dx = 0 except dx[..., s:e:k, ...] = g
//   shapes:  x [.., n, ..] -> y [.., ceil((e - s) / k), ..]  (s, e once clamped)
//   saves:   x.shape, d, s, e, k
Tensor slice(const Tensor& x, int dim, int64_t start, int64_t end, int64_t step = 1,
             Site site = Site::current());

// narrow: a range of length n along one dim
//   forward: y = narrow(x, d, s, n) = slice(x, d, s, s + n); the range must lie inside dim d
//   vjp:     dx = 0 except dx[..., s:s+n, ...] = g  (slice's backward)
//   shapes:  x [.., m, ..] -> y [.., n, ..]
//   saves:   x.shape, d, s, n
Tensor narrow(const Tensor& x, int dim, int64_t start, int64_t length, Site site = Site::current());

// select: one index along one dim, which is removed
//   forward: y = select(x, d, i) = x[..., i, ...] along dim d (a negative i counts from the end)
//   vjp:     dx = 0 except dx[..., i, ...] = g
//   shapes:  x [a, n, b], d = 1 -> y [a, b]
//   saves:   x.shape, d, i
Tensor select(const Tensor& x, int dim, int64_t index, Site site = Site::current());

// unsqueeze, squeeze: insert or remove a size-1 dim
//   forward: unsqueeze(x, d): y = x with a size-1 dim inserted at d; squeeze(x, d): y = x with dim
//            d removed (it must have size 1); the method x.squeeze() removes every size-1 dim
//   vjp:     dx = g.reshape(x.shape)
//   shapes:  x [a, b] -> unsqueeze(x, 1): y [a, 1, b];  x [a, 1, b] -> squeeze(x, 1): y [a, b]
//   saves:   x.shape only
Tensor unsqueeze(const Tensor& x, int dim, Site site = Site::current());
Tensor squeeze(const Tensor& x, int dim, Site site = Site::current());

// expand, broadcast_to: broadcast size-1 (and missing leading) dims without a copy
//   forward: y[i] = x[i with every broadcast index set to 0]: stride 0 on the broadcast dims;
//            -1 in `shape` keeps that dim of x
//   vjp:     dx = sum_to(g, x.shape): g summed over the dims broadcasting added
//   shapes:  x [1, n] -> y [m, n];  x [n] -> y [..., n]
//   saves:   x.shape only
//   note:    broadcast_to is the same op. Binary ops expand both inputs, so broadcasting needs no
//            code of its own in their backward.
//   math:    docs/math/autograd.md
Tensor expand(const Tensor& x, const Shape& shape, Site site = Site::current());
Tensor broadcast_to(const Tensor& x, const Shape& shape, Site site = Site::current());

// sum_to: sum a broadcast tensor back down to the shape it was broadcast from
//   forward: y = x summed over the dims broadcasting added (leading dims, and dims where `shape`
//            has size 1), down to `shape`; x itself when the shapes are equal
//   vjp:     dx = expand(g, x.shape)
//   shapes:  x [m, n] -> y [1, n] or [n]
//   saves:   x.shape only (it is recorded as sum, then reshape)
//   note:    the one place where broadcast gradients are reduced (expand's backward)
//   math:    docs/math/autograd.md
Tensor sum_to(const Tensor& x, const Shape& shape, Site site = Site::current());

// Tensor::contiguous, Tensor::clone: a dense copy
//   forward: y = a dense row-major copy of x; contiguous returns x itself when it is already dense
//   vjp:     dx = g
//   shapes:  x [...] -> y of x's shape
//   saves:   nothing

// Tensor::to, Tensor::cpu: a copy on another device or in another dtype
//   forward: y = x copied to another device, or converted to another dtype; x itself when it is
//            already there (cpu() is to(Device::cpu()))
//   vjp:     dx = g.to(x's device or dtype)
//   shapes:  x [...] -> y of x's shape
//   saves:   x's device or dtype
//   note:    a dtype conversion is differentiable between f32 and f64 only: to or from i64 and b8
//            it records nothing. To bf16 or f16 (16-bit storage: core/half.h) it rounds to nearest
//            even, through f32 for an f64; from them it is exact. A tensor that requires grad is
//            refused there while grad mode is on (detach it first): no gradient is dropped silently

// ========================== indexing (autograd/ops/index.cpp) =================================
// index_select: gather slices along one dim at given indices
//   forward: y = index_select(x, d, idx): y[.., j, ..] = x[.., idx[j], ..] along dim d, for i64
//            indices idx (a copy)
//   vjp:     dx = 0, then dx[.., idx[j], ..] += g[.., j, ..]  (repeated indices accumulate)
//   shapes:  x [.., N, ..], idx [L] -> y [.., L, ..]
//   saves:   idx, x.shape
//   note:    every index must lie in [0, N)
//   math:    docs/math/embedding.md
Tensor index_select(const Tensor& x, int dim, const Tensor& index, Site site = Site::current());

// ====================== elementwise (autograd/ops/elementwise.cpp) ============================
// Binary ops broadcast their inputs (see Conventions above); a double operand is a 0-dim tensor of
// the other's dtype.
//
// add: a + b
//   forward: y = a + b
//   vjp:     da = g,  db = g
//   shapes:  a, b broadcast -> y [broadcast(a, b)]
//   saves:   nothing
//   note:    also on i64 (without gradient)
Tensor add(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor add(const Tensor& a, double b, Site site = Site::current());

// sub: a - b
//   forward: y = a - b
//   vjp:     da = g,  db = -g
//   shapes:  a, b broadcast -> y [broadcast(a, b)]
//   saves:   nothing
//   note:    also on i64 (without gradient)
Tensor sub(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor sub(const Tensor& a, double b, Site site = Site::current());
Tensor sub(double a, const Tensor& b, Site site = Site::current());

// mul: a * b
//   forward: y = a * b
//   vjp:     da = g * b,  db = g * a
//   shapes:  a, b broadcast -> y [broadcast(a, b)]
//   saves:   a, b
//   note:    also on i64 (without gradient)
Tensor mul(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor mul(const Tensor& a, double b, Site site = Site::current());

// div: a / b
//   forward: y = a / b
//   vjp:     da = g / b,  db = -g * a / b^2
//   shapes:  a, b broadcast -> y [broadcast(a, b)]
//   saves:   a, b
Tensor div(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor div(const Tensor& a, double b, Site site = Site::current());
Tensor div(double a, const Tensor& b, Site site = Site::current());

// neg: -x
//   forward: y = -x
//   vjp:     dx = -g
//   shapes:  x [...] -> y of x's shape
//   saves:   nothing
//   note:    also on i64 (without gradient)
Tensor neg(const Tensor& x, Site site = Site::current());

// pow: x to a power, a double p or a tensor t
//   forward: pow(x, p): y = x^p;  pow(x, t): y = x^t elementwise (x and t broadcast)
//   vjp:     pow(x, p): dx = g * p * x^(p-1)  (0 when p == 0)
//            pow(x, t): dx = g * t * x^(t-1)  (0 where t == 0),
//                       dt = g * x^t * ln x   (0 where x == 0 and t >= 0, as PyTorch)
//   shapes:  x [...] -> y of x's shape;  x, t broadcast -> y [broadcast(x, t)]
//   saves:   x (and t)
Tensor pow(const Tensor& x, double p, Site site = Site::current());
Tensor pow(const Tensor& x, const Tensor& t, Site site = Site::current());

// exp: e^x
//   forward: y = e^x
//   vjp:     dx = g * y
//   shapes:  x [...] -> y of x's shape
//   saves:   y
Tensor exp(const Tensor& x, Site site = Site::current());

// log: natural logarithm
//   forward: y = ln x
//   vjp:     dx = g / x
//   shapes:  x [...] -> y of x's shape
//   saves:   x
Tensor log(const Tensor& x, Site site = Site::current());

// sqrt: square root
//   forward: y = x^(1/2)
//   vjp:     dx = g / (2 y)
//   shapes:  x [...] -> y of x's shape
//   saves:   y
Tensor sqrt(const Tensor& x, Site site = Site::current());

// rsqrt: reciprocal square root
//   forward: y = x^(-1/2)
//   vjp:     dx = -g * y^3 / 2
//   shapes:  x [...] -> y of x's shape
//   saves:   y
Tensor rsqrt(const Tensor& x, Site site = Site::current());

// tanh: hyperbolic tangent
//   forward: y = tanh x
//   vjp:     dx = g * (1 - y^2)
//   shapes:  x [...] -> y of x's shape
//   saves:   y
Tensor tanh(const Tensor& x, Site site = Site::current());

// sigmoid: the logistic function
//   forward: y = 1 / (1 + e^-x)
//   vjp:     dx = g * y * (1 - y)
//   shapes:  x [...] -> y of x's shape
//   saves:   y
Tensor sigmoid(const Tensor& x, Site site = Site::current());

// relu: rectified linear unit
//   forward: y = max(x, 0)  (NaN stays NaN)
//   vjp:     dx = g * [x > 0]  (0 at x == 0)
//   shapes:  x [...] -> y of x's shape
//   saves:   x
Tensor relu(const Tensor& x, Site site = Site::current());

// abs: absolute value
//   forward: y = |x|
//   vjp:     dx = g * sign(x)  (0 at x == 0)
//   shapes:  x [...] -> y of x's shape
//   saves:   x
Tensor abs(const Tensor& x, Site site = Site::current());

// gelu: Gaussian error linear unit, exact ("none") or its tanh approximation ("tanh")
//   forward: "none": y = x * Phi(x) = x/2 * (1 + erf(x / sqrt 2))
//            "tanh": y = x/2 * (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   vjp:     "none": dx = g * (Phi(x) + x * phi(x)),  phi(x) = e^(-x^2/2) / sqrt(2 pi)
//            "tanh": dx = g * (1/2 (1 + t) + x/2 (1 - t^2) sqrt(2/pi) (1 + 3*0.044715 x^2)),  t = tanh u
//   shapes:  x [...] -> y of x's shape
//   saves:   x
//   math:    docs/math/gelu.md
Tensor gelu(const Tensor& x, const char* approximate = "none", Site site = Site::current());

// silu: sigmoid linear unit (swish)
//   forward: y = x * s,  s = sigmoid(x)
//   vjp:     dx = g * s * (1 + x (1 - s))
//   shapes:  x [...] -> y of x's shape
//   saves:   x
Tensor silu(const Tensor& x, Site site = Site::current());

// clamp: limit to [lo, hi]
//   forward: y = min(max(x, lo), hi)
//   vjp:     dx = g * [lo <= x <= hi]  (the bounds themselves pass the gradient, as PyTorch)
//   shapes:  x [...] -> y of x's shape
//   saves:   x
//   note:    lo <= hi is required
Tensor clamp(const Tensor& x, double lo, double hi, Site site = Site::current());

// round_bf16: round to the nearest bfloat16, kept in f32 (bf16 autocast's cast: autograd/autocast.h)
//   forward: y = x rounded to 8 significant bits (7 stored), ties to even; the exponent range is
//            f32's, so only values within half a bf16 unit of f32's largest become inf; NaN stays NaN
//   vjp:     dx = g  (straight through: a cast's gradient, as torch's .to(torch.bfloat16))
//   shapes:  x [...] -> y of x's shape, f32
//   saves:   nothing
//   note:    f32 only; |y - x| <= 2^-8 |x|
Tensor round_bf16(const Tensor& x, Site site = Site::current());

// round_fp16: round to the nearest IEEE half, kept in f32 (fp16 autocast's cast: autograd/autocast.h)
//   forward: y = x rounded to 11 significant bits, ties to even; |x| >= 65520 -> inf (65504 is the
//            largest half); below 2^-14 to multiples of 2^-24 (subnormals), so |x| <= 2^-25 -> 0
//   vjp:     dx = g  (straight through, as torch's .to(torch.float16))
//   shapes:  x [...] -> y of x's shape, f32
//   saves:   nothing
//   note:    f32 only; |y - x| <= 2^-11 |x| where no overflow or underflow
Tensor round_fp16(const Tensor& x, Site site = Site::current());

// round_operand: an f32 tensor as autocast reads an operand in precision p (core/precision.h)
//   forward: y = x (fp32: x itself, no copy), round_bf16(x) (bf16) or round_fp16(x) (fp16): the
//            tensor form of pw::round_operand, the rule the kernels apply element by element
//   vjp:     dx = g  (straight through, as both roundings)
//   shapes:  x [...] -> y of x's shape, f32
//   saves:   nothing
//   note:    f32 only, for every p
Tensor round_operand(const Tensor& x, Precision p, Site site = Site::current());

// maximum, minimum: elementwise max or min of two tensors
//   forward: y = max(a, b), or y = min(a, b)  (a NaN on either side gives NaN)
//   vjp:     maximum: da = g * ([a > b] + [a == b]/2),  db = g * ([b > a] + [a == b]/2)
//            minimum: the same with < (ties split the gradient, as PyTorch)
//   shapes:  a, b broadcast -> y [broadcast(a, b)]
//   saves:   a, b
Tensor maximum(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor minimum(const Tensor& a, const Tensor& b, Site site = Site::current());

// eq, ne, lt, le, gt, ge: elementwise comparisons
//   forward: y = [a == b], [a != b], [a < b], [a <= b], [a > b], [a >= b]
//   vjp:     none (not differentiable)
//   shapes:  a, b broadcast -> y b8 [broadcast(a, b)]
//   saves:   nothing
//   note:    any dtype (both the same); eq, lt and gt also take a double b
Tensor eq(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor ne(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor lt(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor le(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor gt(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor ge(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor eq(const Tensor& a, double b, Site site = Site::current());
Tensor lt(const Tensor& a, double b, Site site = Site::current());
Tensor gt(const Tensor& a, double b, Site site = Site::current());

// where: pick from a where the condition holds, else from b
//   forward: y = where(c, a, b) = c ? a : b  (c is b8)
//   vjp:     da = where(c, g, 0),  db = where(c, 0, g)  (c gets none)
//   shapes:  c, a, b broadcast -> y [broadcast(c, a, b)]
//   saves:   c
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, Site site = Site::current());

// masked_fill: overwrite with a value where the mask holds
//   forward: y = masked_fill(x, m, v) = m ? v : x  (m is b8, v a double)
//   vjp:     dx = where(m, 0, g)
//   shapes:  x [...], m broadcast to x -> y of x's shape
//   saves:   m (it is where(m, v, x))
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value, Site site = Site::current());

// ======================== reductions (autograd/ops/reduce.cpp) ================================
// Over `dims` (empty = all dims; negative dims count from the end); keepdim keeps them as size 1.
// N is the number of elements reduced into each output; x [a, b, c] over dims {1} gives [a, c]
// ([a, 1, c] with keepdim).
//
// sum: sum over dims
//   forward: y = sum_i x_i
//   vjp:     dx = expand(g, x.shape)  (g first given the reduced dims back as size 1)
//   shapes:  x [a, b, c], dims {1} -> y [a, c]  ([a, 1, c] with keepdim)
//   saves:   x.shape only
//   note:    b8 sums to an i64 count, as PyTorch; i64 sums stay i64 (without gradient)
Tensor sum(const Tensor& x, const std::vector<int>& dims = {}, bool keepdim = false,
           Site site = Site::current());

// mean: average over dims
//   forward: y = sum_i x_i / N
//   vjp:     dx = expand(g, x.shape) / N
//   shapes:  x [a, b, c], dims {1} -> y [a, c]  ([a, 1, c] with keepdim)
//   saves:   nothing of x's size (it is sum, then div by N: div keeps the sum and N)
//   note:    floating dtypes only
Tensor mean(const Tensor& x, const std::vector<int>& dims = {}, bool keepdim = false,
            Site site = Site::current());

// max: maximum over dims (torch.amax)
//   forward: y = max_i x_i
//   vjp:     dx = g / k at the k positions equal to the max, 0 elsewhere (ties share the gradient)
//   shapes:  x [a, b, c], dims {1} -> y [a, c]  ([a, 1, c] with keepdim)
//   saves:   x, y
//   note:    a reduction over an empty dim is an error
Tensor max(const Tensor& x, const std::vector<int>& dims = {}, bool keepdim = false,
           Site site = Site::current());

// var: variance over dims, with a correction c
//   forward: y = var(x, dims, c) = sum_i (x_i - mean)^2 / (N - c);  c = 1 (default) is the
//            unbiased estimate, as in PyTorch, c = 0 the biased one
//   vjp:     dx = g * 2 (x - mean) / (N - c)  (the mean's own term vanishes: sum_i (x_i - mean) = 0)
//   shapes:  x [a, n, b], dims {1} -> y [a, b]  ([a, 1, b] with keepdim)
//   saves:   x - mean
//   note:    floating dtypes only
Tensor var(const Tensor& x, const std::vector<int>& dims = {}, int64_t correction = 1, bool keepdim = false,
           Site site = Site::current());

// argmax: index of the maximum along one dim
//   forward: y = argmax(x, d): the index of the first maximum along dim d
//   vjp:     none (not differentiable)
//   shapes:  x [a, b, c], d = 1 -> y i64 [a, c]  ([a, 1, c] with keepdim)
//   saves:   nothing
Tensor argmax(const Tensor& x, int dim, bool keepdim = false, Site site = Site::current());

// =========================== matmul (autograd/ops/matmul.cpp) =================================
// matmul: matrix product over the last two dims, batch dims broadcast (torch.matmul)
//   forward: C = A B for each matrix of the broadcast batch; a 1-D a is a row [1, K] and a 1-D b
//            a column [K, 1], the added dim removed from the result (both 1-D: a dot product)
//   vjp:     dA = g B^T,  dB = A^T g  (then sum_to over the batch dims an input was broadcast in)
//   shapes:  a [..., M, K] @ b [..., K, N] -> y [broadcast(...), M, N]
//   saves:   a, b (copied only when BLAS cannot read a view's strides)
//   note:    f32 runs attograd's sgemm (core/cpu/gemm.cpp), f64 cblas_dgemm; transposed views go as
//            transpose flags, not copies. A b shared by every matrix of a makes one GEMM of all of
//            a's rows. Under bf16 or fp16 autocast (autograd/autocast.h) f32 operands are read
//            rounded to that format (round_bf16, round_fp16), in backward too, and the products
//            are summed in f32.
//   math:    docs/math/linear.md
Tensor matmul(const Tensor& a, const Tensor& b, Site site = Site::current());

// linear: affine map, y = x W^T + b (torch.nn.functional.linear)
//   forward: y = x W^T + b  (b may be undefined: no bias)
//   vjp:     dX = g W,  dW = g^T X  (summed over every row of x),  db = sum over rows of g
//   shapes:  x [..., in], w [out, in], b [out] -> y [..., out]
//   saves:   x, w
//   note:    one GEMM with the bias added in its epilogue, no second pass. dW is computed in W's own
//            (out, in) layout: no transposed gradient to copy back. Under bf16 or fp16 autocast x,
//            w (and g in backward) are read rounded, as in matmul; the bias stays f32.
//   math:    docs/math/linear.md
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor(), Site site = Site::current());

// ====================== normalisation & losses (autograd/ops/nn.cpp) ==========================
// The kernels read dense buffers: a non-contiguous input (a transposed or sliced view) is copied
// once first.
//
// softmax: normalised exponentials along one dim
//   forward: y_i = e^(x_i - m) / sum_j e^(x_j - m),  m = max_j x_j  (m only for stability)
//   vjp:     dx_i = y_i (g_i - sum_j g_j y_j)
//   shapes:  x [...] -> y of x's shape, each row along `dim` summing to 1
//   saves:   y
//   note:    a row that is all -inf gives NaN, as in PyTorch
//   math:    docs/math/softmax.md
Tensor softmax(const Tensor& x, int dim = -1, Site site = Site::current());

// log_softmax: the logarithm of softmax, computed stably
//   forward: y_i = x_i - m - log sum_j e^(x_j - m),  m = max_j x_j
//   vjp:     dx_i = g_i - e^(y_i) sum_j g_j
//   shapes:  x [...] -> y of x's shape
//   saves:   y
//   note:    a row that is all -inf gives NaN, as in PyTorch
//   math:    docs/math/softmax.md
Tensor log_softmax(const Tensor& x, int dim = -1, Site site = Site::current());

// layer_norm: normalise over the last dims, then scale and shift
//   forward: over the last k = normalized_shape.size() dims, of N elements per row:
//            mu = mean(x),  rstd = 1 / sqrt(var_biased(x) + eps),  xhat = (x - mu) rstd
//            y = xhat * w + b  (w and b may each be undefined)
//   vjp:     dxhat = g * w;  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
//            dw = sum over rows of g * xhat;  db = sum over rows of g
//   shapes:  x [..., normalized_shape], w [normalized_shape], b [normalized_shape] -> y of x's shape
//   saves:   x, w, and per row mu and rstd
//   math:    docs/math/layernorm.md
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5, Site site = Site::current());

// embedding: rows of a table, looked up by index
//   forward: y[..., :] = w[idx[...], :]
//   vjp:     dw[v, :] = sum over positions p with idx[p] == v of g[p, :]  (scatter-add; idx gets none)
//   shapes:  w [V, D], idx i64 [...] -> y [..., D]
//   saves:   idx
//   note:    every index must lie in [0, V)
//   math:    docs/math/embedding.md
Tensor embedding(const Tensor& weight, const Tensor& indices, Site site = Site::current());

// cross_entropy: softmax cross-entropy against class indices, with label smoothing
//   forward: p = softmax(logits);  q = (1 - s) onehot(target) + s / C  (s = label_smoothing)
//            loss_n = -sum_c q_c log p_c  (0 for a row whose target == ignore_index), reduced by
//            "mean" (over the rows not ignored), "sum" or "none"
//   vjp:     dlogits_n = (p_n - q_n) * g_n  (0 for ignored rows; g divided by the count of rows not
//            ignored for "mean"); target gets none
//   shapes:  logits [N, C], target i64 [N] -> loss []  ([N] for "none")
//   saves:   log p (the log-softmax rows of the logits), target
//   note:    fused: log-softmax and NLL in one pass. A target must lie in [0, C) or equal
//            ignore_index; "mean" with every row ignored is 0/0 = NaN, as in PyTorch.
//   math:    docs/math/softmax.md
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const char* reduction = "mean",
                     int64_t ignore_index = -100, double label_smoothing = 0.0, Site site = Site::current());

// dropout: zero elements at random with probability p, scale the rest by 1 / (1 - p)
//   forward: y = x * m / (1 - p),  m_i ~ Bernoulli(1 - p) drawn from Philox(seed, offset)
//   vjp:     dx = g * m / (1 - p)
//   shapes:  x [...] -> y of x's shape
//   saves:   (seed, offset) only: backward draws the mask again instead of storing it
//   note:    x itself (no node) when !train or p == 0; p must lie in [0, 1)
Tensor dropout(const Tensor& x, double p, bool train, Generator* gen = nullptr, Site site = Site::current());

// ======================== losses (autograd/ops/loss.cpp) ======================================
// Elementwise losses over input and target of one shape (no broadcasting: a shape mismatch is
// almost always a bug, e.g. [N] vs [N,1]), then reduction "mean" (default), "sum" or "none".
//
// mse_loss: squared error
//   forward: l = (x - t)^2  (x = input, t = target), then the reduction
//   vjp:     dx = 2 (x - t) g,  dt = -dx  (composed from sub, mul and the reduction: their gradients)
//   shapes:  x [...], t [...] of one shape -> l []  (x's shape for "none")
//   saves:   x - t (as mul's inputs)
Tensor mse_loss(const Tensor& input, const Tensor& target, const char* reduction = "mean",
                Site site = Site::current());

// binary_cross_entropy_with_logits: sigmoid and binary cross-entropy in one stable formula
//   forward: l = -[t log s + (1 - t) log(1 - s)],  s = sigmoid(x)  (x = logits, t = target in
//            [0, 1]: soft labels allowed); since log s = -log(1 + e^-x):
//            l = max(x, 0) - x t + log(1 + e^-|x|)  (never exponentiates a positive number),
//            then the reduction
//   vjp:     dx = (s - t) g,  dt = -x g
//   shapes:  x [...], t [...] of one shape -> l []  (x's shape for "none")
//   saves:   x, t
//   note:    log(1 + e^-|x|) is formed as the log of a sum: for |x| > ~17 (f32) it rounds to 0, an
//            absolute error below 6e-8 next to torch's log1p.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        const char* reduction = "mean", Site site = Site::current());

// ====================== attention (autograd/ops/attention.cpp) ================================
// rope: rotary position embedding (Su et al., RoFormer), applied to queries and keys
//   forward: row t of x [..., T, D] (D even) stands at position p = offset + t; each of its D/2
//            pairs (x1, x2), pair k turning by the angle a = p base^(-2k/D), becomes
//            (x1 cos a - x2 sin a,  x1 sin a + x2 cos a)
//            pairs: (x[k], x[k + D/2]) by default ("rotate half": GPT-NeoX, LLaMA and PyTorch's
//            torchtune), or (x[2k], x[2k+1]) with interleaved (RoFormer, GPT-J)
//   vjp:     dx = g turned by -a: (g1 cos a + g2 sin a,  -g1 sin a + g2 cos a)
//   shapes:  x [..., T, D] -> y of x's shape
//   saves:   nothing (the angles are recomputed)
//   note:    cos a and sin a are computed in f64 and rounded to x's dtype. A query at position p
//            and a key at position r then score q R(p)^T R(r) k^T = q R(r - p) k^T: only the
//            distance between them counts, which is what lets a model run past its training
//            length. offset: the positions a KV cache already holds, for decoding.
//   math:    docs/math/positional.md
Tensor rope(const Tensor& x, int64_t offset = 0, bool interleaved = false, double base = 10000,
            Site site = Site::current());

// scaled_dot_product_attention: softmax(scale Q K^T, masked) V, fused or composed
//   forward: S = scale Q K^T  (scale = 1/sqrt(d) unless given),  S_ij = -inf where key j is hidden
//            from query i,  P = softmax(S) over j,  out = dropout(P) V
//            alibi_slopes m [H] (ALiBi, Press et al.): S_ij of head h gets - m_h |i + Tk - Tq - j|
//            added before the masks, computed inside the kernels (no Tq x Tk bias is stored)
//            hidden: causal (j > i + Tk - Tq: bottom-right aligned, so a query block at the end
//            of a KV cache works; equal to PyTorch's is_causal when Tq == Tk), window
//            (|i + Tk - Tq - j| > w), key_padding_lengths (j >= len[b]), key_padding_mask
//            (mask[b, j] true) or block_mask (block_mask[i / bs, j / bs] false, bs = block_size:
//            a block-sparse pattern such as nn/sparse_patterns.h builds, shared by every batch
//            element and head). A query that sees no key gets zeros (and zero gradients), not NaN.
//   vjp:     dV = P~^T dO,  dP = (dO V^T) * M / (1 - p),  where P~ = P * M / (1 - p) is P after the
//            dropout mask M (without dropout: P~ = P, dP = dO V^T)
//            dS = P * (dP - rowsum(dO * O)),  dQ = scale dS K,  dK = scale dS^T Q
//            (the ALiBi bias is a constant: no gradient flows to alibi_slopes)
//   shapes:  q [B, H, Tq, d], k [B, H, Tk, d], v [B, H, Tk, dv] -> out [B, H, Tq, dv]
//            (and weights P [B, H, Tq, Tk] with return_weights). With enable_gqa (grouped-query
//            attention, PyTorch's name) k and v may have Hkv heads, Hkv dividing H: query head h
//            reads key/value head h / (H / Hkv), as if each were repeated H / Hkv times
//            (repeat_interleave), and dK, dV sum over the query heads of each group
//   saves:   fused: q, k, v, out, the masks and lse_i = log sum_j e^S_ij (one number per row);
//            composed: what its matmul, softmax and dropout save, P included
//   note:    fused (default): online softmax over key tiles; backward rebuilds P tile by tile from
//            lse: memory O(T), not O(T^2). return_weights: the composed matmul-softmax-matmul
//            path, returning P too. Dropout uses the same Philox elements in both paths, so they
//            agree for a seed. With block_mask the fused kernels skip every tile whose blocks
//            are all dropped: the cost grows with the kept blocks, not with Tq Tk. Under bf16 or
//            fp16 autocast (autograd/autocast.h) f32 q, k, v are rounded to that format
//            (round_bf16, round_fp16) and the rest is computed in f32, except that backward reads
//            the gradients entering its products rounded too, as matmul's does: dO (also in
//            rowsum(dO * O)) and dS before dQ and dK; P is not rounded.
//   math:    docs/math/attention.md
struct SdpaOptions {
  bool causal = false;
  Tensor key_padding_lengths;  // i64 [B]: valid keys per sequence
  Tensor key_padding_mask;     // b8 [B, Tk]: true = ignore that key (PyTorch's convention)
  int64_t window = -1;         // >= 0: local attention within +-window (causal: the last window+1)
  double dropout = 0;          // on the attention weights; pass 0 in eval
  Generator* generator = nullptr;
  double scale = 0;            // 0: 1/sqrt(d)
  bool return_weights = false;
  Tensor block_mask;           // b8 [ceil(Tq/bs), ceil(Tk/bs)]: true = block kept; on the cpu or q's device
  int64_t block_size = 0;      // bs >= 1 with block_mask: query i, key j lie in block (i / bs, j / bs)
  bool enable_gqa = false;     // k and v may have fewer heads Hkv dividing H (grouped-query attention)
  Tensor alibi_slopes;         // f32 [H]: ALiBi's per-head slopes (nn/positional.h alibi_slopes), on
                               //   the cpu or q's device; undefined: no bias
};
struct SdpaResult {
  Tensor out;      // [B, H, Tq, dv]
  Tensor weights;  // [B, H, Tq, Tk], only with return_weights
};
SdpaResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const SdpaOptions& options = {}, Site site = Site::current());

// ===================== joining & splitting (autograd/ops/join.cpp) ============================
// cat: concatenate along one dim
//   forward: y = cat(xs, d) = [x_0 | x_1 | ...] along dim d
//   vjp:     dx_k = narrow(g, d, offset_k, size_k)
//   shapes:  x_k [a, n_k, b], d = 1 -> y [a, sum_k n_k, b]  (every other dim equal)
//   saves:   each input's offset and size along d
Tensor cat(const std::vector<Tensor>& xs, int dim = 0, Site site = Site::current());

// stack: join along a new dim
//   forward: y = stack(xs, d) = cat of unsqueeze(x_k, d): the new dim d indexes the inputs
//   vjp:     dx_k = select(g, d, k)
//   shapes:  K inputs [a, b], d = 0 -> y [K, a, b]  (all inputs of one shape)
//   saves:   each input's offset along d (cat's)
Tensor stack(const std::vector<Tensor>& xs, int dim = 0, Site site = Site::current());

// split: views of a given size along one dim (torch.split)
//   forward: split(x, s, d): y_k = narrow(x, d, k s, s), pieces of size s, the last one smaller
//            when s does not divide the size of dim d
//   vjp:     each piece: narrow's backward (dx = 0 except g in the piece's range)
//   shapes:  x [a, n, b] -> y_k [a, s, b], the last [a, n - s (K - 1), b]  (K = ceil(n / s))
//   saves:   each piece's range (narrow's)
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int dim = 0, Site site = Site::current());

// chunk: a given number of nearly equal views along one dim (torch.chunk)
//   forward: chunk(x, chunks, d) = split(x, ceil(n / chunks), d): at most `chunks` pieces, fewer
//            when they do not come out even (n = 5, chunks = 4 gives 3 pieces of 2, 2, 1); an
//            empty dim gives `chunks` empty pieces
//   vjp:     each piece: narrow's backward (dx = 0 except g in the piece's range)
//   shapes:  x [a, n, b] -> y_k [a, ceil(n / chunks), b], the last possibly smaller
//   saves:   each piece's range (narrow's)
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int dim = 0, Site site = Site::current());

// ============================== operators ======================================================
// Shorthands for the ops above: a + b is add(a, b), -x is neg(x), and so on, a double on either side.
// An operator cannot take the extra `site` parameter, so anomaly mode reports the line below for
// it (unless an enclosing op or CallSite has claimed the call); write add(a, b) for the caller's.
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
