#include "apps/imagetext/lib.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>

#include <fmt/core.h>

#include "apps/common/diagnose.h"
#include "apps/common/plot.h"
#include "autograd/ops.h"
#include "autograd/tape.h"
#include "core/error.h"
#include "data/loader.h"
#include "dist/dist.h"

namespace ag::apps {

// ---- the run's config --------------------------------------------------------------------------

nlohmann::json imagetext_config_to_json(const ImageTextRunConfig& c) {
  const ImageTextConfig& m = c.model;
  return {{"layout", c.scenes.layout},       {"min_items", c.scenes.min_items}, {"max_items", c.scenes.max_items},
          {"item_size", c.scenes.item_size}, {"val_images", c.val_images},      {"val_scenes", c.val_scenes},
          {"test_scenes", c.test_scenes},    {"scene_seed", c.scene_seed},      {"label_smoothing", c.label_smoothing},
          {"image_h", m.image_h},            {"image_w", m.image_w},            {"channels", m.channels},
          {"patch", m.patch},                {"vocab", m.vocab},                {"max_len", m.max_len},
          {"d_model", m.d_model},            {"n_heads", m.n_heads},            {"enc_layers", m.enc_layers},
          {"dec_layers", m.dec_layers},      {"mlp_hidden", m.mlp_hidden},      {"dropout", m.dropout}};
}

ImageTextRunConfig imagetext_config_from_json(const nlohmann::json& j) {
  ImageTextRunConfig c;
  c.scenes.layout = config_value<std::string>(j, "layout", "imagetext");
  c.scenes.min_items = config_value<int64_t>(j, "min_items", "imagetext");
  c.scenes.max_items = config_value<int64_t>(j, "max_items", "imagetext");
  c.scenes.item_size = config_value<int64_t>(j, "item_size", "imagetext");
  c.val_images = config_value<int64_t>(j, "val_images", "imagetext");
  c.val_scenes = config_value<int64_t>(j, "val_scenes", "imagetext");
  c.test_scenes = config_value<int64_t>(j, "test_scenes", "imagetext");
  c.scene_seed = config_value<uint64_t>(j, "scene_seed", "imagetext");
  c.label_smoothing = config_value<double>(j, "label_smoothing", "imagetext");
  ImageTextConfig& m = c.model;
  m.image_h = config_value<int64_t>(j, "image_h", "imagetext");
  m.image_w = config_value<int64_t>(j, "image_w", "imagetext");
  m.channels = config_value<int64_t>(j, "channels", "imagetext");
  m.patch = config_value<int64_t>(j, "patch", "imagetext");
  m.vocab = config_value<int64_t>(j, "vocab", "imagetext");
  m.max_len = config_value<int64_t>(j, "max_len", "imagetext");
  m.d_model = config_value<int64_t>(j, "d_model", "imagetext");
  m.n_heads = config_value<int64_t>(j, "n_heads", "imagetext");
  m.enc_layers = config_value<int64_t>(j, "enc_layers", "imagetext");
  m.dec_layers = config_value<int64_t>(j, "dec_layers", "imagetext");
  m.mlp_hidden = config_value<int64_t>(j, "mlp_hidden", "imagetext");
  m.dropout = config_value<double>(j, "dropout", "imagetext");
  check_scene_config(c.scenes);
  return c;
}

void fit_scenes_to_data(SceneConfig& s, const data::ImageDataset& items, int64_t patch) {
  check(items.channels == 1 && items.height == items.width && items.height >= 1,
        "imagetext: expected square grey item images, got {}x{}x{}", items.channels, items.height, items.width);
  check(patch >= 1 && items.height % patch == 0,
        "imagetext: --patch {} does not divide the {}x{} item images (a patch would straddle two items)", patch,
        items.height, items.width);
  s.item_size = items.height;
}

void fit_model_to_scenes(ImageTextConfig& m, const SceneConfig& s) {
  m.image_h = s.height(), m.image_w = s.width(), m.channels = 1;
  m.vocab = caption_vocab_size();
  m.max_len = s.text_len();
}

void validate_imagetext_config(const ImageTextRunConfig& c) {
  const ImageTextConfig& m = c.model;
  const SceneConfig& s = c.scenes;
  usage_check(s.layout == "row" || s.layout == "grid", "imagetext: --layout '{}': expected row or grid", s.layout);
  usage_check(s.min_items >= 1 && s.max_items >= s.min_items,
              "imagetext: --min-items {} and --max-items {}: expected 1 <= min-items <= max-items", s.min_items,
              s.max_items);
  usage_check(s.max_items <= (s.layout == "grid" ? 4 : 8),
              "imagetext: --max-items {}: layout {} has room for at most {} items", s.max_items, s.layout,
              s.layout == "grid" ? 4 : 8);
  usage_check(m.patch >= 1 && m.d_model >= 1 && m.n_heads >= 1 && m.enc_layers >= 1 && m.dec_layers >= 1 &&
                  m.mlp_hidden >= 1,
              "imagetext: --patch {}, --d-model {}, --heads {}, --enc-layers {}, --dec-layers {}, --mlp {}: every "
              "size must be at least 1",
              m.patch, m.d_model, m.n_heads, m.enc_layers, m.dec_layers, m.mlp_hidden);
  usage_check(s.item_size % m.patch == 0,
              "imagetext: --patch {} does not divide the {}x{} items (so a patch would straddle two items; try 4, 7 "
              "or 14)",
              m.patch, s.item_size, s.item_size);
  usage_check(m.d_model % m.n_heads == 0,
              "imagetext: --heads {} does not divide --d-model {} (each head gets d-model/heads)", m.n_heads,
              m.d_model);
  usage_check(c.val_scenes >= 1 && c.test_scenes >= 1, "imagetext: --val-scenes {} and --test-scenes {} must be >= 1",
              c.val_scenes, c.test_scenes);
  usage_check(c.val_images == -1 || c.val_images >= 1,
              "imagetext: --val-images {}: expected at least 1 (the validation scenes' source), or -1: {}% of the "
              "training set, at most {}",
              c.val_images, kValPercent, kValCap);
  usage_check(c.label_smoothing >= 0 && c.label_smoothing < 1,
              "imagetext: --label-smoothing {}: expected a value in [0, 1)", c.label_smoothing);
}

// ---- data --------------------------------------------------------------------------------------

ImageTextData load_imagetext_data(const std::string& dir, int64_t val_images) {
  data::ImageSplits splits = data::load_fashion_mnist(dir.empty() ? data::kFashionMnistDir : dir);
  val_images = validation_size(val_images, splits.train.size(), "--val-images");
  data::HeldOut h = data::hold_out(splits.train, val_images, 20261206);  // fixed: the same split every run
  ImageTextData d;
  d.train = std::move(h.rest), d.val = std::move(h.held), d.test = std::move(splits.test);
  d.norm = data::channel_stats(d.train);  // of the items; blank canvas parts normalise the same way
  return d;
}

std::vector<Scene> train_scenes(const data::ImageDataset& train, const ImageTextRunConfig& c, int64_t global_batch,
                                int64_t step, int rank, int ranks) {
  const data::Range r = data::shard(global_batch, rank, ranks);
  return compose_scenes(train, c.scenes, c.scene_seed, SceneSplit::train,
                        uint64_t(step) * uint64_t(global_batch) + uint64_t(r.begin), r.size());
}

// ---- training ----------------------------------------------------------------------------------

Tensor caption_loss(ImageText& model, const SceneBatch& batch, double label_smoothing, double tokens) {
  const Tensor logits = model.forward(batch.images, batch.input);  // (B, T, V)
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  const Tensor target = batch.target.reshape({B * T}).to(logits.device());
  if (tokens <= 0) return cross_entropy(logits.reshape({B * T, V}), target, "mean", -100, label_smoothing);
  return mul(cross_entropy(logits.reshape({B * T, V}), target, "sum", -100, label_smoothing), 1.0 / tokens);
}

int64_t caption_token_count(std::span<const Scene> scenes) {
  int64_t n = 0;
  for (const Scene& s : scenes) n += int64_t(s.labels.size()) + 1;
  return n;
}

TrainBatch train_batch(const ImageTextData& data, const ImageTextRunConfig& c, int64_t global_batch, int64_t step,
                       int rank, int ranks) {
  const std::vector<Scene> scenes = train_scenes(data.train, c, global_batch, step, rank, ranks);
  TrainBatch b{make_scene_batch(data.train, c.scenes, scenes, data.norm), int64_t(scenes.size()), 0};
  b.loss_tokens = ranks == 1 ? double(b.batch.words)
                             : double(caption_token_count(train_scenes(data.train, c, global_batch, step))) / ranks;
  return b;
}

double forward_backward(ImageText& model, optim::Optimizer& opt, const TrainBatch& b, double label_smoothing,
                        double loss_scale) {
  model.train();
  return compute_gradients(opt, caption_loss(model, b.batch, label_smoothing, b.loss_tokens), loss_scale);
}

// ---- generation --------------------------------------------------------------------------------

namespace {

// argmax over the last axis of logits (B, 1, V) (or (B, V)): one id per row, the lowest on ties.
std::vector<int64_t> argmax_rows(const Tensor& logits) {
  const int64_t V = logits.size(-1);
  return argmax(logits.reshape({-1, V}), 1).to(Device::cpu()).to_vector<int64_t>();
}

}  // namespace

std::vector<std::vector<int64_t>> greedy_captions(ImageText& model, const Tensor& images, CaptionCache cache) {
  InferenceScope scope(model);  // eval mode, no tape (the mode is restored)
  return greedy_captions_from(model, model.encode(images), cache);  // (B, Tk, d): once per image
}

std::vector<std::vector<int64_t>> greedy_captions_from(ImageText& model, const Tensor& memory, CaptionCache cache) {
  const int64_t B = memory.size(0), T = model.cfg.max_len;
  std::vector<nn::ContextKV> kv;  // (B, NH, Tk, hs) per block
  if (cache == CaptionCache::full) kv = model.context_kv(memory);  // once
  std::vector<nn::KVCache> caches;
  for (int64_t l = 0; l < model.cfg.dec_layers; ++l) caches.emplace_back(T);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(B));
  std::vector<int64_t> seq(size_t(B), kBos);  // (B, t + 1) row-major: the tokens fed so far
  std::vector<char> done(size_t(B), 0);
  for (int64_t t = 0; t < T; ++t) {
    Tensor logits;
    if (cache != CaptionCache::none) {  // only the newest token: the caches hold positions 0 .. t - 1
      std::vector<int64_t> last(static_cast<size_t>(B));
      for (int64_t b = 0; b < B; ++b) last[size_t(b)] = seq[size_t(b * (t + 1) + t)];
      if (cache == CaptionCache::text_only) kv = model.context_kv(memory);  // again at every step
      logits = model.decode(from_vector<int64_t>(last, {B, 1}), kv, &caches);  // (B, 1, V)
    } else {  // the reference: the whole prefix, the memory projected again
      logits = model.decode(from_vector<int64_t>(seq, {B, t + 1}), memory).narrow(1, t, 1);
    }
    const std::vector<int64_t> next = argmax_rows(logits);
    std::vector<int64_t> grown(size_t(B * (t + 2)));
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      if (!done[size_t(b)]) {
        out[size_t(b)].push_back(next[size_t(b)]);
        done[size_t(b)] = next[size_t(b)] == kEos;
      }
      all_done = all_done && done[size_t(b)];
      std::copy_n(seq.begin() + b * (t + 1), t + 1, grown.begin() + b * (t + 2));
      grown[size_t(b * (t + 2) + t + 1)] = next[size_t(b)];
    }
    seq = std::move(grown);
    if (all_done) break;
  }
  return out;
}

