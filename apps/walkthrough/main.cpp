// The walkthrough: one attention layer, small enough to print every number, computed step by step
// with attograd's ops; then its backward pass, each gradient checked on the spot; then the
// experiment that shows why attention divides its scores by sqrt(d_k).
//
// Part 1, forward (f64, so that finite differences are accurate to ~1e-10):
//
//   X   (T, D)       T = 4 tokens, D = d_model = 8;  H = 2 heads of size hs = D / H = 4 (d_k)
//   Q   = X Wq       (T, D)       Wq, Wk, Wv, Wo (D, D): the articles' Q = X W^Q, no biases
//   K   = X Wk       (T, D)
//   V   = X Wv       (T, D)
//   Q_h, K_h, V_h    (H, T, hs)   head h owns columns [h hs, (h+1) hs): reshape (T, H, hs), permute
//   S   = Q_h K_h^T  (H, T, T)    raw scores: how well query i matches key j
//   Z   = S / sqrt(hs)            scaled scores
//   P   = softmax(Z) (H, T, T)    attention weights, over the keys j: each row sums to 1
//   O_h = P V_h      (H, T, hs)   head outputs
//   C   = concat_h O_h  (T, D)    the heads side by side again: permute (T, H, hs), reshape
//   Out = C Wo       (T, D)
//   L   = mean((Out - Target)^2)  a scalar loss against a fixed random Target (T, D)
//
// The options walk through the other cases of docs/math/attention.md. They combine, except
// --cross with --causal or --kv-cache (refused, exit 2: both are about the positions of one sequence).
//   --causal     key j is hidden from query i when j > i: Z_ij = -inf before the softmax, so P_ij = 0.
//                Prints the mask (1 = seen, 0 = hidden) and the masked scores Z.
//   --padding N  the last N keys are padding, hidden from every query (key_padding_lengths = Tk - N);
//                the mask and the masked scores as for --causal. N must be in [0, Tk - 1] (else exit
//                2): key 0 stays visible, so no query is left with a row of -inf (the fused op would
//                give such a query zeros, not the NaN of a softmax over nothing).
//   --cross      cross-attention: queries from X (Tq = 4 tokens), keys and values from a second
//                sequence Y (Tk = 6 tokens): K = Y Wk, V = Y Wv, and S, Z, P are (H, Tq, Tk).
//                Y gets its own gradient, dY = dK Wk^T + dV Wv^T, and dX = dQ Wq^T alone.
//   --kv-cache   decoding (implies --causal): after the checks, the layer runs again one token at a
//                time, each token's k and v appended to an nn::KVCache, and the rows it outputs must
//                equal the full causal pass.
//
// Part 2, backward: L.backward() fills the gradient of every leaf (X, Y and the weights). To see the
// gradients of the intermediates too (dOut, dP, dS, dQ, ...), each one is "tapped": the forward adds
// a zero tensor `probe` that requires grad, t + probe. That changes no value, and since addition
// passes its gradient through unchanged, probe.grad is exactly dL/dt. Each gradient is then printed
// and compared with (a) the formula derived by hand (docs/math/attention.md, multihead.md,
// linear.md, softmax.md), computed from the saved forward values, and (b) central finite
// differences, dL/dx_j ~ (L(x + eps e_j) - L(x - eps e_j)) / (2 eps), which need nothing but the
// forward. Then the identity of backward step 2: D_i = rowsum(dP * P)_i, which the softmax gradient
// needs, equals rowsum(dO_h * O_h)_i, printed side by side for every head and row. Every check
// prints PASS or FAIL; the program exits 1 when one fails.
// Finally ag::scaled_dot_product_attention, the fused kernel, given the same case (causal,
// key_padding_lengths), must give the same output and the same gradients as the composed ops. It
// applies its own mask rule, so it also catches a mask built wrong here: finite differences cannot,
// they agree with whatever forward they are given.
//
// Part 3, the scaling experiment (skip it with --no-experiment): for d_k = 16, 32, ..., 1024,
// q, k ~ N(0, 1) (64 queries, 64 keys, 5 seeds), out = softmax(s q k^T) v with s = 1/sqrt(d_k) and
// with s = 1, backward from a random upstream gradient. It prints the mean of each query's largest
// weight (1 = one-hot), the norms of the gradients reaching q and k and the median over queries of
// |dq_i|, and draws them in <out>/scaling.svg. Scaled, all of them stay flat over d_k. Unscaled, the
// scores' spread grows as sqrt(d_k), the softmax saturates towards one-hot, most queries get almost
// no gradient (the median falls by orders of magnitude) while the few unsaturated rows get large ones.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "apps/common/plot.h"
#include "apps/common/run.h"
#include "attograd.h"
#include "nn/attention.h"

using namespace ag;

namespace {

constexpr int64_t T = 4, D = 8, H = 2, hs = D / H;
constexpr int64_t kCrossKeys = 6;  // --cross: the length of Y, which gives the keys and values

// ---- the case: which attention the options ask for ---------------------------------------

struct Case {
  bool causal = false;    // --causal (and --kv-cache)
  int64_t padding = 0;    // --padding N: the last N keys hidden
  bool cross = false;     // --cross: keys and values from Y
  bool kv_cache = false;  // --kv-cache: decode token by token afterwards
  int64_t Tq = T, Tk = T; // queries (rows of X), keys (rows of X, or of Y with --cross)

