#include "nn/diagnostics.h"

#include <cmath>
#include <map>
#include <memory>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/kernels/attention_mask.h"

namespace ag::nn {

namespace {

// The weights' rows as f64 on the host, contiguous (B, H, Tq, Tk).
std::vector<double> host_values(const Tensor& t) {
  NoGradGuard no_grad;
  return t.detach().to(Device::cpu()).to(DType::f64).contiguous().to_vector<double>();
}

// 0 log 0 = 0: a key with no weight adds nothing to an entropy or a divergence.
double xlogy(double x, double y) { return x > 0 ? x * std::log(y) : 0.0; }

// Joins numbers with ", " in the given format ("0.98, 0.97").
std::string join_values(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += (s.empty() ? "" : ", ") + fmt::format("{:.2f}", x);
  return s;
}

}  // namespace

LayerAttentionStats attention_stats(const Tensor& weights, const AttentionMask& mask, const std::string& layer) {
  check(weights.defined() && weights.ndim() == 4 && is_floating(weights.dtype()),
        "attention_stats: expected weights f32/f64 [B, H, Tq, Tk] for '{}', got {}", layer,
        weights.defined() ? fmt::format("{} {}", weights.dtype(), weights.shape()) : std::string("an undefined tensor"));
  const int64_t B = weights.size(0), H = weights.size(1), Tq = weights.size(2), Tk = weights.size(3);
  std::vector<int64_t> len;
  std::vector<uint8_t> km;
  if (mask.key_padding_lengths.defined()) {
    check(mask.key_padding_lengths.dtype() == DType::i64 && mask.key_padding_lengths.shape() == Shape{B},
          "attention_stats: key_padding_lengths must be i64 [{}] for weights {} of '{}', got {} {}", B,
          weights.shape(), layer, mask.key_padding_lengths.dtype(), mask.key_padding_lengths.shape());
    len = mask.key_padding_lengths.to(Device::cpu()).contiguous().to_vector<int64_t>();
  }
  if (mask.key_padding_mask.defined()) {
    check(mask.key_padding_mask.dtype() == DType::b8 && mask.key_padding_mask.shape() == Shape{B, Tk},
          "attention_stats: key_padding_mask must be b8 [{}, {}] for weights {} of '{}', got {} {}", B, Tk,
          weights.shape(), layer, mask.key_padding_mask.dtype(), mask.key_padding_mask.shape());
    km = mask.key_padding_mask.to(Device::cpu()).contiguous().to_vector<uint8_t>();
  }
  std::vector<uint8_t> bm;
  int64_t block_cols = 0;
  if (mask.block_mask.defined()) {
    const int64_t bs = mask.block_size;
    check(bs >= 1, "attention_stats: block_size must be >= 1 with a block_mask for '{}', got {}", layer, bs);
    const Shape want{(Tq + bs - 1) / bs, (Tk + bs - 1) / bs};
    check(mask.block_mask.dtype() == DType::b8 && mask.block_mask.shape() == want,
          "attention_stats: block_mask must be b8 {} (block_size {}) for weights {} of '{}', got {} {}", want, bs,
          weights.shape(), layer, mask.block_mask.dtype(), mask.block_mask.shape());
    bm = mask.block_mask.to(Device::cpu()).contiguous().to_vector<uint8_t>();
    block_cols = want[1];
  }
  // visible(b, i, j): the rule of scaled_dot_product_attention (causal and window bottom-right
  // aligned, block mask), the one the CPU and GPU kernels use (core/kernels/attention_mask.h)
  auto bools = [](const std::vector<uint8_t>& x) {
    std::unique_ptr<bool[]> r;
    if (!x.empty()) r.reset(new bool[x.size()]);
    for (size_t i = 0; i < x.size(); ++i) r[i] = x[i] != 0;
    return r;
  };
  const std::unique_ptr<bool[]> hidden = bools(km), kept = bools(bm);
  const Visibility rule{Tq,          Tk,         mask.causal, mask.window, len.empty() ? nullptr : len.data(),
                        hidden.get(), kept.get(), block_cols,  bm.empty() ? 1 : mask.block_size};
  auto padded = [&](int64_t b, int64_t j) {
    return (!len.empty() && j >= len[size_t(b)]) || key_masked(rule, b, j);
  };
  auto visible = [&](int64_t b, int64_t i, int64_t j) { return ag::visible(rule, b, i, j); };

  const std::vector<double> w = host_values(weights);
  auto at = [&](int64_t b, int64_t h, int64_t i, int64_t j) { return w[size_t(((b * H + h) * Tq + i) * Tk + j)]; };

  LayerAttentionStats s;
  s.layer = layer;
  s.shape = weights.shape();
  s.heads.assign(size_t(H), {});
  std::vector<double> jsd_sum(size_t(H * H), 0.0);
  std::vector<double> p(size_t(H * Tk));   // this row's normalised weights, per head
  std::vector<char> vis(static_cast<size_t>(Tk));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Tq; ++i) {
      int64_t n = 0;
      for (int64_t j = 0; j < Tk; ++j) n += (vis[size_t(j)] = visible(b, i, j));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < Tk; ++j)
          if (!vis[size_t(j)] && std::abs(at(b, h, i, j)) > 1e-6)
            fail("attention_stats: '{}' weights {} put {} on key {} that query {} of batch element {} cannot see "
                 "(head {}): the weights and the mask do not belong together",
                 layer, weights.shape(), at(b, h, i, j), j, i, b, h);
      // one visible key (or none) says nothing about the head; nor does a padded query in self-attention
      if (n <= 1 || (Tq == Tk && padded(b, i))) continue;
      const int64_t qa = i + Tk - Tq;
      bool usable = true;
      for (int64_t h = 0; h < H && usable; ++h) {
        double total = 0;
        for (int64_t j = 0; j < Tk; ++j) total += vis[size_t(j)] ? at(b, h, i, j) : 0.0;
        usable = total > 0;
        for (int64_t j = 0; j < Tk; ++j) p[size_t(h * Tk + j)] = vis[size_t(j)] && usable ? at(b, h, i, j) / total : 0.0;
      }
      if (!usable) continue;  // a row of zeros: nothing to measure
      ++s.rows;
      for (int64_t h = 0; h < H; ++h) {
        const double* ph = &p[size_t(h * Tk)];
        double ent = 0;
        for (int64_t j = 0; j < Tk; ++j) ent -= xlogy(ph[j], ph[j]);
        HeadAttentionStats& hs = s.heads[size_t(h)];
        hs.entropy += ent / std::log(double(n));
        hs.diagonal += qa >= 0 && qa < Tk ? ph[qa] : 0.0;
        hs.uniform_diagonal += qa >= 0 && qa < Tk && vis[size_t(qa)] ? 1.0 / double(n) : 0.0;
        for (int64_t g = h + 1; g < H; ++g) {
          // JSD(P, Q) = (KL(P || M) + KL(Q || M)) / 2, M = (P + Q) / 2, in bits
          const double* pg = &p[size_t(g * Tk)];
          double jsd = 0;
          for (int64_t j = 0; j < Tk; ++j) {
            const double m = 0.5 * (ph[j] + pg[j]);
            jsd += 0.5 * (xlogy(ph[j], ph[j] / m) + xlogy(pg[j], pg[j] / m));
          }
          jsd_sum[size_t(h * H + g)] += jsd / std::log(2.0);
        }
      }
    }

  s.similarity.assign(size_t(H * H), 1.0);
  const double rows = double(std::max<int64_t>(s.rows, 1));
  for (int64_t h = 0; h < H; ++h) {
    HeadAttentionStats& hs = s.heads[size_t(h)];
    hs.entropy /= rows, hs.diagonal /= rows, hs.uniform_diagonal /= rows;
    for (int64_t g = h + 1; g < H; ++g) {
      const double sim = s.rows > 0 ? 1.0 - jsd_sum[size_t(h * H + g)] / rows : 0.0;
      s.similarity[size_t(h * H + g)] = s.similarity[size_t(g * H + h)] = sim;
    }
  }
  for (int64_t h = 0; h < H; ++h)
    for (int64_t g = 0; g < H; ++g)
      if (g != h && (s.heads[size_t(h)].most_similar < 0 || s.similarity[size_t(h * H + g)] > s.heads[size_t(h)].max_similarity)) {
        s.heads[size_t(h)].max_similarity = s.similarity[size_t(h * H + g)];
        s.heads[size_t(h)].most_similar = g;
      }
  return s;
}