double CaptionEval::exact_match_of(int64_t n) const {
  if (n < 0 || n >= int64_t(scenes_by_items.size()) || scenes_by_items[size_t(n)] == 0)
    return std::numeric_limits<double>::quiet_NaN();
  return double(exact_by_items[size_t(n)]) / double(scenes_by_items[size_t(n)]);
}

CaptionEval evaluate_captions(ImageText& model, const data::ImageDataset& source, const SceneConfig& sc,
                              const std::vector<Scene>& scenes, const data::Normalization& norm, int64_t batch,
                              bool sharded) {
  check(batch >= 1, "imagetext: evaluation batch must be >= 1, got {}", batch);
  check(!scenes.empty(), "imagetext: nothing to evaluate: no scenes");
  InferenceScope scope(model);  // eval mode, no tape (the mode is restored)
  const std::vector<int64_t> mine =
      sharded ? eval_part(int64_t(scenes.size()), dist::rank(), dist::world_size())
              : eval_part(int64_t(scenes.size()), 0, 1);
  // sums: loss, tokens, correct tokens, exact, true words, correct words, scenes, then scenes and
  // exact ones by item count 0 .. max_items
  const size_t K = size_t(sc.max_items + 1);
  std::vector<double> s(7 + 2 * K, 0.0);
  for (size_t first = 0; first < mine.size(); first += size_t(batch)) {
    std::vector<Scene> part;
    for (size_t i = first; i < std::min(mine.size(), first + size_t(batch)); ++i)
      part.push_back(scenes[size_t(mine[i])]);
    const SceneBatch b = make_scene_batch(source, sc, part, norm);
    const Tensor memory = model.encode(b.images);            // (B, Tk, d): for both passes below
    const Tensor logits = model.decode(b.input, memory);     // (B, T, V), teacher forcing
    const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
    const Tensor target = b.target.reshape({B * T});
    s[0] += cross_entropy(logits.reshape({B * T, V}), target.to(logits.device()), "sum").item<double>();
    const std::vector<int64_t> pred = argmax_rows(logits), truth = target.to_vector<int64_t>();
    for (size_t i = 0; i < truth.size(); ++i)
      if (truth[i] != -100) s[1] += 1, s[2] += pred[i] == truth[i];
    const std::vector<std::vector<int64_t>> gen = greedy_captions_from(model, memory);
    for (size_t k = 0; k < part.size(); ++k) {
      std::vector<int64_t> want = caption_tokens(part[k]);
      want.erase(want.begin());  // the words and <eos>, as generated
      const size_t n = part[k].labels.size();
      const bool exact = gen[k] == want;
      s[3] += exact;
      for (size_t w = 0; w < n; ++w) s[4] += 1, s[5] += w < gen[k].size() && gen[k][w] == want[w];
      s[6] += 1;
      s[7 + n] += 1, s[7 + K + n] += exact;
    }
  }
  if (sharded) sum_over_ranks(s);
  CaptionEval e;
  e.loss = s[0] / s[1], e.token_accuracy = s[2] / s[1], e.exact_match = s[3] / s[6], e.word_accuracy = s[5] / s[4];
  e.scenes = int64_t(s[6]);
  for (size_t n = 0; n < K; ++n)
    e.scenes_by_items.push_back(int64_t(s[7 + n])), e.exact_by_items.push_back(int64_t(s[7 + K + n]));
  return e;
}

