// Greedy decoding with a GPT-like stack: tokens/s with the preallocated KV cache (nn::KVCache),
// with a cat()-based cache (re-implemented below: a new k = cat({k, k_new}) each step), and without a
// cache (a full causal forward over the growing prefix at every step). All three must generate
// the same tokens; the bench checks it.
//
//   bench_decode [--tokens 256] [--reps 3] [--layers 4] [--d 128] [--heads 4] [--mlp 512] [--vocab 96] [--json]
//   bench_decode --kv-heads 4,2,1 [--json]     grouped-query attention: the KV cache's size and the
//                                              tokens/s with it, for each number of key/value heads
//   bench_decode --precision bf16              everything under bf16 autocast: bf16 products, the KV
//                                              cache in bf16 (nn::KVCache), half its bytes
//
//   bench_decode --imagetext [--scenes 100]    apps/imagetext's default model (random weights): greedy
//                                              captions of a batch of scenes with both caches, with the
//                                              self-attention caches only (each block's image keys and
//                                              values projected again at every step), and with none
//
//   bench_decode --per-token [--out DIR]      the cost of each generated token against its position t:
//                                              the time of each step with the cache and without (the
//                                              two alternate at every step), its FLOPs counted by
//                                              nn::summarize beside the formula, and the cache's bytes
//                                              per number of key/value heads (docs/math/kv-cache.md);
//                                              --out writes DIR/kv-cache.jsonl and DIR/kv-cache-cost.svg
//   bench_decode --plot-only FILE.jsonl --svg FILE.svg   redraws that SVG, measuring nothing
//
// --json prints one JSON line (no table) with the no-cache and preallocated-cache rows only, for
// bench/compare_pytorch (whose PyTorch side, bench/torch_reference.py generate, is the same model
// with a hand-written cache).
//
// Per generated token t, the attention of each layer reads the t cached positions either way; the
// caches differ in what they copy: cat() copies all t positions of k and v into a new tensor
// (O(T^2) bytes over T tokens), the preallocated cache writes only the new position (O(T)).
// Without a cache every step recomputes every position: O(T^2) matmul work.
#include <CLI/CLI.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "apps/common/plot.h"
#include "apps/common/run.h"
#include "apps/imagetext/lib.h"
#include "attograd.h"
#include "bench/bench_util.h"
#include "nn/embedding.h"
#include "nn/summary.h"
#include "nn/transformer.h"

using namespace ag;

namespace {

struct Gpt {
  nn::Embedding tok, pos;
  std::vector<std::shared_ptr<nn::TransformerBlock>> blocks;
  nn::LayerNorm ln_f;
  nn::Linear head;

  Gpt(int64_t vocab, int64_t max_t, int64_t d, int64_t heads, int64_t mlp, int64_t layers, Generator* g,
      int64_t kv_heads = 0)
      : tok(vocab, d, std::nullopt, DType::f32, g), pos(max_t, d, std::nullopt, DType::f32, g), ln_f(Shape{d}),
        head(d, vocab, true, DType::f32, g) {
    const nn::TransformerBlock::Options block{
        .mlp_hidden = mlp, .causal = true, .attention = {.kv_heads = kv_heads}, .generator = g};
    for (int64_t l = 0; l < layers; ++l) blocks.push_back(std::make_shared<nn::TransformerBlock>(d, heads, block));
    ln_f.eval();
    for (auto& b : blocks) b->eval();
  }
  // tokens (1, T) at positions [start, start + T) -> x (1, T, d)
  Tensor embed(const Tensor& tokens, int64_t start) {
    const int64_t T = tokens.size(1);
    return tok.forward(tokens) + pos.forward(arange(double(start), double(start + T)));
  }
  // logits (1, V) of the last position
  Tensor last_logits(const Tensor& h) { return head.forward(ln_f.forward(h.select(1, h.size(1) - 1))); }