std::vector<AttentionWarning> check_attention(const LayerAttentionStats& s, const AttentionThresholds& t) {
  std::vector<AttentionWarning> out;
  if (s.rows == 0) return out;  // no row with a choice to make
  const auto H = int64_t(s.heads.size());
  std::vector<char> flagged(size_t(H), 0);

  AttentionWarning uniform{s.layer, "near_uniform", {}, {}};
  std::vector<double> ent;
  for (int64_t h = 0; h < H; ++h)
    if (s.heads[size_t(h)].entropy >= t.uniform_entropy)
      uniform.heads.push_back(h), ent.push_back(s.heads[size_t(h)].entropy), flagged[size_t(h)] = 1;
  if (!uniform.heads.empty()) {
    uniform.message = fmt::format(
        "{}: head{} {} near-uniform (normalised entropy {} >= {:.2f}): suspect the initialisation or a too-high "
        "learning rate",
        s.layer, uniform.heads.size() > 1 ? "s" : "", fmt::join(uniform.heads, ", "), join_values(ent),
        t.uniform_entropy);
    out.push_back(uniform);
  }

  AttentionWarning diag{s.layer, "strong_diagonal", {}, {}};
  std::vector<double> mass;
  for (int64_t h = 0; h < H; ++h) {
    const HeadAttentionStats& hs = s.heads[size_t(h)];
    if (hs.diagonal >= t.diagonal_mass && hs.diagonal >= t.diagonal_over_uniform * hs.uniform_diagonal)
      diag.heads.push_back(h), mass.push_back(hs.diagonal), flagged[size_t(h)] = 1;
  }
  if (!diag.heads.empty()) {
    diag.message = fmt::format(
        "{}: head{} {} mostly attend{} to their own position (diagonal mass {} >= {:.2f}): suspect the positional "
        "encoding",
        s.layer, diag.heads.size() > 1 ? "s" : "", fmt::join(diag.heads, ", "), diag.heads.size() > 1 ? "" : "s",
        join_values(mass), t.diagonal_mass);
    out.push_back(diag);
  }

  // similar heads: groups joined by pairs at or above the threshold (union-find), skipping pairs
  // where both heads already have a warning
  std::vector<int64_t> root(static_cast<size_t>(H));
  std::iota(root.begin(), root.end(), int64_t(0));
  auto find = [&](int64_t x) {
    while (root[size_t(x)] != x) x = root[size_t(x)] = root[size_t(root[size_t(x)])];
    return x;
  };
  std::map<int64_t, double> lowest;  // group root -> lowest similarity of a joining pair
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t g = h + 1; g < H; ++g)
      if (s.similarity[size_t(h * H + g)] >= t.head_similarity && !(flagged[size_t(h)] && flagged[size_t(g)])) {
        pairs.emplace_back(h, g);
        root[size_t(find(g))] = find(h);
      }
  for (auto [h, g] : pairs) {
    const double sim = s.similarity[size_t(h * H + g)];
    auto [it, fresh] = lowest.try_emplace(find(h), sim);
    if (!fresh) it->second = std::min(it->second, sim);
  }
  for (auto [r, sim] : lowest) {
    AttentionWarning w{s.layer, "similar_heads", {}, {}};
    for (int64_t h = 0; h < H; ++h)
      if (find(h) == r) w.heads.push_back(h);
    w.message = fmt::format(
        "{}: heads {} have near-identical maps (similarity {:.2f} >= {:.2f}): the heads did not differentiate "
        "(blocky, repeated patterns)",
        s.layer, fmt::join(w.heads, ", "), sim, t.head_similarity);
    out.push_back(w);
  }
  return out;
}