// ---- retrieval ---------------------------------------------------------------------------------

std::vector<double> caption_scores(ImageText& model, const Tensor& images,
                                   const std::vector<std::vector<int64_t>>& captions) {
  check(!captions.empty() && images.ndim() == 4 && images.size(0) >= 1,
        "imagetext: caption_scores needs images (B, C, H, W) and captions, got {} and {} captions", images.shape(),
        captions.size());
  InferenceScope scope(model);  // eval mode, no tape (the mode is restored)
  const int64_t Bi = images.size(0), Bc = int64_t(captions.size()), T = model.cfg.max_len;
  // the candidates' teacher-forcing input and target (Bc, T), as make_scene_batch lays them out
  std::vector<int64_t> input(size_t(Bc * T), kPad), target(size_t(Bc * T), -100);
  for (int64_t j = 0; j < Bc; ++j) {
    const auto& c = captions[size_t(j)];
    check(c.size() >= 2 && int64_t(c.size()) <= T + 1 && c.front() == kBos && c.back() == kEos,
          "imagetext: candidate caption {} must be [<bos> words <eos>] of at most {} tokens", j, T + 1);
    for (size_t t = 0; t + 1 < c.size(); ++t) input[size_t(j * T) + t] = c[t], target[size_t(j * T) + t] = c[t + 1];
  }
  const Tensor idx = from_vector<int64_t>(input, {Bc, T});
  const Tensor tgt = from_vector<int64_t>(target, {Bc * T});
  const Tensor memory = model.encode(images);                      // every image encoded once
  const std::vector<nn::ContextKV> kv = model.context_kv(memory);  // and projected once per block
  std::vector<double> S(size_t(Bi * Bc));
  for (int64_t i = 0; i < Bi; ++i) {
    // image i's keys and values for all Bc captions: (1, NH, Tk, hs) expanded to (Bc, NH, Tk, hs), a view
    std::vector<nn::ContextKV> kv_i;
    for (const nn::ContextKV& l : kv) {
      Shape sh = l.k.shape();
      sh[0] = Bc;
      kv_i.push_back({l.k.narrow(0, i, 1).expand(sh), l.v.narrow(0, i, 1).expand(sh)});
    }
    const Tensor logits = model.decode(idx, kv_i);  // (Bc, T, V)
    // -log p(c_t | image, c_<t) per position (0 where ignored), summed over each caption's positions
    const Tensor nll = cross_entropy(logits.reshape({Bc * T, logits.size(2)}), tgt.to(logits.device()), "none");
    const std::vector<double> row = sum(nll.reshape({Bc, T}), {1}).to(DType::f64).to(Device::cpu()).to_vector<double>();
    for (int64_t j = 0; j < Bc; ++j) S[size_t(i * Bc + j)] = -row[size_t(j)];
  }
  return S;
}

