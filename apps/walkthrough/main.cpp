// The walkthrough: one self-attention layer, small enough to print every number, computed step by
// step with attograd's ops; then its backward pass, each gradient checked on the spot; then the
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
//   L   = mean((Out - Y)^2)       a scalar loss against a fixed random target Y (T, D)
//
// Part 2, backward: L.backward() fills the gradient of every leaf (X and the weights). To see the
// gradients of the intermediates too (dOut, dP, dS, dQ, ...), each one is "tapped": the forward adds
// a zero tensor `probe` that requires grad, t + probe. That changes no value, and since addition
// passes its gradient through unchanged, probe.grad is exactly dL/dt. Each gradient is then printed
// and compared with (a) the formula derived by hand (docs/math/attention.md, multihead.md,
// linear.md, softmax.md), computed from the saved forward values, and (b) central finite
// differences, dL/dx_j ~ (L(x + eps e_j) - L(x - eps e_j)) / (2 eps), which need nothing but the
// forward. Every check prints PASS or FAIL; the program exits 1 when one fails.
// Finally ag::scaled_dot_product_attention, the fused kernel, must give the same output and the
// same gradients as the composed ops.
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
#include <string>
#include <vector>

#include <fmt/core.h>

#include "apps/common/plot.h"
#include "apps/common/run.h"
#include "attograd.h"

using namespace ag;