  bool masked() const { return causal || padding > 0; }
  // The keys that are tokens, not padding: 0 .. valid_keys() - 1 (the op's key_padding_lengths).
  int64_t valid_keys() const { return Tk - padding; }
};

// Whether key j is hidden from query i (docs/math/attention.md, Masks): causal hides the future,
// j > i (self-attention, Tq = Tk); padding hides the last `padding` keys, j >= Tk - padding.
bool is_hidden(const Case& c, int64_t i, int64_t j) { return (c.causal && j > i) || j >= c.valid_keys(); }

// The mask (Tq, Tk) as b8, true = hidden; undefined when nothing is hidden.
Tensor hidden_mask(const Case& c) {
  if (!c.masked()) return Tensor();
  Tensor m = zeros({c.Tq, c.Tk}, DType::b8);
  bool* h = m.data<bool>();
  for (int64_t i = 0; i < c.Tq; ++i)
    for (int64_t j = 0; j < c.Tk; ++j) h[i * c.Tk + j] = is_hidden(c, i, j);
  return m;
}

// The same case in the fused op's terms (SdpaOptions, autograd/ops.h): its own rule, not our mask.
SdpaOptions sdpa_options(const Case& c) {
  SdpaOptions o;
  o.causal = c.causal;
  if (c.padding > 0) o.key_padding_lengths = from_vector<int64_t>({c.valid_keys()}, {1});  // batch of 1
  return o;
}

// "key 3" or "keys 2..3": the keys from `first` to `last`.
std::string keys(int64_t first, int64_t last) {
  return first == last ? fmt::format("key {}", first) : fmt::format("keys {}..{}", first, last);
}

std::string describe(const Case& c) {
  std::string s =
      c.cross ? fmt::format("cross-attention, Tq = {} queries from X, Tk = {} keys and values from Y", c.Tq, c.Tk)
              : fmt::format("{}self-attention, T = {} tokens", c.causal ? "causal " : "", c.Tq);
  if (c.padding > 0) s += fmt::format(", {} of {} padding", keys(c.valid_keys(), c.Tk - 1), c.Tk);
  return s;
}

// ---- printing -------------------------------------------------------------------------------

int digits = 4;  // --precision

// A (rows, cols) matrix, or (H, rows, cols) as one block per head, each value with `digits` decimals.
void print_tensor(const std::string& name, const Tensor& t, const std::string& comment = "") {
  fmt::print("{} {}{}{}\n", name, t.shape(), comment.empty() ? "" : "  ", comment);
  const std::vector<double> v = t.to_vector<double>();
  const int w = digits + 5;
  if (t.ndim() == 0) {
    fmt::print("  {:.{}f}\n", v[0], digits);
    return;
  }
  const int64_t cols = t.size(-1), rows = t.ndim() >= 2 ? t.size(-2) : 1, blocks = t.numel() / (rows * cols);
  for (int64_t b = 0; b < blocks; ++b) {
    if (blocks > 1) fmt::print("  head {}\n", b);
    for (int64_t r = 0; r < rows; ++r) {
      std::string line = "  ";
      for (int64_t c = 0; c < cols; ++c) line += fmt::format("{:>{}.{}f}", v[size_t((b * rows + r) * cols + c)], w, digits);
      fmt::print("{}\n", line);
    }
  }
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  return max(abs(sub(a, b))).item<double>();
}

// ---- the layer ------------------------------------------------------------------------------

// What the loss depends on: the input(s), the weights, and one probe per intermediate (see the top
// of the file). All are f64 leaves that require grad; the probes hold zeros. Y is defined only for
// cross-attention.
struct Leaves {
  Tensor X, Y, Wq, Wk, Wv, Wo;
  Tensor probe_Q, probe_K, probe_V, probe_S, probe_Z, probe_P, probe_O, probe_C, probe_Out;
};

// The leaves the fused op is compared on: the inputs and the weights, with their names.
struct Named {
  const char* name;
  Tensor Leaves::*leaf;
};
std::vector<Named> inputs_and_weights(const Case& c) {
  std::vector<Named> v = {
      {"X", &Leaves::X}, {"Wq", &Leaves::Wq}, {"Wk", &Leaves::Wk}, {"Wv", &Leaves::Wv}, {"Wo", &Leaves::Wo}};
  if (c.cross) v.insert(v.begin() + 1, {"Y", &Leaves::Y});
  return v;
}

// Every intermediate of one forward pass.
struct Forward {
  Tensor Q, K, V, Qh, Kh, Vh, S, Z, P, O, C, Out, L;
};

Tensor leaf(const Tensor& values) { return values.detach().set_requires_grad(true); }

// t + probe: the same values; the gradient reaching t also lands in probe.grad.
Tensor tap(const Tensor& t, const Tensor& probe) { return add(t, probe); }

// (n, D) -> (H, n, hs): head h takes columns [h hs, (h+1) hs). Views, no copy.
Tensor split_heads(const Tensor& x) { return x.reshape({x.size(0), H, hs}).permute({1, 0, 2}); }
// (H, n, hs) -> (n, D): the inverse, the heads' columns side by side (a copy: permute then reshape).
Tensor merge_heads(const Tensor& x) { return x.permute({1, 0, 2}).reshape({x.size(1), D}); }

// The forward pass, printing each step when `verbose`. Finite differences call it again and again
// with one leaf perturbed, silently. `hidden` (Tq, Tk), true = hidden key, or undefined: no mask.
Forward forward(const Leaves& in, const Tensor& target, const Tensor& hidden, bool verbose) {
  Forward f;
  const double scale = 1.0 / std::sqrt(double(hs));
  auto show = [&](const std::string& name, const Tensor& t, const std::string& comment) {
    if (verbose) print_tensor(name, t, comment), fmt::print("\n");
  };
  // Self-attention: keys and values from the tokens themselves. Cross-attention: from Y.
  const bool cross = in.Y.defined();
  const Tensor& source = cross ? in.Y : in.X;
  const std::string src = cross ? "Y" : "X", token = cross ? "token of Y" : "token";
  f.Q = tap(matmul(in.X, in.Wq), in.probe_Q);
  show("Q = X Wq", f.Q, "queries: what each token looks for");
  f.K = tap(matmul(source, in.Wk), in.probe_K);
  show("K = " + src + " Wk", f.K, "keys: what each " + token + " offers to be matched on");
  f.V = tap(matmul(source, in.Wv), in.probe_V);
  show("V = " + src + " Wv", f.V, "values: what each " + token + " passes on");
  f.Qh = split_heads(f.Q), f.Kh = split_heads(f.K), f.Vh = split_heads(f.V);
  show("Q_h = Q split into heads", f.Qh, "Q.reshape(Tq, H, hs).permute(1, 0, 2): a view");
  f.S = tap(matmul(f.Qh, f.Kh.mT()), in.probe_S);
  show("S = Q_h K_h^T", f.S, "raw scores (H, Tq, Tk), row i = query i, column j = key j");
  f.Z = tap(mul(f.S, scale), in.probe_Z);
  show(fmt::format("Z = S / sqrt(hs) = S * {:.6f}", scale), f.Z, "scaled scores");
  Tensor z = f.Z;
  if (hidden.defined()) {
    // -inf, not a large negative number: e^(-inf - m) is exactly 0, so P_ij = 0 exactly.
    z = masked_fill(f.Z, hidden, -std::numeric_limits<double>::infinity());
    show("Z masked", z, "Z with the hidden keys' scores set to -inf: what the softmax sees");
  }
  f.P = tap(softmax(z, -1), in.probe_P);
  show(hidden.defined() ? "P = softmax(Z masked) over the keys" : "P = softmax(Z) over the keys", f.P,
       hidden.defined() ? "attention weights, 0 on the hidden keys" : "attention weights");
  f.O = tap(matmul(f.P, f.Vh), in.probe_O);
  show("O_h = P V_h", f.O, "each head's output: a weighted mix of its values");
  f.C = tap(merge_heads(f.O), in.probe_C);
  show("C = concat of the heads", f.C, "O_h.permute(1, 0, 2).reshape(Tq, D)");
  f.Out = tap(matmul(f.C, in.Wo), in.probe_Out);
  show("Out = C Wo", f.Out, "the layer's output");
  f.L = mean(pow(sub(f.Out, target), 2.0));
  show("L = mean((Out - Target)^2)", f.L, "the loss");
  return f;
}

// dL/d(in.*which) by central differences: two forwards per element, recording off.
Tensor numeric_grad(const Leaves& in, Tensor Leaves::*which, const Tensor& target, const Tensor& hidden, double eps) {
  NoGradGuard no_grad;
  const Tensor x = in.*which;
  const std::vector<double> v = x.to_vector<double>();
  std::vector<double> g(v.size());
  Leaves p = in;
  for (size_t j = 0; j < v.size(); ++j) {
    auto loss_at = [&](double xj) {
      std::vector<double> w = v;
      w[j] = xj;
      p.*which = from_vector(w, x.shape());
      return forward(p, target, hidden, false).L.item<double>();
    };
    g[j] = (loss_at(v[j] + eps) - loss_at(v[j] - eps)) / (2 * eps);
  }
  return from_vector(g, x.shape());
}

// ---- the walkthrough ------------------------------------------------------------------------

struct Checker {
  int passed = 0, failed = 0;
  void verdict(const std::string& what, bool ok, const std::string& detail) {
    fmt::print("{} {}: {}\n", ok ? "PASS" : "FAIL", what, detail);
    (ok ? passed : failed) += 1;
  }
};

constexpr double kEps = 1e-6;          // finite-difference step
constexpr double kTolNumeric = 1e-8;   // |autograd - finite differences|: their error is ~1e-10
constexpr double kTolFormula = 1e-12;  // |autograd - formula|: the same arithmetic, rounding only

// The mask as the reader should see it: 1 where query i (row) sees key j (column), 0 where hidden.
void print_mask(const Case& c) {
  std::string why = c.causal ? "causal: key j > i is the future" : "";
  if (c.padding > 0) why += fmt::format("{}{} padding", why.empty() ? "" : "; ", keys(c.valid_keys(), c.Tk - 1));
  fmt::print("mask [{},{}]  1: query i (row) sees key j (column), 0: hidden ({})\n", c.Tq, c.Tk, why);
  for (int64_t i = 0; i < c.Tq; ++i) {
    std::string line = " ";
    for (int64_t j = 0; j < c.Tk; ++j) line += is_hidden(c, i, j) ? " 0" : " 1";
    fmt::print("{}\n", line);
  }
  fmt::print("\n");
}

// Backward step 2 of docs/math/attention.md: the softmax gradient dZ = P * (dP - D) needs one
// number per row, D_i = sum_j P_ij dP_ij. Since dP = dO_h V_h^T and O_h = P V_h, the same number is
// dO_i . O_i, a dot product of two rows of length hs that needs no P: the fused kernel uses it.
void check_row_identity(const Forward& f, const Tensor& dO, const Tensor& dP, Checker& checks) {
  NoGradGuard no_grad;
  const Tensor from_O = sum(mul(dO, f.O), {-1}), from_P = sum(mul(dP, f.P), {-1});  // (H, Tq)
  fmt::print("==== backward step 2: D_i = rowsum(dO_h * O_h) equals rowsum(dP * P), for every head and row\n");
  fmt::print("dZ = P * (dP - D) needs D_i = sum_j P_ij dP_ij; with dP = dO_h V_h^T and O_h = P V_h that is\n");
  fmt::print("sum_c dO_ic O_ic, one dot product of length hs and no P (the fused kernel never stores P).\n\n");
  fmt::print("{:>4} {:>4}  {:>22}  {:>22}  {:>9}\n", "head", "row", "D = rowsum(dO * O)", "rowsum(dP * P)", "|diff|");
  const std::vector<double> a = from_O.to_vector<double>(), b = from_P.to_vector<double>();
  const int64_t rows = from_O.size(1);
  for (int64_t h = 0; h < from_O.size(0); ++h)
    for (int64_t i = 0; i < rows; ++i) {
      const size_t k = size_t(h * rows + i);
      fmt::print("{:>4} {:>4}  {:>22.15e}  {:>22.15e}  {:>9.1e}\n", h, i, a[k], b[k], std::abs(a[k] - b[k]));
    }
  const double e = max_abs_diff(from_O, from_P);
  checks.verdict("D = rowsum(dO * O) equals rowsum(dP * P)", e <= kTolFormula,
                 fmt::format("max |difference| = {:.1e} over {} heads x {} rows", e, from_O.size(0), rows));
  fmt::print("\n");
}

// Decoding (--kv-cache): the same layer, one token at a time. At step t only token t is new: its
// q, k, v are computed (one row each), k and v appended to the cache, and q attends over every
// cached key. No mask is needed: the cache holds tokens 0..t only, the future does not exist yet
// (causal = true would hide nothing: the op aligns it at the bottom right, the one query is the
// last position). Padding still hides the keys past Tk - N, once they are in the cache.
void decode_with_cache(const Leaves& in, const Case& c, const Forward& full, Checker& checks) {
  NoGradGuard no_grad;
  fmt::print("==== decoding with a KV cache (nn::KVCache): the same layer, one token at a time\n");
  fmt::print("Step t computes q, k, v of token t alone, appends k and v to the cache, and lets q attend\n");
  fmt::print("over the cached keys 0..t: the earlier tokens' k and v are never recomputed.\n\n");
  nn::KVCache cache;
  std::vector<Tensor> rows;
  for (int64_t t = 0; t < c.Tq; ++t) {
    const Tensor x_t = in.X.narrow(0, t, 1);                        // (1, D): the new token
    const Tensor q = split_heads(matmul(x_t, in.Wq)).unsqueeze(0);  // (B = 1, H, 1, hs)
    const Tensor k = split_heads(matmul(x_t, in.Wk)).unsqueeze(0);
    const Tensor v = split_heads(matmul(x_t, in.Wv)).unsqueeze(0);
    const auto [K, V] = cache.append(k, v);  // (1, H, t + 1, hs): every token so far
    SdpaOptions o;
    if (c.padding > 0) o.key_padding_lengths = from_vector<int64_t>({std::min(c.valid_keys(), t + 1)}, {1});
    const Tensor o_t = scaled_dot_product_attention(q, K, V, o).out.squeeze(0);  // (H, 1, hs)
    const Tensor out_t = matmul(merge_heads(o_t), in.Wo);                        // (1, D)
    const bool padded = c.padding > 0 && t + 1 > c.valid_keys();
    fmt::print("step {}: token {} in, cache length {}: K, V {}{}\n", t, t, cache.length(), K.shape(),
               padded ? fmt::format(", {} hidden: padding", keys(c.valid_keys(), t)) : "");
    print_tensor(fmt::format("K cache after step {}", t), K.squeeze(0), "one row per cached token, per head");
    print_tensor(fmt::format("Out row {}", t), out_t, "");
    fmt::print("\n");
    rows.push_back(out_t);
  }
  const Tensor decoded = cat(rows, 0);
  print_tensor("Out, decoded token by token", decoded, "the rows above, stacked");
  const double e = max_abs_diff(decoded, full.Out);
  checks.verdict("KV-cache decoding equals the full causal pass", e <= kTolFormula,
                 fmt::format("max |decoded - full| = {:.1e} over Out {}", e, decoded.shape()));
}

int walkthrough(const Case& c, uint64_t seed) {
  Generator gen(seed);
  const double w_std = 1.0 / std::sqrt(double(D));  // so that Q, K, V have about unit variance
  Leaves in;
  in.X = leaf(randn({c.Tq, D}, DType::f64, &gen));
  in.Wq = leaf(randn({D, D}, DType::f64, &gen, 0, w_std));
  in.Wk = leaf(randn({D, D}, DType::f64, &gen, 0, w_std));
  in.Wv = leaf(randn({D, D}, DType::f64, &gen, 0, w_std));
  in.Wo = leaf(randn({D, D}, DType::f64, &gen, 0, w_std));
  const Tensor target = randn({c.Tq, D}, DType::f64, &gen);
  if (c.cross) in.Y = leaf(randn({c.Tk, D}, DType::f64, &gen));  // drawn last: the rest as without --cross
  in.probe_Q = leaf(zeros({c.Tq, D}, DType::f64));
  in.probe_K = leaf(zeros({c.Tk, D}, DType::f64));
  in.probe_V = leaf(zeros({c.Tk, D}, DType::f64));
  in.probe_S = leaf(zeros({H, c.Tq, c.Tk}, DType::f64));
  in.probe_Z = leaf(zeros({H, c.Tq, c.Tk}, DType::f64));
  in.probe_P = leaf(zeros({H, c.Tq, c.Tk}, DType::f64));
  in.probe_O = leaf(zeros({H, c.Tq, hs}, DType::f64));
  in.probe_C = leaf(zeros({c.Tq, D}, DType::f64));
  in.probe_Out = leaf(zeros({c.Tq, D}, DType::f64));
  const Tensor hidden = hidden_mask(c);
  Checker checks;

  fmt::print("==== forward: {}, d_model = {}, {} heads of size hs = d_k = {} (f64, seed {})\n\n", describe(c), D, H,
             hs, seed);
  if (c.cross)
    fmt::print("shapes: X (Tq, D) = [{},{}] gives the queries, Y (Tk, D) = [{},{}] the keys and values;\n"
               "S, Z, P are (H, Tq, Tk) = [{},{},{}]: one row per query, one column per key; Out is (Tq, D).\n\n",
               c.Tq, D, c.Tk, D, H, c.Tq, c.Tk);
  print_tensor("X", in.X, "the input: one row per token");
  if (c.cross) print_tensor("Y", in.Y, "the second sequence: keys and values come from it");
  print_tensor("Wq", in.Wq, "N(0, 1/d_model), as are Wk, Wv, Wo");
  print_tensor("Target", target, "the target of the loss");
  fmt::print("\n");
  if (hidden.defined()) print_mask(c);
  const Forward f = forward(in, target, hidden, true);
  {
    NoGradGuard no_grad;
    const double worst = max(abs(sub(sum(f.P, {-1}), 1.0))).item<double>();
    checks.verdict("softmax rows sum to 1", worst <= kTolFormula, fmt::format("max |row sum - 1| = {:.1e}", worst));
    if (hidden.defined()) {
      const double leak = max(abs(where(hidden, f.P, zeros({}, DType::f64)))).item<double>();
      checks.verdict("hidden keys get weight 0", leak == 0,
                     fmt::format("max P_ij over the hidden (i, j) = {:.1e}", leak));
    }
  }

  fmt::print("\n==== backward: L.backward(), then each gradient three ways\n");
  fmt::print("autograd (the tape), the formula derived by hand (from the saved forward values), and\n");
  fmt::print("central finite differences (eps {:g}); PASS when |autograd - numeric| <= {:g} and\n", kEps, kTolNumeric);
  fmt::print("|autograd - formula| <= {:g} everywhere.\n\n", kTolFormula);
  f.L.backward();

  // The formulas, read off the forward backwards (the tape does the same, op by op). A mask adds
  // nothing: a hidden key has P_ij = 0, so its dZ_ij = P_ij (...) = 0 and nothing flows through it.
  Tensor dOut, dWo, dC, dO, dP, dV, dZ, dS, dQ, dK, dWq, dWk, dWv, dX, dY;
  {
    NoGradGuard no_grad;
    const double scale = 1.0 / std::sqrt(double(hs));
    const Tensor& source = c.cross ? in.Y : in.X;
    dOut = mul(sub(f.Out, target), 2.0 / double(c.Tq * D));  // L = sum (Out - Target)^2 / (Tq D)
    dWo = matmul(f.C.mT(), dOut);                            // Out = C Wo
    dC = matmul(dOut, in.Wo.mT());
    dO = split_heads(dC);                                    // merge_heads only moves elements
    dP = matmul(dO, f.Vh.mT());                              // O_h = P V_h
    const Tensor dVh = matmul(f.P.mT(), dO);
    dV = merge_heads(dVh);
    dZ = mul(f.P, sub(dP, sum(mul(dP, f.P), {-1}, true)));  // P = softmax(Z)
    dS = mul(dZ, scale);                                    // Z = S scale
    dQ = merge_heads(matmul(dS, f.Kh));                     // S = Q_h K_h^T
    dK = merge_heads(matmul(dS.mT(), f.Qh));
    dWq = matmul(in.X.mT(), dQ);                            // Q = X Wq, K = X Wk (or Y Wk), ...
    dWk = matmul(source.mT(), dK);
    dWv = matmul(source.mT(), dV);
    const Tensor dQX = matmul(dQ, in.Wq.mT()), dKV = add(matmul(dK, in.Wk.mT()), matmul(dV, in.Wv.mT()));
    if (c.cross)
      dX = dQX, dY = dKV;  // X feeds Q only, Y feeds K and V
    else
      dX = add(dQX, dKV);  // X feeds Q, K and V: the three gradients add
  }

  struct Grad {
    const char* name;
    Tensor Leaves::*leaf;  // the leaf (or probe) whose .grad is this gradient
    Tensor formula;
    std::string derivation;
  };
  const std::string masked = c.masked() ? "; 0 where hidden (P_ij = 0)" : "";
  const std::string src = c.cross ? "Y" : "X";
  std::vector<Grad> grads = {
      {"dOut", &Leaves::probe_Out, dOut, "L = mean((Out - Target)^2)  =>  dOut = 2 (Out - Target) / (Tq D)"},
      {"dWo", &Leaves::Wo, dWo, "Out = C Wo  =>  dWo = C^T dOut"},
      {"dC", &Leaves::probe_C, dC, "Out = C Wo  =>  dC = dOut Wo^T"},
      {"dO_h", &Leaves::probe_O, dO, "C = concat_h O_h  =>  dO_h = dC split into heads"},
      {"dP (dWeights)", &Leaves::probe_P, dP, "O_h = P V_h  =>  dP = dO_h V_h^T"},
      {"dV", &Leaves::probe_V, dV, "O_h = P V_h  =>  dV_h = P^T dO_h, heads merged"},
      {"dZ", &Leaves::probe_Z, dZ, "P = softmax(Z)  =>  dZ = P * (dP - D), D = rowsum(dP * P)" + masked},
      {"dS (dScores)", &Leaves::probe_S, dS, "Z = S / sqrt(hs)  =>  dS = dZ / sqrt(hs)"},
      {"dQ", &Leaves::probe_Q, dQ, "S = Q_h K_h^T  =>  dQ_h = dS K_h, heads merged"},
      {"dK", &Leaves::probe_K, dK, "S = Q_h K_h^T  =>  dK_h = dS^T Q_h, heads merged"},
      {"dWq", &Leaves::Wq, dWq, "Q = X Wq  =>  dWq = X^T dQ"},
      {"dWk", &Leaves::Wk, dWk, "K = " + src + " Wk  =>  dWk = " + src + "^T dK"},
      {"dWv", &Leaves::Wv, dWv, "V = " + src + " Wv  =>  dWv = " + src + "^T dV"},
  };
  if (c.cross) {
    grads.push_back({"dX", &Leaves::X, dX, "X feeds Q only  =>  dX = dQ Wq^T"});
    grads.push_back({"dY", &Leaves::Y, dY, "Y feeds K and V: the two gradients add  =>  dY = dK Wk^T + dV Wv^T"});
  } else {
    grads.push_back(
        {"dX", &Leaves::X, dX, "X feeds Q, K and V: the three gradients add  =>  dX = dQ Wq^T + dK Wk^T + dV Wv^T"});
  }
  for (const Grad& g : grads) {
    const Tensor autograd = (in.*g.leaf).grad();
    const Tensor numeric = numeric_grad(in, g.leaf, target, hidden, kEps);
    print_tensor(g.name, autograd, g.derivation);
    const double e_num = max_abs_diff(autograd, numeric), e_formula = max_abs_diff(autograd, g.formula);
    checks.verdict(g.name, e_num <= kTolNumeric && e_formula <= kTolFormula,
                  fmt::format("max |autograd - numeric| = {:.1e}, max |autograd - formula| = {:.1e}", e_num, e_formula));
    fmt::print("\n");
  }
  check_row_identity(f, in.probe_O.grad(), in.probe_P.grad(), checks);

  // The fused kernel: the same attention in one op (online softmax, P never stored), told the
  // case through SdpaOptions rather than given our mask.
  const SdpaOptions options = sdpa_options(c);
  std::string told;
  if (options.causal) told += "causal = true";
  if (options.key_padding_lengths.defined())
    told += fmt::format("{}key_padding_lengths = [{}]", told.empty() ? "" : ", ", c.valid_keys());
  fmt::print("==== the fused op: ag::scaled_dot_product_attention(Q_h, K_h, V_h{})\n",
             told.empty() ? "" : ", {" + told + "}");
  Leaves fused = in;
  for (const Named& w : inputs_and_weights(c)) fused.*w.leaf = leaf(in.*w.leaf);
  const Tensor& source = c.cross ? fused.Y : fused.X;
  const Tensor Qh = split_heads(matmul(fused.X, fused.Wq)).unsqueeze(0);  // (B = 1, H, Tq, hs)
  const Tensor Kh = split_heads(matmul(source, fused.Wk)).unsqueeze(0);   // (B = 1, H, Tk, hs)
  const Tensor Vh = split_heads(matmul(source, fused.Wv)).unsqueeze(0);
  const Tensor O = scaled_dot_product_attention(Qh, Kh, Vh, options).out.squeeze(0);
  const Tensor L = mean(pow(sub(matmul(merge_heads(O), fused.Wo), target), 2.0));
  L.backward();
  const double e_out = max_abs_diff(O, f.O);
  checks.verdict("fused attention output", e_out <= kTolFormula,
                fmt::format("max |sdpa - composed| = {:.1e} over O_h {}", e_out, O.shape()));
  double e_grad = 0;
  std::string names;
  for (const Named& w : inputs_and_weights(c)) {
    e_grad = std::max(e_grad, max_abs_diff((fused.*w.leaf).grad(), (in.*w.leaf).grad()));
    names += fmt::format("{}d{}", names.empty() ? "" : ", ", w.name);
  }
  checks.verdict("fused attention gradients", e_grad <= kTolFormula,
                fmt::format("max |d(sdpa) - d(composed)| = {:.1e} over {}", e_grad, names));

  if (c.kv_cache) {
    fmt::print("\n");
    decode_with_cache(in, c, f, checks);
  }

  fmt::print("\n{} checks passed, {} failed\n", checks.passed, checks.failed);
  return checks.failed == 0 ? 0 : 1;
}

// ---- the scaling experiment ----------------------------------------------------------------

constexpr int64_t kQueries = 64, kKeys = 64, kDv = 64;  // d_v fixed: the gradient reaching the scores,
constexpr int kSeeds = 5;                               // dP = G V^T, has one scale for every d_k

struct ScalingRow {
  int64_t dk = 0;
  double score_std = 0;  // of the raw scores q . k: about sqrt(d_k)
  // [0] scaled by 1/sqrt(d_k), [1] unscaled; means over the seeds
  double max_weight[2] = {0, 0};              // mean over queries of max_j P_ij
  double dq_norm[2] = {0, 0}, dk_norm[2] = {0, 0};  // Frobenius norms of dL/dq, dL/dk
  double dq_median[2] = {0, 0};               // median over the queries (all seeds) of |dL/dq_i|
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One d_k: q (64, d_k), k (64, d_k), v (64, d_v) ~ N(0, 1) and an upstream gradient G (64, d_v)
// ~ N(0, 1), kSeeds draws; the same draws with and without the scale.
ScalingRow scaling_row(int64_t dk, uint64_t seed) {
  ScalingRow row;
  row.dk = dk;
  std::vector<double> dq_rows[2];
  for (int s = 0; s < kSeeds; ++s) {
    Generator gen(seed * 7919 + uint64_t(dk) * 31 + uint64_t(s));
    const Tensor q0 = randn({kQueries, dk}, DType::f64, &gen), k0 = randn({kKeys, dk}, DType::f64, &gen);
    const Tensor v = randn({kKeys, kDv}, DType::f64, &gen), G = randn({kQueries, kDv}, DType::f64, &gen);
    {
      NoGradGuard no_grad;
      row.score_std += std::sqrt(var(matmul(q0, k0.mT())).item<double>()) / kSeeds;
    }
    for (int i = 0; i < 2; ++i) {
      const double scale = i == 0 ? 1.0 / std::sqrt(double(dk)) : 1.0;
      const Tensor q = leaf(q0), k = leaf(k0);
      const Tensor P = softmax(mul(matmul(q, k.mT()), scale), -1);
      const Tensor out = matmul(P, v);
      out.backward(G);  // dL/dout = G, as for L = sum(G * out)
      NoGradGuard no_grad;
      row.max_weight[i] += mean(max(P, {-1})).item<double>() / kSeeds;
      row.dq_norm[i] += std::sqrt(sum(pow(q.grad(), 2.0)).item<double>()) / kSeeds;
      row.dk_norm[i] += std::sqrt(sum(pow(k.grad(), 2.0)).item<double>()) / kSeeds;
      for (double r : sqrt(sum(pow(q.grad(), 2.0), {-1})).to_vector<double>()) dq_rows[i].push_back(r);
    }
  }
  for (int i = 0; i < 2; ++i) row.dq_median[i] = median(dq_rows[i]);
  return row;
}

void scaling_experiment(const std::string& out_dir, uint64_t seed) {
  fmt::print("\n==== why divide by sqrt(d_k): q, k ~ N(0, 1) of {} queries and {} keys, mean of {} seeds\n", kQueries,
             kKeys, kSeeds);
  fmt::print("P = softmax(s q k^T), out = P v (d_v = {}), backward from a random dL/dout; s = 1/sqrt(d_k) (scaled)\n",
             kDv);
  fmt::print("or 1 (unscaled). max weight: mean over queries of max_j P_ij (1/{} = uniform, 1 = one-hot);\n", kKeys);
  fmt::print("|dQ|, |dK|: norms of the whole gradients; |dQ_i| median: the gradient of a typical query.\n\n");
  fmt::print("{:>5} {:>8}  {:>15}  {:>19}  {:>19}  {:>19}\n", "", "", "max weight", "|dQ|", "|dK|", "|dQ_i| median");
  fmt::print("{:>5} {:>8}  {:>7} {:>7}  {:>9} {:>9}  {:>9} {:>9}  {:>9} {:>9}\n", "d_k", "std(q.k)", "scaled",
             "unscal", "scaled", "unscaled", "scaled", "unscaled", "scaled", "unscaled");
  std::vector<ScalingRow> rows;
  for (int64_t dk = 16; dk <= 1024; dk *= 2) {
    const ScalingRow r = scaling_row(dk, seed);
    fmt::print("{:>5} {:>8.2f}  {:>7.4f} {:>7.4f}  {:>9.3e} {:>9.3e}  {:>9.3e} {:>9.3e}  {:>9.3e} {:>9.3e}\n", r.dk,
               r.score_std, r.max_weight[0], r.max_weight[1], r.dq_norm[0], r.dq_norm[1], r.dk_norm[0], r.dk_norm[1],
               r.dq_median[0], r.dq_median[1]);
    rows.push_back(r);
  }
  fmt::print("\nScaled, the scores keep unit variance whatever d_k: the weights stay spread out and every query\n");
  fmt::print("gets a gradient of about the same size. Unscaled, the scores' spread grows as sqrt(d_k) and the\n");
  fmt::print("softmax turns one-hot. A one-hot row has a zero Jacobian (diag(P) - P P^T), so most queries get\n");
  fmt::print("almost no gradient (the median |dQ_i| collapses), while the few rows whose two best scores are\n");
  fmt::print("close get very large ones (the whole |dQ| and |dK| grow): learning stalls for most positions\n");
  fmt::print("and is erratic for the rest.\n");

  // The plot: x = log2(d_k) (the chart has no log x axis), y as printed.
  apps::LineChart weights, norms, typical;
  weights.title = "Mean max softmax weight (1 = one-hot)";
  weights.y_label = "max_j P_ij, mean over queries";
  norms.title = "Gradient norm reaching Q and K";
  norms.y_label = "Frobenius norm";
  typical.title = "Gradient of a typical query";
  typical.y_label = "median over queries of |dQ_i|";
  norms.log_y = typical.log_y = true;
  weights.x_label = norms.x_label = typical.x_label = "log2 d_k";
  for (int i = 0; i < 2; ++i) {
    const std::string tag = i == 0 ? "scaled" : "unscaled";
    apps::Series w, q, k, m;
    w.name = m.name = i == 0 ? "scaled 1/sqrt(d_k)" : "unscaled";
    q.name = "|dQ| " + tag;
    k.name = "|dK| " + tag;
    for (const ScalingRow& r : rows) {
      const double x = std::log2(double(r.dk));
      w.x.push_back(x), w.y.push_back(r.max_weight[i]);
      q.x.push_back(x), q.y.push_back(r.dq_norm[i]);
      k.x.push_back(x), k.y.push_back(r.dk_norm[i]);
      m.x.push_back(x), m.y.push_back(r.dq_median[i]);
    }
    weights.series.push_back(w);
    norms.series.push_back(q);
    norms.series.push_back(k);
    typical.series.push_back(m);
  }
  std::filesystem::create_directories(out_dir);
  const std::string path = out_dir + "/scaling.svg";
  apps::write_file_atomic(path, apps::svg_line_charts({weights, norms, typical}, 3));
  fmt::print("plot: {}\n", path);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attograd walkthrough: a tiny attention layer step by step (self-attention, or causal, padded, "
               "cross-attention, KV-cache decoding), every gradient checked, and the experiment behind the "
               "1/sqrt(d_k) scaling"};
  std::string out_dir = "runs/walkthrough";
  uint64_t seed = 0;
  bool no_experiment = false;
  Case c;
  app.add_option("--out", out_dir, "where scaling.svg goes")->capture_default_str();
  app.add_option("--seed", seed, "random seed of the weights, inputs and experiment")->capture_default_str();
  app.add_flag("--no-experiment", no_experiment, "only the walkthrough, not the scaling experiment");
  app.add_option("--precision", digits, "decimals printed per value")->check(CLI::Range(1, 15))->capture_default_str();
  app.add_flag("--causal", c.causal,
               "causal mask: query i sees keys j <= i; the later keys' scores are set to -inf (not with --cross)");
  app.add_option("--padding", c.padding,
                 fmt::format("the last N keys are padding, hidden from every query (key_padding_lengths = Tk - N); "
                             "N in [0, Tk - 1], Tk = {} ({} with --cross)",
                             T, kCrossKeys))
      ->type_name("N")
      ->capture_default_str();
  app.add_flag("--cross", c.cross,
               fmt::format("cross-attention: queries from X ({} tokens), keys and values from a second sequence Y "
                           "({} tokens); checks dX and dY",
                           T, kCrossKeys));
  app.add_flag("--kv-cache", c.kv_cache,
               "decoding: also run the layer token by token with an nn::KVCache and compare with the full causal "
               "pass (implies --causal; not with --cross)");
  if (const int rc = apps::parse_command_line(app, argc, argv, "walkthrough"); rc >= 0) return rc;

  try {  // the combinations, before any work
    apps::usage_check(!(c.cross && c.kv_cache),
                      "--cross with --kv-cache: the KV cache here grows with the decoded sequence's own keys "
                      "(self-attention); run them apart");
    apps::usage_check(!(c.cross && c.causal),
                      "--cross with --causal: a causal mask orders the positions of one sequence, and in "
                      "cross-attention the keys are another one (Y)");
    c.causal = c.causal || c.kv_cache;  // decoding is causal: the full pass it is compared with too
    c.Tk = c.cross ? kCrossKeys : T;
    apps::usage_check(c.padding >= 0 && c.padding <= c.Tk - 1,
                      "--padding {} is outside [0, {}]: of the Tk = {} keys at least one must stay visible",
                      c.padding, c.Tk - 1, c.Tk);
  } catch (const apps::UsageError& e) {
    apps::print_usage_error("walkthrough", e.what());
    return apps::kExitUsage;
  }

  // One thread: every tensor here is tiny, and waking a team of OpenMP threads for each of the
  // thousands of small ops (finite differences run the forward ~1200 times) costs more than the
  // work itself.
  set_num_threads(1);
  try {
    const int rc = walkthrough(c, seed);
    if (!no_experiment) scaling_experiment(out_dir, seed);
    return rc;
  } catch (const Error& e) {
    apps::print_error("walkthrough", e.what());
    return apps::kExitError;
  } catch (const std::filesystem::filesystem_error& e) {
    apps::print_error("walkthrough", e.what());
    return apps::kExitError;
  }
}