RetrievalResult recall_at(const std::vector<double>& S, int64_t n, const std::vector<std::vector<int64_t>>& captions) {
  check(n >= 1 && int64_t(S.size()) == n * n && int64_t(captions.size()) == n,
        "imagetext: recall_at expects an {0} x {0} score matrix and {0} captions, got {1} scores and {2} captions", n,
        S.size(), captions.size());
  RetrievalResult r;
  r.queries = n, r.candidates = n;
  auto score = [&](int64_t i, int64_t j) { return S[size_t(i * n + j)]; };
  for (int64_t q = 0; q < n; ++q) {
    // image q ranks the captions: its match score is the best over the captions equal to its own
    double best_i2t = -std::numeric_limits<double>::infinity(), best_t2i = best_i2t;
    for (int64_t j = 0; j < n; ++j)
      if (captions[size_t(j)] == captions[size_t(q)])
        best_i2t = std::max(best_i2t, score(q, j)), best_t2i = std::max(best_t2i, score(j, q));
    int64_t rank_i2t = 0, rank_t2i = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (captions[size_t(j)] == captions[size_t(q)]) continue;
      rank_i2t += score(q, j) > best_i2t;  // a wrong caption above the right one (image q's row)
      rank_t2i += score(j, q) > best_t2i;  // a wrong image above the right one (caption q's column)
    }
    r.i2t_r1 += rank_i2t < 1, r.i2t_r5 += rank_i2t < 5, r.t2i_r1 += rank_t2i < 1, r.t2i_r5 += rank_t2i < 5;
  }
  r.i2t_r1 /= double(n), r.i2t_r5 /= double(n), r.t2i_r1 /= double(n), r.t2i_r5 /= double(n);
  return r;
}