  // full causal forward over tokens (1, T), or the new tokens with one cache per block
  Tensor forward(const Tensor& tokens, int64_t start, std::vector<nn::KVCache>* caches) {
    Tensor h = embed(tokens, start);
    for (size_t l = 0; l < blocks.size(); ++l)
      h = blocks[l]->forward(h, Tensor(), caches ? &(*caches)[l] : nullptr);
    return last_logits(h);
  }
};

// A cache without preallocation: k = cat({k, k_new}, 2) at every step, through a block's own
// layers (the same math as TransformerBlock::forward with MultiHeadAttention's self-attention).
struct CatCache {
  Tensor k, v;  // (B, H, T, hs)
};
Tensor block_with_cat_cache(nn::TransformerBlock& b, const Tensor& x, CatCache& c) {
  nn::MultiHeadAttention& a = *b.attn;
  const int64_t B = x.size(0), T = x.size(1);
  Tensor qkv = a.qkv->forward(b.ln1->forward(x)).reshape({B, T, 3, a.n_heads, a.head_size}).permute({2, 0, 3, 1, 4});
  Tensor q = qkv.select(0, 0), k = qkv.select(0, 1), v = qkv.select(0, 2);
  if (c.k.defined()) c.k = cat({c.k, k}, 2), c.v = cat({c.v, v}, 2);
  else c.k = k, c.v = v;
  SdpaOptions o;
  o.causal = true;
  Tensor y = scaled_dot_product_attention(q, c.k, c.v, o).out.transpose(1, 2).reshape({B, T, a.d_model});
  Tensor h = x + a.proj->forward(y);
  return h + b.mlp->forward(b.ln2->forward(h));
}

enum class Mode { no_cache, cat_cache, prealloc, growing };

// Greedy generation of n tokens after the prompt token 0; returns the generated tokens.
std::vector<int64_t> generate(Gpt& m, int64_t n, Mode mode) {
  NoGradGuard no_grad;
  std::vector<int64_t> seq{0};
  std::vector<nn::KVCache> caches;
  for (size_t l = 0; l < m.blocks.size(); ++l) caches.emplace_back(mode == Mode::prealloc ? n + 1 : 0);
  std::vector<CatCache> cat_caches(m.blocks.size());
  for (int64_t t = 0; t < n; ++t) {
    Tensor logits;
    if (mode == Mode::no_cache) {
      logits = m.forward(from_vector(seq, {1, int64_t(seq.size())}), 0, nullptr);
    } else {
      Tensor last = from_vector(std::vector<int64_t>{seq.back()}, {1, 1});
      const int64_t start = int64_t(seq.size()) - 1;
      if (mode == Mode::cat_cache) {
        Tensor h = m.embed(last, start);
        for (size_t l = 0; l < m.blocks.size(); ++l) h = block_with_cat_cache(*m.blocks[l], h, cat_caches[l]);
        logits = m.last_logits(h);
      } else {
        logits = m.forward(last, start, &caches);
      }
    }
    seq.push_back(argmax(logits, -1).item<int64_t>());
  }
  return {seq.begin() + 1, seq.end()};
}

// --imagetext: the time of greedy captioning from the encoder's memory, by what each step reuses
// (apps/imagetext/lib.h CaptionCache). The encoder runs once per batch in every variant (timed
// apart). A random model's captions run to different lengths, the same in every variant (checked).
int bench_imagetext(int64_t scenes, int reps, bool json) {
  apps::ImageTextConfig cfg;  // the app's defaults: 28 x 112 scenes, patch 7, d 64, 4 heads, 2 + 2 blocks
  Generator g(0);
  apps::ImageText model(cfg, &g);
  model.eval();
  NoGradGuard no_grad;
  const Tensor images = randn({scenes, cfg.channels, cfg.image_h, cfg.image_w}, DType::f32, &g);
  Tensor memory;
  const double encode_s = bench::median_seconds([&] { memory = model.encode(images); }, reps, 1);
  const auto reference = apps::greedy_captions_from(model, memory, apps::CaptionCache::none);
  int64_t tokens = 0;
  for (const auto& c : reference) tokens += int64_t(c.size());
  struct Row {
    const char* name;
    const char* key;
    apps::CaptionCache cache;
  };
  const Row rows[] = {{"no cache (the whole prefix per step)", "no_cache", apps::CaptionCache::none},
                      {"text caches, image k/v every step", "text_only", apps::CaptionCache::text_only},
                      {"text caches, image k/v once", "full", apps::CaptionCache::full}};
  nlohmann::json j = {{"bench", "decode_imagetext"}, {"scenes", scenes}, {"threads", num_threads()},
                      {"image_tokens", cfg.patches() + 1}, {"max_len", cfg.max_len}, {"tokens", tokens},
                      {"encode_ms", encode_s * 1e3}};
  if (!json) {
    fmt::print("attograd bench_decode --imagetext: {} scenes of {}x{}, {} image tokens, d {}, {} heads, {} + {} "
               "blocks, up to {} tokens per caption ({} generated in all), {} threads, median of {}\n",
               scenes, cfg.image_h, cfg.image_w, cfg.patches() + 1, cfg.d_model, cfg.n_heads, cfg.enc_layers,
               cfg.dec_layers, cfg.max_len, tokens, num_threads(), reps);
    fmt::print("encoding the images once: {:.2f} ms\n", encode_s * 1e3);
    fmt::print("| {:<36} | {:>9} | {:>10} | {:>11} | {:>10} |\n", "generation from the memory", "ms", "captions/s",
               "vs no cache", "same tokens");
    fmt::print("|{:-<38}|{:->11}|{:->12}|{:->13}|{:->12}|\n", "", ":", ":", ":", ":");
  }
  double none_s = 0;
  for (const Row& r : rows) {
    bool same = true;
    const double s = bench::median_seconds(
        [&] { same = same && apps::greedy_captions_from(model, memory, r.cache) == reference; }, reps, 1);
    if (r.cache == apps::CaptionCache::none) none_s = s;
    j["results"][r.key] = {{"ms", s * 1e3}, {"captions_per_s", double(scenes) / s}, {"same_tokens", same}};
    if (!json)
      fmt::print("| {:<36} | {:>9.2f} | {:>10.1f} | {:>10.2f}x | {:>10} |\n", r.name, s * 1e3, double(scenes) / s,
                 none_s / s, same ? "yes" : "NO");
  }
  if (json) fmt::print("{}\n", j.dump());
  return 0;
}

// ---- --per-token: the cost of each generated token against its position -------------------------

struct DecodeShape {
  int64_t vocab, d, heads, kv_heads, mlp, layers;
};

// Forward FLOPs of one generation step by the formula, in nn/summary.h's convention: 2 per
// multiply-add, matrix products only (the pointwise ops add O(t d)), and a causal t x t attention
// counted in full, as the profiler counts it. t: the positions attended over (the sequence so far).
//   with the cache    each layer projects one token, q k^T and p v over t cached keys: 2 t d multiply-adds
//   without a cache   each layer projects all t tokens, and attends t queries over t keys: 2 t^2 d
// Per projected token and layer: q, k, v d (d + 2 Hkv hs), W^O d^2, the MLP 2 d mlp multiply-adds.
// Both end with the head over the last position: d vocab.
double step_flops(const DecodeShape& s, int64_t t, bool cached) {
  const double d = double(s.d), hs = double(s.d / s.heads), T = double(t);
  const double per_token = d * (d + 2 * double(s.kv_heads) * hs) + d * d + 2 * d * double(s.mlp);
  const double tokens = cached ? 1 : T, attention = cached ? 2 * T * d : 2 * T * T * d;
  return 2 * (double(s.layers) * (tokens * per_token + attention) + d * double(s.vocab));
}

// The FLOPs of the step at sequence length t as nn::summarize counts them from the recorded ops:
// without a cache a forward over seq[0, t); with one, the cache filled with positions [0, t - 1),
// then the forward of token t - 1 alone. Recording needs grad mode, so both fill the cache through
// the differentiable cat() (an inference append would keep 16-bit keys under autocast, which the
// recorded step's f32 keys could not join); the products are the same.
double counted_step_flops(Gpt& m, const std::vector<int64_t>& seq, int64_t t, bool cached) {
  nn::Module root;  // the summary's root: every op counts there
  if (!cached) {
    const Tensor tokens = from_vector(std::vector<int64_t>(seq.begin(), seq.begin() + t), {1, t});
    return nn::summarize(root, [&] { return m.forward(tokens, 0, nullptr); }, 1).forward_flops();
  }
  std::vector<nn::KVCache> caches(m.blocks.size());
  if (t > 1) m.forward(from_vector(std::vector<int64_t>(seq.begin(), seq.begin() + t - 1), {1, t - 1}), 0, &caches);
  const Tensor last = from_vector(std::vector<int64_t>{seq[size_t(t - 1)]}, {1, 1});
  return nn::summarize(root, [&] { return m.forward(last, t - 1, &caches); }, 1).forward_flops();
}

// Least-squares line y = a + b x.
std::pair<double, double> fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i], my += y[i];
  mx /= double(x.size()), my /= double(x.size());
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < x.size(); ++i) sxy += (x[i] - mx) * (y[i] - my), sxx += (x[i] - mx) * (x[i] - mx);
  const double b = sxx > 0 ? sxy / sxx : 0;
  return {my - b * mx, b};
}