AttentionReport diagnose_attention(const Module& model, const AttentionCapture& capture, const AttentionThresholds& t) {
  std::map<const Module*, std::string> names;
  for (const auto& [name, m] : model.named_modules()) names.emplace(m, name);
  AttentionReport r;
  r.thresholds = t;
  const auto& entries = capture.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    auto it = names.find(entries[i].module);
    const std::string name = it != names.end() ? (it->second.empty() ? std::string("(model)") : it->second)
                                               : fmt::format("attention.{}", i);
    r.layers.push_back(attention_stats(entries[i].weights, entries[i].mask, name));
    for (AttentionWarning& w : check_attention(r.layers.back(), t)) r.warnings.push_back(std::move(w));
  }
  return r;
}

AttentionReport diagnose_attention(const Module& model, const std::function<void()>& forward,
                                   const AttentionThresholds& t) {
  AttentionCapture capture;
  forward();
  return diagnose_attention(model, capture, t);
}

std::string AttentionReport::to_text() const {
  size_t width = 5;
  for (const auto& l : layers) width = std::max(width, l.layer.size());
  std::string s = fmt::format("{:<{}}  {:>4}  {:>7}  {:>8}  {:>9}  {}\n", "layer", width, "head", "entropy", "diagonal",
                              "(uniform)", "most similar head");
  for (const auto& l : layers)
    for (size_t h = 0; h < l.heads.size(); ++h) {
      const HeadAttentionStats& hs = l.heads[h];
      s += fmt::format("{:<{}}  {:>4}  {:>7.3f}  {:>8.3f}  {:>9}  {}\n", h == 0 ? l.layer : "", width, h, hs.entropy,
                       hs.diagonal, fmt::format("({:.3f})", hs.uniform_diagonal),
                       hs.most_similar >= 0 ? fmt::format("{} ({:.3f})", hs.most_similar, hs.max_similarity) : "-");
    }
  s += "entropy: normalised (1 = uniform over the visible keys); diagonal: mean weight on the query's own position "
       "(uniform weights: the value in parentheses); similarity: 1 - Jensen-Shannon divergence (bits)\n";
  if (warnings.empty()) return s + "attention checks: no warnings\n";
  s += fmt::format("attention checks: {} warning{}\n", warnings.size(), warnings.size() > 1 ? "s" : "");
  for (const auto& w : warnings) s += "  warning: " + w.message + "\n";
  return s;
}

}  // namespace ag::nn