RetrievalResult retrieval(ImageText& model, const data::ImageDataset& source, const SceneConfig& sc,
                          const std::vector<Scene>& scenes, const data::Normalization& norm, int64_t candidates) {
  check(candidates >= 2 && candidates <= int64_t(scenes.size()),
        "imagetext: --retrieval-candidates {} must be in [2, {}] (the test scenes)", candidates, scenes.size());
  RetrievalResult total;
  const int64_t groups = int64_t(scenes.size()) / candidates;
  for (int64_t g = 0; g < groups; ++g) {
    const std::vector<Scene> part(scenes.begin() + g * candidates, scenes.begin() + (g + 1) * candidates);
    const SceneBatch b = make_scene_batch(source, sc, part, norm);
    std::vector<std::vector<int64_t>> captions;
    for (const Scene& s : part) captions.push_back(caption_tokens(s));
    const RetrievalResult r = recall_at(caption_scores(model, b.images, captions), candidates, captions);
    const double w = double(r.queries);
    total.i2t_r1 += r.i2t_r1 * w, total.i2t_r5 += r.i2t_r5 * w, total.t2i_r1 += r.t2i_r1 * w,
        total.t2i_r5 += r.t2i_r5 * w;
    total.queries += r.queries;
  }
  const double q = double(total.queries);
  total.i2t_r1 /= q, total.i2t_r5 /= q, total.t2i_r1 /= q, total.t2i_r5 /= q;
  total.candidates = candidates;
  return total;
}

// ---- cross-attention ---------------------------------------------------------------------------

std::vector<Tensor> cross_attention(ImageText& model, const Tensor& images, const Tensor& tokens) {
  InferenceScope scope(model);  // eval mode, no tape (the mode is restored)
  const Tensor memory = model.encode(images);  // outside the capture: the encoder's self-attention is not wanted
  nn::AttentionCapture capture;
  model.decode(tokens, memory);
  std::vector<Tensor> out;
  for (const auto& block : *model.dec_blocks)
    for (const auto& e : capture.entries())
      if (e.module == block->cross_attn.get()) out.push_back(e.weights.to(DType::f32).to(Device::cpu()));
  check(int64_t(out.size()) == model.cfg.dec_layers, "imagetext: captured {} cross-attentions for {} blocks",
        out.size(), model.cfg.dec_layers);
  return out;  // (B, NH, T, Tk) per block
}