// The positions of the printed tables and of the counted FLOPs: 1, 2, 4, ... and every multiple of 64.
bool is_sample(int64_t t, int64_t n) {
  return (t & (t - 1)) == 0 || t % 64 == 0 || t == n;
}

// The formula's FLOPs f scaled to the measured times y: the factor that makes them agree over the
// last eighth of the positions (the ratio of the two medians there), so the dashed line shows the
// formula's shape against position, not a fitted rate.
std::vector<double> scaled_to(const std::vector<double>& f, const std::vector<double>& y) {
  const size_t from = f.size() - std::max<size_t>(1, f.size() / 8);
  const std::vector<double> fs(f.begin() + long(from), f.end()), ys(y.begin() + long(from), y.end());
  const double scale = bench::median(ys) / bench::median(fs);
  std::vector<double> out;
  for (double v : f) out.push_back(v * scale);
  return out;
}

// Three charts against the position t: the time of a step with and without the cache (dashed: the
// formula's FLOPs scaled to the measured times of the last positions), the FLOPs of a step
// (counted; dashed: the formula), and the cache's bytes for each number of key/value heads
// (allocator; dashed: the formula).
std::string draw_per_token(const std::vector<nlohmann::json>& rows) {
  using nlohmann::json;
  apps::LineChart time, flops, mem;
  time.title = "time of one generation step";
  time.y_label = "ms";
  time.log_y = true;
  flops.title = "FLOPs of one step (dashed: formula)";
  flops.y_label = "FLOPs";
  flops.log_y = true;
  mem.title = "KV cache, growing (dashed: 2 L t Hkv hs bytes)";
  mem.y_label = "KiB";
  for (apps::LineChart* c : {&time, &flops, &mem}) {
    c->x_label = "position t (tokens attended over)";
    c->width = 480;
    c->height = 420;
  }
  std::string caption;
  apps::Series tc{"with the cache", {}, {}, 0}, tn{"without a cache", {}, {}, 1};
  apps::Series tcf{"formula, scaled", {}, {}, 0, true}, tnf{"formula, scaled", {}, {}, 1, true};
  apps::Series fc{"with the cache", {}, {}, 0}, fn{"without a cache", {}, {}, 1};
  apps::Series fcf{"formula", {}, {}, 0, true}, fnf{"formula", {}, {}, 1, true};
  std::map<int64_t, apps::Series> mb, mf;
  std::vector<double> xs, fcs, fns, ycs, yns;
  for (const json& j : rows) {
    const std::string part = j.value("part", "");
    if (part == "config") {
      caption = fmt::format("bench_decode's model: vocab {}, d {}, {} heads, {} layers, MLP {}, {}, batch 1, {} threads.",
                            j.value("vocab", 0), j.value("d", 0), j.value("heads", 0), j.value("layers", 0),
                            j.value("mlp", 0), j.value("precision", ""), j.value("threads", 0));
    } else if (part == "step") {
      const double t = j["t"].get<double>(), c = j["cache_ms"].get<double>(), f = j["no_cache_ms"].get<double>();
      const double cf = j["cache_flops_formula"].get<double>(), ff = j["no_cache_flops_formula"].get<double>();
      xs.push_back(t), fcs.push_back(cf), fns.push_back(ff), ycs.push_back(c), yns.push_back(f);
      tc.x.push_back(t), tc.y.push_back(c);
      tn.x.push_back(t), tn.y.push_back(f);
      fcf.x.push_back(t), fcf.y.push_back(cf);
      fnf.x.push_back(t), fnf.y.push_back(ff);
      if (j.contains("cache_flops")) fc.x.push_back(t), fc.y.push_back(j["cache_flops"].get<double>());
      if (j.contains("no_cache_flops")) fn.x.push_back(t), fn.y.push_back(j["no_cache_flops"].get<double>());
    } else if (part == "memory") {
      const int64_t kv = j["kv_heads"].get<int64_t>();
      const double t = j["t"].get<double>();
      auto& b = mb[kv];
      auto& f = mf[kv];
      b.name = fmt::format("Hkv = {}", kv), f.name = fmt::format("Hkv = {}, formula", kv);
      b.colour = f.colour = int(mb.size()) + 1;
      f.dashed = true;
      b.x.push_back(t), b.y.push_back(j["bytes"].get<double>() / 1024);
      f.x.push_back(t), f.y.push_back(j["formula_bytes"].get<double>() / 1024);
    }
  }
  if (!xs.empty()) tcf.x = tnf.x = xs, tcf.y = scaled_to(fcs, ycs), tnf.y = scaled_to(fns, yns);
  time.series = {tc, tn, tcf, tnf};
  flops.series = {fc, fn, fcf, fnf};
  for (auto& [kv, s] : mb) mem.series.push_back(s), mem.series.push_back(mf[kv]);
  return apps::svg_line_charts({time, flops, mem}, 3, caption);
}