namespace {

constexpr int64_t T = 4, D = 8, H = 2, hs = D / H;

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

// What the loss depends on: the input, the weights, and one probe per intermediate (see the top
// of the file). All are f64 leaves that require grad; the probes hold zeros.
struct Leaves {
  Tensor X, Wq, Wk, Wv, Wo;
  Tensor probe_Q, probe_K, probe_V, probe_S, probe_Z, probe_P, probe_O, probe_C, probe_Out;
};

// Every intermediate of one forward pass.
struct Forward {
  Tensor Q, K, V, Qh, Kh, Vh, S, Z, P, O, C, Out, L;
};

Tensor leaf(const Tensor& values) { return values.detach().set_requires_grad(true); }

// t + probe: the same values; the gradient reaching t also lands in probe.grad.
Tensor tap(const Tensor& t, const Tensor& probe) { return add(t, probe); }

// (T, D) -> (H, T, hs): head h takes columns [h hs, (h+1) hs). Views, no copy.
Tensor split_heads(const Tensor& x) { return x.reshape({T, H, hs}).permute({1, 0, 2}); }
// (H, T, hs) -> (T, D): the inverse, the heads' columns side by side (a copy: permute then reshape).
Tensor merge_heads(const Tensor& x) { return x.permute({1, 0, 2}).reshape({T, D}); }

// The forward pass, printing each step when `verbose`. Finite differences call it again and again
// with one leaf perturbed, silently.
Forward forward(const Leaves& in, const Tensor& Y, bool verbose) {
  Forward f;
  const double scale = 1.0 / std::sqrt(double(hs));
  auto show = [&](const std::string& name, const Tensor& t, const std::string& comment) {
    if (verbose) print_tensor(name, t, comment), fmt::print("\n");
  };
  f.Q = tap(matmul(in.X, in.Wq), in.probe_Q);
  show("Q = X Wq", f.Q, "queries: what each token looks for");
  f.K = tap(matmul(in.X, in.Wk), in.probe_K);
  show("K = X Wk", f.K, "keys: what each token offers to be matched on");
  f.V = tap(matmul(in.X, in.Wv), in.probe_V);
  show("V = X Wv", f.V, "values: what each token passes on");
  f.Qh = split_heads(f.Q), f.Kh = split_heads(f.K), f.Vh = split_heads(f.V);
  show("Q_h = Q split into heads", f.Qh, "Q.reshape(T, H, hs).permute(1, 0, 2): a view");
  f.S = tap(matmul(f.Qh, f.Kh.mT()), in.probe_S);
  show("S = Q_h K_h^T", f.S, "raw scores, row i = query i, column j = key j");
  f.Z = tap(mul(f.S, scale), in.probe_Z);
  show(fmt::format("Z = S / sqrt(hs) = S * {:.6f}", scale), f.Z, "scaled scores");
  f.P = tap(softmax(f.Z, -1), in.probe_P);
  show("P = softmax(Z) over the keys", f.P, "attention weights");
  f.O = tap(matmul(f.P, f.Vh), in.probe_O);
  show("O_h = P V_h", f.O, "each head's output: a weighted mix of its values");
  f.C = tap(merge_heads(f.O), in.probe_C);
  show("C = concat of the heads", f.C, "O_h.permute(1, 0, 2).reshape(T, D)");
  f.Out = tap(matmul(f.C, in.Wo), in.probe_Out);
  show("Out = C Wo", f.Out, "the layer's output");
  f.L = mean(pow(sub(f.Out, Y), 2.0));
  show("L = mean((Out - Y)^2)", f.L, "the loss");
  return f;
}

// dL/d(in.*which) by central differences: two forwards per element, recording off.
Tensor numeric_grad(const Leaves& in, Tensor Leaves::*which, const Tensor& Y, double eps) {
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
      return forward(p, Y, false).L.item<double>();
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

int walkthrough(uint64_t seed) {
  Generator gen(seed);
  const double w_std = 1.0 / std::sqrt(double(D));  // so that Q, K, V have about unit variance
  Leaves in;
  in.X = leaf(randn({T, D}, DType::f64, &gen));
  in.Wq = leaf(randn({D, D}, DType::f64, &gen, 0, w_std));
  in.Wk = leaf(randn({D, D}, DType::f64, &gen, 0, w_std));
  in.Wv = leaf(randn({D, D}, DType::f64, &gen, 0, w_std));
  in.Wo = leaf(randn({D, D}, DType::f64, &gen, 0, w_std));
  const Tensor Y = randn({T, D}, DType::f64, &gen);
  in.probe_Q = leaf(zeros({T, D}, DType::f64));
  in.probe_K = leaf(zeros({T, D}, DType::f64));
  in.probe_V = leaf(zeros({T, D}, DType::f64));
  in.probe_S = leaf(zeros({H, T, T}, DType::f64));
  in.probe_Z = leaf(zeros({H, T, T}, DType::f64));
  in.probe_P = leaf(zeros({H, T, T}, DType::f64));
  in.probe_O = leaf(zeros({H, T, hs}, DType::f64));
  in.probe_C = leaf(zeros({T, D}, DType::f64));
  in.probe_Out = leaf(zeros({T, D}, DType::f64));
  Checker checks;

  fmt::print("==== forward: self-attention, T = {} tokens, d_model = {}, {} heads of size hs = d_k = {} (f64, seed {})\n\n",
             T, D, H, hs, seed);
  print_tensor("X", in.X, "the input: one row per token");
  print_tensor("Wq", in.Wq, "N(0, 1/d_model), as are Wk, Wv, Wo");
  print_tensor("Y", Y, "the target of the loss");
  fmt::print("\n");
  const Forward f = forward(in, Y, true);
  {
    NoGradGuard no_grad;
    const double worst = max(abs(sub(sum(f.P, {-1}), 1.0))).item<double>();
    checks.verdict("softmax rows sum to 1", worst <= kTolFormula, fmt::format("max |row sum - 1| = {:.1e}", worst));
  }

  fmt::print("\n==== backward: L.backward(), then each gradient three ways\n");
  fmt::print("autograd (the tape), the formula derived by hand (from the saved forward values), and\n");
  fmt::print("central finite differences (eps {:g}); PASS when |autograd - numeric| <= {:g} and\n", kEps, kTolNumeric);
  fmt::print("|autograd - formula| <= {:g} everywhere.\n\n", kTolFormula);
  f.L.backward();

  // The formulas, read off the forward backwards (the tape does the same, op by op).
  Tensor dOut, dWo, dC, dO, dP, dV, dZ, dS, dQ, dK, dWq, dWk, dWv, dX;
  {
    NoGradGuard no_grad;
    const double scale = 1.0 / std::sqrt(double(hs));
    dOut = mul(sub(f.Out, Y), 2.0 / double(T * D));  // L = sum (Out - Y)^2 / (T D)
    dWo = matmul(f.C.mT(), dOut);                     // Out = C Wo
    dC = matmul(dOut, in.Wo.mT());
    dO = split_heads(dC);                             // merge_heads only moves elements
    dP = matmul(dO, f.Vh.mT());                       // O_h = P V_h
    const Tensor dVh = matmul(f.P.mT(), dO);
    dV = merge_heads(dVh);
    dZ = mul(f.P, sub(dP, sum(mul(dP, f.P), {-1}, true)));  // P = softmax(Z)
    dS = mul(dZ, scale);                                    // Z = S scale
    dQ = merge_heads(matmul(dS, f.Kh));                     // S = Q_h K_h^T
    dK = merge_heads(matmul(dS.mT(), f.Qh));
    dWq = matmul(in.X.mT(), dQ);                            // Q = X Wq, and so on
    dWk = matmul(in.X.mT(), dK);
    dWv = matmul(in.X.mT(), dV);
    dX = add(add(matmul(dQ, in.Wq.mT()), matmul(dK, in.Wk.mT())), matmul(dV, in.Wv.mT()));  // X used 3 times
  }

  struct Grad {
    const char* name;
    Tensor Leaves::*leaf;  // the leaf (or probe) whose .grad is this gradient
    Tensor formula;
    const char* derivation;
  };
  const std::vector<Grad> grads = {
      {"dOut", &Leaves::probe_Out, dOut, "L = mean((Out - Y)^2)  =>  dOut = 2 (Out - Y) / (T D)"},
      {"dWo", &Leaves::Wo, dWo, "Out = C Wo  =>  dWo = C^T dOut"},
      {"dC", &Leaves::probe_C, dC, "Out = C Wo  =>  dC = dOut Wo^T"},
      {"dO_h", &Leaves::probe_O, dO, "C = concat_h O_h  =>  dO_h = dC split into heads"},
      {"dP (dWeights)", &Leaves::probe_P, dP, "O_h = P V_h  =>  dP = dO_h V_h^T"},
      {"dV", &Leaves::probe_V, dV, "O_h = P V_h  =>  dV_h = P^T dO_h, heads merged"},
      {"dZ", &Leaves::probe_Z, dZ, "P = softmax(Z)  =>  dZ = P * (dP - rowsum(dP * P))"},
      {"dS (dScores)", &Leaves::probe_S, dS, "Z = S / sqrt(hs)  =>  dS = dZ / sqrt(hs)"},
      {"dQ", &Leaves::probe_Q, dQ, "S = Q_h K_h^T  =>  dQ_h = dS K_h, heads merged"},
      {"dK", &Leaves::probe_K, dK, "S = Q_h K_h^T  =>  dK_h = dS^T Q_h, heads merged"},
      {"dWq", &Leaves::Wq, dWq, "Q = X Wq  =>  dWq = X^T dQ"},
      {"dWk", &Leaves::Wk, dWk, "K = X Wk  =>  dWk = X^T dK"},
      {"dWv", &Leaves::Wv, dWv, "V = X Wv  =>  dWv = X^T dV"},
      {"dX", &Leaves::X, dX, "X feeds Q, K and V: the three gradients add  =>  dX = dQ Wq^T + dK Wk^T + dV Wv^T"},
  };
  for (const Grad& g : grads) {
    const Tensor autograd = (in.*g.leaf).grad();
    const Tensor numeric = numeric_grad(in, g.leaf, Y, kEps);
    print_tensor(g.name, autograd, g.derivation);
    const double e_num = max_abs_diff(autograd, numeric), e_formula = max_abs_diff(autograd, g.formula);
    checks.verdict(g.name, e_num <= kTolNumeric && e_formula <= kTolFormula,
                  fmt::format("max |autograd - numeric| = {:.1e}, max |autograd - formula| = {:.1e}", e_num, e_formula));
    fmt::print("\n");
  }

  // The fused kernel: the same attention in one op (online softmax, P never stored).
  fmt::print("==== the fused op: ag::scaled_dot_product_attention(Q_h, K_h, V_h)\n");
  Leaves fused = in;
  for (Tensor Leaves::*w : {&Leaves::X, &Leaves::Wq, &Leaves::Wk, &Leaves::Wv, &Leaves::Wo})
    fused.*w = leaf(in.*w);
  const Tensor Qh = split_heads(matmul(fused.X, fused.Wq)).unsqueeze(0);  // (B = 1, H, T, hs)
  const Tensor Kh = split_heads(matmul(fused.X, fused.Wk)).unsqueeze(0);
  const Tensor Vh = split_heads(matmul(fused.X, fused.Wv)).unsqueeze(0);
  const Tensor O = scaled_dot_product_attention(Qh, Kh, Vh).out.squeeze(0);
  const Tensor L = mean(pow(sub(matmul(merge_heads(O), fused.Wo), Y), 2.0));
  L.backward();
  const double e_out = max_abs_diff(O, f.O);
  checks.verdict("fused attention output", e_out <= kTolFormula,
                fmt::format("max |sdpa - composed| = {:.1e} over O_h {}", e_out, O.shape()));
  double e_grad = 0;
  for (Tensor Leaves::*w : {&Leaves::X, &Leaves::Wq, &Leaves::Wk, &Leaves::Wv, &Leaves::Wo})
    e_grad = std::max(e_grad, max_abs_diff((fused.*w).grad(), (in.*w).grad()));
  checks.verdict("fused attention gradients", e_grad <= kTolFormula,
                fmt::format("max |d(sdpa) - d(composed)| = {:.1e} over dX, dWq, dWk, dWv, dWo", e_grad));

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
  CLI::App app{"attograd walkthrough: a tiny self-attention step by step, every gradient checked, and "
               "the experiment behind the 1/sqrt(d_k) scaling"};
  std::string out_dir = "runs/walkthrough";
  uint64_t seed = 0;
  bool no_experiment = false;
  app.add_option("--out", out_dir, "where scaling.svg goes")->capture_default_str();
  app.add_option("--seed", seed, "random seed of the weights, inputs and experiment")->capture_default_str();
  app.add_flag("--no-experiment", no_experiment, "only the walkthrough, not the scaling experiment");
  app.add_option("--precision", digits, "decimals printed per value")->check(CLI::Range(1, 15))->capture_default_str();
  if (const int rc = apps::parse_command_line(app, argc, argv, "walkthrough"); rc >= 0) return rc;

  // One thread: every tensor here is tiny, and waking a team of OpenMP threads for each of the
  // thousands of small ops (finite differences run the forward ~1200 times) costs more than the
  // work: 0.1 s on one thread against seconds on a busy machine with all of them.
  set_num_threads(1);
  try {
    const int rc = walkthrough(seed);
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