WordItemShare word_item_share_of(const std::vector<Tensor>& weights, const std::vector<int64_t>& slot,
                                 std::span<const Scene> scenes) {
  check(!weights.empty() && weights[0].ndim() == 4 && int64_t(scenes.size()) == weights[0].size(0),
        "imagetext: expected one (B, NH, T, Tk) cross-attention per block for {} scenes", scenes.size());
  const int64_t L = int64_t(weights.size()), NH = weights[0].size(1), T = weights[0].size(2), Tk = weights[0].size(3);
  const int64_t N = int64_t(slot.size());
  check(Tk == N + 1, "imagetext: {} keys for {} patches and the class token", Tk, N);
  std::vector<std::vector<double>> v;
  for (const Tensor& t : weights) {
    check(t.shape() == weights[0].shape(), "imagetext: cross-attentions of shapes {} and {}", t.shape(),
          weights[0].shape());
    v.push_back(t.to(DType::f64).to_vector<double>());
  }
  WordItemShare r;
  r.per_block.assign(size_t(L), 0.0);
  for (size_t k = 0; k < scenes.size(); ++k) {
    const int64_t n = int64_t(scenes[k].labels.size());
    check(n <= T, "imagetext: a scene of {} items for {} text positions", n, T);
    for (int64_t word = 1; word <= n; ++word) {
      const int64_t q = word - 1;  // the query that produced word `word`
      std::vector<double> mean_mass(size_t(n), 0.0);
      for (int64_t l = 0; l < L; ++l) {
        // mass[m] = (1/NH) sum_h sum_{patches p in slot m} w[k, h, q, 1 + p]   (key 0: the class token)
        std::vector<double> mass(size_t(n), 0.0);
        for (int64_t h = 0; h < NH; ++h) {
          const double* row = v[size_t(l)].data() + ((int64_t(k) * NH + h) * T + q) * Tk;
          r.cls_mass += row[0] / double(NH * L);
          for (int64_t p = 0; p < N; ++p)
            if (slot[size_t(p)] < n) mass[size_t(slot[size_t(p)])] += row[1 + p] / double(NH);
        }
        r.per_block[size_t(l)] += std::max_element(mass.begin(), mass.end()) - mass.begin() == q;
        for (int64_t m = 0; m < n; ++m) mean_mass[size_t(m)] += mass[size_t(m)] / double(L);
      }
      r.share += std::max_element(mean_mass.begin(), mean_mass.end()) - mean_mass.begin() == q;
      r.chance += 1.0 / double(n);
      r.words += 1;
    }
  }
  const double W = double(std::max<int64_t>(r.words, 1));
  r.share /= W, r.chance /= W, r.cls_mass /= W;
  for (double& s : r.per_block) s /= W;
  return r;
}

WordItemShare word_item_share(ImageText& model, const data::ImageDataset& source, const SceneConfig& sc,
                              const std::vector<Scene>& scenes, const data::Normalization& norm, int64_t batch) {
  check(batch >= 1 && !scenes.empty(), "imagetext: word_item_share needs scenes and a batch >= 1");
  const std::vector<int64_t> slot = patch_slots(sc, model.cfg.patch);
  WordItemShare total;
  total.per_block.assign(size_t(model.cfg.dec_layers), 0.0);
  for (size_t first = 0; first < scenes.size(); first += size_t(batch)) {
    const std::span<const Scene> part(scenes.data() + first, std::min(scenes.size() - first, size_t(batch)));
    const SceneBatch b = make_scene_batch(source, sc, part, norm);
    const WordItemShare r = word_item_share_of(cross_attention(model, b.images, b.input), slot, part);
    // the batch's shares weighted by its words: sums over all words
    const double w = double(r.words);
    total.share += r.share * w, total.chance += r.chance * w, total.cls_mass += r.cls_mass * w;
    for (size_t l = 0; l < r.per_block.size(); ++l) total.per_block[l] += r.per_block[l] * w;
    total.words += r.words;
  }
  const double W = double(total.words);
  total.share /= W, total.chance /= W, total.cls_mass /= W;
  for (double& s : total.per_block) s /= W;
  return total;
}

