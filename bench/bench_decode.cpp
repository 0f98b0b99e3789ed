// Greedy decoding with a GPT-like stack: tokens/s with the preallocated KV cache (nn::KVCache),
// with the cat()-based cache it replaced (re-implemented below as the "before"), and without a
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
// --json prints one JSON line (no table) with the no-cache and preallocated-cache rows only, for
// bench/compare_pytorch (whose PyTorch side, bench/torch_reference.py generate, is the same model
// with a hand-written cache).
//
// Per generated token t, the attention of each layer reads the t cached positions either way; the
// caches differ in what they copy: cat() copies all t positions of k and v into a new tensor
// (O(T^2) bytes over T tokens), the preallocated cache writes only the new position (O(T)).
// Without a cache every step recomputes every position: O(T^2) matmul work.
#include <CLI/CLI.hpp>

#include <functional>
#include <utility>
#include <vector>

#include "apps/common/run.h"
#include "apps/imagetext/lib.h"
#include "attograd.h"
#include "bench/bench_util.h"
#include "nn/embedding.h"
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
    nn::BlockConfig config;  // field by field: a nested designated initializer trips GCC 12's
    config.attention.kv_heads = kv_heads;  // -Wmaybe-uninitialized on the inner std::string
    for (int64_t l = 0; l < layers; ++l)
      blocks.push_back(
          std::make_shared<nn::TransformerBlock>(d, heads, mlp, 0.0, true, false, DType::f32, g, config));
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

// The cache before preallocation: k = cat({k, k_new}, 2) at every step, through a block's own
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
  if (const int rc = ag::apps::parse_command_line(app, argc, argv, "bench_decode"); rc >= 0) return rc;
  if (threads > 0) set_num_threads(threads);
  const Precision prec = *parse_precision(precision);  // one of them: CLI::IsMember above
  const AutocastGuard autocast(prec);
  if (imagetext) return bench_imagetext(scenes, reps, json);
  const int64_t cache_bytes = prec == Precision::fp32 ? 4 : 2;  // per cached element
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
                      {"cat() cache (before)", Mode::cat_cache},
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
      {"cat() cache (before)", cat_appends},
      {"preallocated cache", [&] { cache_appends(false); }},
      {"preallocated cache + contiguous() copy", [&] { cache_appends(true); }}};
  for (const auto& [name, fn] : appends)
    fmt::print("| {:<40} | {:>13.2f} |\n", name, 1e6 * bench::median_seconds(fn, 5 * reps, 1) / double(n));
  return 0;
}