// --per-token: each step of a greedy generation of n tokens timed with the cache and without, in
// lockstep (the two alternate at every step and round), the median over the rounds; the FLOPs of a
// step counted at the sample positions; the cache's bytes for every kv-head count dividing heads.
int bench_per_token(const DecodeShape& s, int64_t n, int reps, const std::string& precision, int64_t cache_bytes,
                    const std::string& out_dir) {
  using nlohmann::json;
  std::vector<json> rows;
  rows.push_back({{"part", "config"}, {"vocab", s.vocab}, {"d", s.d}, {"heads", s.heads}, {"layers", s.layers},
                  {"mlp", s.mlp}, {"tokens", n}, {"precision", precision}, {"threads", num_threads()},
                  {"reps", reps}});
  fmt::print("attograd bench_decode --per-token: vocab {} d {} heads {} layers {} mlp {}, {}, greedy, 1-token prompt, "
             "{} tokens, {} threads, median of {} rounds, the two variants alternating at every step\n\n",
             s.vocab, s.d, s.heads, s.layers, s.mlp, precision, n, num_threads(), reps);
  Generator gen(0);
  Gpt m(s.vocab, n + 1, s.d, s.heads, s.mlp, s.layers, &gen);
  const std::vector<int64_t> reference = generate(m, n, Mode::prealloc);  // also the warm-up
  std::vector<int64_t> seq{0};
  seq.insert(seq.end(), reference.begin(), reference.end());

  std::vector<std::vector<double>> cache_s(static_cast<size_t>(n)), full_s(static_cast<size_t>(n));
  bool same = true;
  for (int r = 0; r < reps; ++r) {
    NoGradGuard no_grad;
    std::vector<nn::KVCache> caches;
    for (size_t l = 0; l < m.blocks.size(); ++l) caches.emplace_back(n + 1);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = i + 1;  // the step attends over positions [0, t) and predicts position t
      int64_t a = -1, b = -1;
      const auto full = [&] {
        a = argmax(m.forward(from_vector(std::vector<int64_t>(seq.begin(), seq.begin() + t), {1, t}), 0, nullptr), -1)
                .item<int64_t>();
      };
      const auto cached = [&] {
        b = argmax(m.forward(from_vector(std::vector<int64_t>{seq[size_t(i)]}, {1, 1}), i, &caches), -1)
                .item<int64_t>();
      };
      if ((i + r) % 2 == 0) {
        full_s[size_t(i)].push_back(bench::seconds_of(full));
        cache_s[size_t(i)].push_back(bench::seconds_of(cached));
      } else {
        cache_s[size_t(i)].push_back(bench::seconds_of(cached));
        full_s[size_t(i)].push_back(bench::seconds_of(full));
      }
      same = same && a == seq[size_t(t)] && b == seq[size_t(t)];
    }
  }

  fmt::print("one generation step at position t: the time (median) and the forward FLOPs, counted by nn::summarize "
             "from the recorded ops and by the formula (docs/math/kv-cache.md)\n");
  fmt::print("| {:>5} | {:>10} | {:>13} | {:>7} | {:>12} | {:>12} | {:>12} | {:>12} | {:>9} |\n", "t", "cache ms",
             "no cache ms", "ratio", "cache FLOPs", "formula", "no cache", "formula", "ratio");
  fmt::print("|{:->7}|{:->12}|{:->15}|{:->9}|{:->14}|{:->14}|{:->14}|{:->14}|{:->11}|\n", ":", ":", ":", ":", ":", ":",
             ":", ":", ":");
  const DecodeShape mha = s;  // the model of this run: every head its own keys and values
  double cache_total = 0, full_total = 0, cache_flops_total = 0, full_flops_total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = i + 1;
    const double c = bench::median(cache_s[size_t(i)]) * 1e3, f = bench::median(full_s[size_t(i)]) * 1e3;
    const double cf = step_flops(mha, t, true), ff = step_flops(mha, t, false);
    cache_total += c, full_total += f, cache_flops_total += cf, full_flops_total += ff;
    json j = {{"part", "step"}, {"t", t}, {"cache_ms", c}, {"no_cache_ms", f}, {"cache_flops_formula", cf},
              {"no_cache_flops_formula", ff}};
    for (const auto& [key, samples] : {std::pair{"cache_ms_rounds", &cache_s}, std::pair{"no_cache_ms_rounds", &full_s}})
      for (double sec : (*samples)[size_t(i)]) j[key].push_back(std::round(sec * 1e7) / 1e4);  // ms, 0.1 us
    if (is_sample(t, n)) {
      const double cc = counted_step_flops(m, seq, t, true), fc = counted_step_flops(m, seq, t, false);
      j["cache_flops"] = cc, j["no_cache_flops"] = fc;
      fmt::print("| {:>5} | {:>10.3f} | {:>13.3f} | {:>6.1f}x | {:>12.4g} | {:>12.4g} | {:>12.4g} | {:>12.4g} | {:>8.1f}x |\n",
                 t, c, f, f / c, cc, cf, fc, ff, fc / cc);
    }
    rows.push_back(j);
  }
  std::vector<double> fcs, fns, ycs, yns;
  for (const json& j : rows)
    if (j["part"] == "step")
      fcs.push_back(j["cache_flops_formula"].get<double>()), fns.push_back(j["no_cache_flops_formula"].get<double>()),
          ycs.push_back(j["cache_ms"].get<double>()), yns.push_back(j["no_cache_ms"].get<double>());
  const auto [an, bn] = fit_line(fns, yns);
  fmt::print("\nthe first T steps together (the sums of the medians above; same tokens: {})\n",
             same ? "yes" : precision == "fp32" ? "NO" : "no (16-bit products of one row and of t rows round differently)");
  fmt::print("| {:>5} | {:>10} | {:>13} | {:>7} | {:>14} | {:>14} | {:>7} |\n", "T", "cache ms", "no cache ms",
             "ratio", "cache FLOPs", "no cache FLOPs", "ratio");
  fmt::print("|{:->7}|{:->12}|{:->15}|{:->9}|{:->16}|{:->16}|{:->9}|\n", ":", ":", ":", ":", ":", ":", ":");
  {
    double c = 0, f = 0, cf = 0, ff = 0;
    for (int64_t i = 0; i < n; ++i) {
      c += ycs[size_t(i)], f += yns[size_t(i)], cf += fcs[size_t(i)], ff += fns[size_t(i)];
      const int64_t T = i + 1;
      if (T == n || (T >= 32 && (T & (T - 1)) == 0)) {
        fmt::print("| {:>5} | {:>10.1f} | {:>13.1f} | {:>6.1f}x | {:>14.4g} | {:>14.4g} | {:>6.1f}x |\n", T, c, f, f / c,
                   cf, ff, ff / cf);
        rows.push_back({{"part", "total"}, {"T", T}, {"cache_ms", c}, {"no_cache_ms", f}, {"cache_flops_formula", cf},
                        {"no_cache_flops_formula", ff}});
      }
    }
  }
  fmt::print("\nwithout a cache, the least-squares line through the steps' times: ms = a + F / r, F the formula's "
             "FLOPs: a = {:.3f} ms, r = {:.2f} GFLOP/s; with the cache the median step takes {:.3f} ms\n",
             an, bn > 0 ? 1e-6 / bn : 0.0, bench::median(ycs));
  rows.push_back({{"part", "totals"}, {"cache_ms", cache_total}, {"no_cache_ms", full_total},
                  {"cache_flops_formula", cache_flops_total}, {"no_cache_flops_formula", full_flops_total},
                  {"median_cache_ms", bench::median(ycs)}, {"fit_no_cache_ms", an},
                  {"fit_no_cache_gflops", bn > 0 ? 1e-6 / bn : 0.0}, {"same_tokens", same}});

  // The cache's bytes: the allocator's bytes in use beyond those before the first step, after each
  // step of a generation with a growing cache (capacity 0: doubling), and with capacity n (the
  // positions the n steps append).
  fmt::print("\nthe KV cache's memory after step t (allocator: bytes in use beyond those before the first step; "
             "formula: 2 L t Hkv hs x {} bytes)\n",
             cache_bytes);
  fmt::print("| {:>8} | {:>5} | {:>14} | {:>14} | {:>14} | {:>16} |\n", "kv_heads", "t", "growing (KiB)",
             "positions held", "formula (KiB)", "capacity T (KiB)");
  fmt::print("|{:->10}|{:->7}|{:->16}|{:->16}|{:->16}|{:->18}|\n", ":", ":", ":", ":", ":", ":");
  for (int64_t kv = s.heads; kv >= 1; --kv) {
    if (s.heads % kv != 0) continue;
    Generator g(0);
    Gpt mk(s.vocab, n + 1, s.d, s.heads, s.mlp, s.layers, &g, kv);
    NoGradGuard no_grad;
    const int64_t hs = s.d / s.heads;
    {  // one step first: what a model makes at its first forward and keeps (bf16 copies of the weights)
      std::vector<nn::KVCache> warm(mk.blocks.size());
      mk.forward(from_vector(std::vector<int64_t>{0}, {1, 1}), 0, &warm);
    }
    for (const bool prealloc : {false, true}) {
      std::vector<nn::KVCache> caches;
      for (size_t l = 0; l < mk.blocks.size(); ++l) caches.emplace_back(prealloc ? n : 0);
      const uint64_t base = alloc_stats(Device::cpu()).bytes_in_use;
      int64_t token = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = i + 1;
        token = argmax(mk.forward(from_vector(std::vector<int64_t>{token}, {1, 1}), i, &caches), -1).item<int64_t>();
        const double bytes = double(alloc_stats(Device::cpu()).bytes_in_use - base);
        const double formula = double(2 * s.layers * t * kv * hs * cache_bytes);
        if (!prealloc && (is_sample(t, n) || is_sample(t - 1, n)))  // each side of a doubling
          rows.push_back({{"part", "memory"}, {"kv_heads", kv}, {"t", t}, {"bytes", bytes}, {"formula_bytes", formula},
                          {"capacity", caches[0].capacity()}});
        if (t == n)
          prealloc ? fmt::print(" {:>16.1f} |\n", bytes / 1024)
                   : fmt::print("| {:>8} | {:>5} | {:>14.1f} | {:>14} | {:>14.1f} |", kv, t, bytes / 1024,
                                caches[0].capacity(), formula / 1024);
        if (prealloc && t == n)
          rows.push_back({{"part", "memory_capacity_T"}, {"kv_heads", kv}, {"t", t}, {"bytes", bytes},
                          {"capacity", caches[0].capacity()}});
      }
    }
  }
  std::fflush(stdout);
  if (!out_dir.empty()) {
    std::filesystem::create_directories(out_dir);
    std::ofstream out(out_dir + "/kv-cache.jsonl");
    if (!out) {
      fmt::print(stderr, "bench_decode: --out: cannot write {}/kv-cache.jsonl\n", out_dir);
      return 1;
    }
    for (const json& j : rows) out << j.dump() << "\n";
    out.close();
    apps::write_file_atomic(out_dir + "/kv-cache-cost.svg", draw_per_token(rows));
    fmt::print("\nwrote {0}/kv-cache.jsonl and {0}/kv-cache-cost.svg\n", out_dir);
  }
  // In fp32 both variants compute the same products; under 16-bit autocast the one-row products of
  // the cached step may round differently from the t-row ones, and a near tie may then flip.
  return same || precision != "fp32" ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attograd: greedy decoding with and without a KV cache"};
  int64_t n = 256, layers = 4, d = 128, heads = 4, mlp = 512, vocab = 96;
  int reps = 3;
  bool json = false;
  int threads = 0;
  std::string precision = "fp32";
  bool imagetext = false;
  int64_t scenes = 100;
  app.add_flag("--imagetext", imagetext,
               "time apps/imagetext's greedy captions instead: both caches, the text caches only, none");
  app.add_option("--scenes", scenes, "--imagetext: scenes captioned as one batch")->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--tokens", n, "tokens to generate after a 1-token prompt")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed generations per cached variant (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--layers", layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--d", d, "model width")->check(CLI::PositiveNumber);
  app.add_option("--heads", heads, "attention heads")->check(CLI::PositiveNumber);
  app.add_option("--mlp", mlp, "MLP hidden width")->check(CLI::PositiveNumber);
  app.add_option("--vocab", vocab, "vocabulary size")->check(CLI::PositiveNumber);
  app.add_flag("--json", json, "print one JSON line: tokens/s with and without the cache (no table)");
  app.add_option("--threads", threads, "threads (default: OMP_NUM_THREADS, else the cores)")->check(CLI::PositiveNumber);
  std::vector<int64_t> kv_list;
  app.add_option("--kv-heads", kv_list,
                 "key/value head counts to compare, each dividing --heads (e.g. 4,2,1): the cache's size and "
                 "tokens/s with the preallocated cache for each, one model per count (same seed)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--precision", precision,
                 "fp32, bf16 or fp16: generate under that autocast (ag::AutocastGuard): 16-bit products, the KV "
                 "cache kept in 16 bits (bf16: linear reads bf16 copies of the weights)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  bool per_token = false;
  std::string out_dir, plot_only, svg_path;
  app.add_flag("--per-token", per_token,
               "time each generation step with and without the cache, count its FLOPs, and measure the cache's "
               "bytes per number of key/value heads, against the position");
  app.add_option("--out", out_dir, "--per-token: write DIR/kv-cache.jsonl and DIR/kv-cache-cost.svg");
  app.add_option("--plot-only", plot_only, "draw the --per-token SVG (--svg) from this JSONL file, measuring nothing");
  app.add_option("--svg", svg_path, "with --plot-only: where the SVG goes");
  if (const int rc = ag::apps::parse_command_line(app, argc, argv, "bench_decode"); rc >= 0) return rc;
  if (const int rc = bench::plot_only("bench_decode", plot_only, svg_path, {"part"}, draw_per_token); rc >= 0) return rc;
  if (per_token && (imagetext || json || !kv_list.empty())) {
    fmt::print(stderr, "bench_decode: --per-token measures the cache's size for every kv-head count itself and "
                       "prints tables: it takes no --imagetext, --json or --kv-heads\n");
    return 2;
  }
  if (!out_dir.empty() && !per_token) {
    fmt::print(stderr, "bench_decode: --out goes with --per-token\n");
    return 2;
  }
  if (threads > 0) set_num_threads(threads);
  const Precision prec = *parse_precision(precision);  // one of them: CLI::IsMember above
  const AutocastGuard autocast(prec);
  if (imagetext) return bench_imagetext(scenes, reps, json);
  const int64_t cache_bytes = prec == Precision::fp32 ? 4 : 2;  // per cached element
  if (per_token) {
    if (d % heads != 0) {
      fmt::print(stderr, "bench_decode: --heads {} does not divide --d {}\n", heads, d);
      return 2;
    }
    try {
      return bench_per_token({vocab, d, heads, heads, mlp, layers}, n, reps, precision, cache_bytes, out_dir);
    } catch (const Error& e) {
      fmt::print(stderr, "bench_decode: {}\n", e.what());
      return 1;
    }
  }
  for (int64_t kv : kv_list)
    if (heads % kv != 0) {
      fmt::print(stderr, "bench_decode: --kv-heads {} does not divide --heads {}\n", kv, heads);
      return 2;
    }

  if (!kv_list.empty()) {  // grouped-query attention: cache size and speed per kv_heads
    if (!json)
      fmt::print("attograd bench_decode --kv-heads: vocab {} d {} heads {} layers {} mlp {}, {}, greedy, 1-token "
                 "prompt, {} tokens, {} threads, preallocated cache, median of {}\n",
                 vocab, d, heads, layers, mlp, precision, n, num_threads(), reps);
    if (!json) {
      fmt::print("| {:>8} | {:>14} | {:>9} | {:>9} | {:>12} |\n", "kv_heads", "cache (KiB)", "time (s)", "tokens/s",
                 "vs kv = heads");
      fmt::print("|{:->10}|{:->16}|{:->11}|{:->11}|{:->14}|\n", ":", ":", ":", ":", ":");
    }
    double base_tps = 0;
    for (int64_t kv : kv_list) {
      Generator g(0);
      Gpt mk(vocab, n + 1, d, heads, mlp, layers, &g, kv);
      // k and v of every layer for the n + 1 positions: 2 layers kv (n + 1) (d / heads) elements
      const double cache_kib = double(2 * layers * kv * (n + 1) * (d / heads) * cache_bytes) / 1024.0;
      const double secs = bench::median_seconds([&] { generate(mk, n, Mode::prealloc); }, reps, 1);
      const double tps = double(n) / secs;
      if (base_tps == 0) base_tps = tps;
      if (json)
        fmt::print("{}\n", nlohmann::json{{"bench", "decode_kv_heads"}, {"heads", heads}, {"kv_heads", kv},
                                          {"layers", layers}, {"d", d}, {"tokens", n}, {"threads", num_threads()}, {"precision", precision},
                                          {"cache_kib", cache_kib}, {"ms", secs * 1e3}, {"tokens_per_s", tps}}
                                .dump());
      else
        fmt::print("| {:>8} | {:>14.1f} | {:>9.3f} | {:>9.1f} | {:>11.2f}x |\n", kv, cache_kib, secs, tps,
                   tps / base_tps);
    }
    return 0;
  }

  Generator gen(0);
  Gpt m(vocab, n + 1, d, heads, mlp, layers, &gen);

  if (!json)
    fmt::print("attograd bench_decode: vocab {} d {} heads {} layers {} mlp {}, {}, greedy, 1-token prompt, {} "
             "tokens, {} threads, median of {} (no cache: 1 run)\n",
             vocab, d, heads, layers, mlp, precision, n, num_threads(), reps);
  const std::vector<int64_t> reference = generate(m, n, Mode::prealloc);
  if (json) {
    nlohmann::json j;
    j["threads"] = num_threads();
    j["precision"] = precision;
    for (Mode mode : {Mode::prealloc, Mode::no_cache}) {
      bool same = true;
      const bool once = mode == Mode::no_cache;
      const double secs = bench::median_seconds([&] { same = same && generate(m, n, mode) == reference; },
                                                once ? 1 : reps, once ? 0 : 1);
      j["results"][mode == Mode::prealloc ? "cache" : "no_cache"] = {
          {"ms", secs * 1e3}, {"tokens_per_s", double(n) / secs}, {"same_tokens", same}};
    }
    fmt::print("{}\n", j.dump());
    return 0;
  }
  struct Row {
    const char* name;
    Mode mode;
  };
  const Row rows[] = {{"no cache (full forward per step)", Mode::no_cache},
                      {"cat() cache", Mode::cat_cache},
                      {"preallocated cache, growing", Mode::growing},
                      {"preallocated cache, capacity T", Mode::prealloc}};
  double no_cache_tps = 0;
  fmt::print("| {:<32} | {:>9} | {:>9} | {:>11} | {:>10} |\n", "variant", "time (s)", "tokens/s", "vs no cache",
             "same tokens");
  fmt::print("|{:-<34}|{:->11}|{:->11}|{:->13}|{:->12}|\n", "", ":", ":", ":", ":");
  for (const Row& r : rows) {
    bool same = true;
    // without a cache a generation is O(T^2) work and long enough to time once, with no warm-up
    const bool once = r.mode == Mode::no_cache;
    double secs = bench::median_seconds([&] { same = same && generate(m, n, r.mode) == reference; }, once ? 1 : reps,
                                        once ? 0 : 1);
    const double tps = double(n) / secs;
    if (r.mode == Mode::no_cache) no_cache_tps = tps;
    fmt::print("| {:<32} | {:>9.3f} | {:>9.1f} | {:>10.2f}x | {:>10} |\n", r.name, secs, tps, tps / no_cache_tps,
               same ? "yes" : "NO");
  }

  // The cache's own work for one layer's k, v (1, heads, 1, d / heads) per token, without the model:
  // cat() copies every cached position per token, the preallocated cache only the new one. The
  // last row adds the contiguous copy scaled_dot_product_attention makes of the strided views.
  const int64_t hs = d / heads;
  std::vector<Tensor> ks;
  for (int64_t t = 0; t < n; ++t) ks.push_back(randn({1, heads, 1, hs}, DType::f32, &gen));
  NoGradGuard no_grad;
  auto cat_appends = [&] {
    Tensor k, v;
    for (const Tensor& kn : ks) {
      if (k.defined()) k = cat({k, kn}, 2), v = cat({v, kn}, 2);
      else k = kn, v = kn;
    }
  };
  auto cache_appends = [&](bool contiguous) {
    nn::KVCache cache(n);
    for (const Tensor& kn : ks) {
      auto [k, v] = cache.append(kn, kn);
      if (contiguous) k.contiguous(), v.contiguous();
    }
  };
  fmt::print("\nthe cache alone: appending {} tokens of k, v [1, {}, 1, {}] (one layer)\n", n, heads, hs);
  fmt::print("| {:<40} | {:>13} |\n", "variant", "us per token");
  fmt::print("|{:-<42}|{:->15}|\n", "", ":");
  const std::pair<const char*, std::function<void()>> appends[] = {
      {"cat() cache", cat_appends},
      {"preallocated cache", [&] { cache_appends(false); }},
      {"preallocated cache + contiguous() copy", [&] { cache_appends(true); }}};
  for (const auto& [name, fn] : appends)
    fmt::print("| {:<40} | {:>13.2f} |\n", name, 1e6 * bench::median_seconds(fn, 5 * reps, 1) / double(n));
  return 0;
}