std::string attention_svg(ImageText& model, const data::ImageDataset& source, const SceneConfig& sc,
                          const std::vector<Scene>& scenes, const data::Normalization& norm) {
  check(!scenes.empty(), "imagetext: attention_svg needs scenes");
  const int64_t P = model.cfg.patch, gh = sc.height() / P, gw = sc.width() / P, N = gh * gw;
  const int scale = sc.width() > 64 ? 3 : 5;
  std::vector<std::string> rows;
  for (const Scene& scene : scenes) {
    const SceneBatch b = make_scene_batch(source, sc, std::span<const Scene>(&scene, 1), norm);
    const std::vector<int64_t> gen = greedy_captions(model, b.images).at(0);
    const std::vector<int64_t> words = caption_words_of(gen);
    const Image image = image_from_u8(scene_pixels(source, sc, scene).data(), 1, int(sc.height()), int(sc.width()));
    const std::string head_line = fmt::format("true: {} | generated: {}", caption_text(scene.labels),
                                              words.empty() ? std::string("(nothing)") : decode_caption(gen));
    OverlayOptions o;
    o.scale = scale, o.plain = false;  // one drawing of the scene per word: the overlay only
    if (words.empty()) {  // no word to show a map for: the scene under a zero map, and the captions
      o.title = head_line;
      rows.push_back(svg_image_overlay(image, std::vector<double>(size_t(N), 0.0), int(gh), int(gw), o));
      continue;
    }
    // the generated words fed back: row t of the weights is the query that produced word t + 1
    std::vector<int64_t> in = {kBos};
    in.insert(in.end(), words.begin(), words.end() - 1);
    const int64_t T = int64_t(in.size());
    const std::vector<Tensor> w = cross_attention(model, b.images, from_vector<int64_t>(in, {1, T}));
    const int64_t L = int64_t(w.size()), NH = w[0].size(1), Tk = w[0].size(3);
    std::vector<std::vector<float>> v;
    for (const Tensor& t : w) v.push_back(t.contiguous().to_vector<float>());
    std::vector<std::string> overlays;
    std::vector<Heatmap> heads;  // the last block's heads, word by word, on the patch grid
    for (int64_t t = 0; t < T; ++t) {
      const std::string word = caption_words()[size_t(words[size_t(t)] - kFirstWord)];
      // (1 / (L NH)) sum over blocks and heads of row t, patches only (key 0 is the class token)
      std::vector<double> mean_grid(size_t(N), 0.0);
      double cls = 0;
      for (int64_t l = 0; l < L; ++l)
        for (int64_t h = 0; h < NH; ++h) {
          const float* row = v[size_t(l)].data() + (h * T + t) * Tk;
          cls += row[0] / double(L * NH);
          for (int64_t p = 0; p < N; ++p) mean_grid[size_t(p)] += row[1 + p] / double(L * NH);
        }
      o.title = fmt::format("{}word {} '{}': mean of {} heads x {} blocks (class token {:.2f})",
                            t == 0 ? head_line + " | " : "", t + 1, word, NH, L, cls);
      overlays.push_back(svg_image_overlay(image, mean_grid, int(gh), int(gw), o));
      for (int64_t h = 0; h < NH; ++h) {
        const float* row = v[size_t(L - 1)].data() + (h * T + t) * Tk;
        Heatmap m;
        m.title = fmt::format("'{}': block {} head {}", word, L - 1, h);
        m.rows = int(gh), m.cols = int(gw);
        m.values.assign(row + 1, row + 1 + N);
        heads.push_back(std::move(m));
      }
    }
    HeatmapOptions ho;
    ho.columns = int(NH), ho.cell = 10;
    ho.title = "each head of the last block, over the patch grid";
    rows.push_back(svg_grid({svg_grid(overlays, 1), svg_heatmaps(heads, ho)}, 2));
  }
  return svg_grid(rows, 1);
}

// ---- the test scenes, once, at the end ---------------------------------------------------------

TestFigures test_model(ImageText& model, const ImageTextRunConfig& c, const ImageTextData& data, const TestOptions& t,
                       const std::string& dir, bool sharded) {
  const std::vector<Scene> test =
      compose_scenes(data.test, c.scenes, c.scene_seed, SceneSplit::test, 0, c.test_scenes);
  TestFigures f;
  f.captions = evaluate_captions(model, data.test, c.scenes, test, data.norm, t.eval_batch, sharded);
  if (!dist::is_main()) return f;  // the rest is rank 0's (no collectives)
  f.retrieval = retrieval(model, data.test, c.scenes, test, data.norm,
                          std::min<int64_t>(t.retrieval_candidates, int64_t(test.size())));
  f.share = word_item_share(model, data.test, c.scenes, test, data.norm, t.eval_batch);
  std::filesystem::create_directories(dir);
  const std::vector<Scene> drawn(test.begin(), test.begin() + std::min<int64_t>(t.attention_scenes, int64_t(test.size())));
  write_file_atomic(dir + "/attention.svg", attention_svg(model, data.test, c.scenes, drawn, data.norm));
  return f;
}

std::string figures_text(const TestFigures& f, const SceneConfig& sc, const std::string& dir) {
  std::string by;
  for (int64_t n = sc.min_items; n <= sc.max_items; ++n)
    by += fmt::format("{}{} items {:.1f}% ({})", by.empty() ? "" : ", ", n, 100 * f.captions.exact_match_of(n),
                      f.captions.scenes_by_items[size_t(n)]);
  std::string blocks;
  for (size_t l = 0; l < f.share.per_block.size(); ++l)
    blocks += fmt::format("{}block {} {:.1f}%", l ? ", " : "", l, 100 * f.share.per_block[l]);
  return fmt::format(
      "test scenes: {}\n"
      "  exact caption match {:.2f}% ({}); word accuracy {:.2f}%; token accuracy {:.2f}%; loss {:.4f}\n"
      "  retrieval among {} candidates, by caption log-likelihood: image->text R@1 {:.2f}% R@5 {:.2f}%, "
      "text->image R@1 {:.2f}% R@5 {:.2f}%\n"
      "  word-to-item cross-attention: {:.1f}% of {} words look most at the item they name (chance {:.1f}%; "
      "{}; class token mass {:.2f})\n"
      "  attention maps: {}/attention.svg",
      f.captions.scenes, 100 * f.captions.exact_match, by, 100 * f.captions.word_accuracy,
      100 * f.captions.token_accuracy, f.captions.loss, f.retrieval.candidates, 100 * f.retrieval.i2t_r1,
      100 * f.retrieval.i2t_r5, 100 * f.retrieval.t2i_r1, 100 * f.retrieval.t2i_r5, 100 * f.share.share,
      f.share.words, 100 * f.share.chance, blocks, f.share.cls_mass, dir);
}

void fill_report(RunReport& report, const TestFigures& f, const SceneConfig& sc) {
  report.accuracy = f.captions.exact_match;
  report.extra = {{"test_exact_match", f.captions.exact_match},
                  {"test_word_accuracy", f.captions.word_accuracy},
                  {"test_token_accuracy", f.captions.token_accuracy},
                  {"test_loss", f.captions.loss},
                  {"test_scenes", double(f.captions.scenes)}};
  for (int64_t n = sc.min_items; n <= sc.max_items; ++n)
    report.extra.emplace_back(fmt::format("test_exact_match_{}_items", n), f.captions.exact_match_of(n));
  if (!dist::is_main()) return;
  report.extra.insert(report.extra.end(), {{"retrieval_candidates", double(f.retrieval.candidates)},
                                           {"image_to_text_r1", f.retrieval.i2t_r1},
                                           {"image_to_text_r5", f.retrieval.i2t_r5},
                                           {"text_to_image_r1", f.retrieval.t2i_r1},
                                           {"text_to_image_r5", f.retrieval.t2i_r5},
                                           {"word_item_share", f.share.share},
                                           {"word_item_share_chance", f.share.chance},
                                           {"cross_attention_class_token_mass", f.share.cls_mass}});
  for (size_t l = 0; l < f.share.per_block.size(); ++l)
    report.extra.emplace_back(fmt::format("word_item_share_block_{}", l), f.share.per_block[l]);
}

void diagnose(ImageText& model, const ImageTextRunConfig& c, const ImageTextData& data, int64_t batch,
              const std::string& dir) {
  const std::vector<Scene> scenes = compose_scenes(data.test, c.scenes, c.scene_seed, SceneSplit::test, 0,
                                                   std::min<int64_t>(batch, c.test_scenes));
  const SceneBatch b = make_scene_batch(data.test, c.scenes, scenes, data.norm);
  std::string path;
  const nn::AttentionReport r =
      write_attention_diagnostics(model, [&] { model.forward(b.images, b.input); }, dir, &path);
  fmt::print("attention diagnostics on {} test scenes:\n{}written to {}\n", scenes.size(), r.to_text(), path);
}

const std::vector<SavedOption>& imagetext_saved_options() {
  static const std::vector<SavedOption> options = {
      {"--layout", "/layout"},         {"--min-items", "/min_items"},     {"--max-items", "/max_items"},
      {"--patch", "/patch"},           {"--d-model", "/d_model"},         {"--heads", "/n_heads"},
      {"--enc-layers", "/enc_layers"}, {"--dec-layers", "/dec_layers"},   {"--mlp", "/mlp_hidden"},
      {"--val-images", "/val_images"}, {"--val-scenes", "/val_scenes"},   {"--test-scenes", "/test_scenes"},
      {"--scene-seed", "/scene_seed"}};
  return options;
}

}  // namespace ag::apps
