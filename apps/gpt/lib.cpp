// The char-level GPT app's data, evaluation, sampling and attention plot (see lib.h).
#include "apps/gpt/lib.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <sstream>

#include <fmt/ranges.h>

#include "apps/common/run.h"
#include "attograd.h"
#include "data/text.h"

namespace ag::apps {

// ---- data --------------------------------------------------------------------------------------

std::optional<std::string> missing_gpt_data(const std::string& dataset, const std::string& text_file,
                                            const std::string& cache_dir, const std::string& fortune_root) {
  namespace fs = std::filesystem;
  if (!text_file.empty()) {
    if (fs::is_regular_file(text_file)) return std::nullopt;
    return fmt::format("--text-file '{}' does not exist or is not a file", text_file);
  }
  if (dataset == "bible") {
    if (fs::is_regular_file(cache_dir + "/bible-kjv.txt") || fs::exists("/usr/bin/bible")) return std::nullopt;
    return std::string("the King James Bible is missing: install Debian's bible-kjv (sudo apt-get install bible-kjv)");
  }
  if (dataset == "fortunes") {
    if (fs::is_regular_file(fortune_root + "/fortunes")) return std::nullopt;
    return fmt::format("the English fortunes are missing under {}: install Debian's fortunes "
                       "(sudo apt-get install fortunes)", fortune_root);
  }
  return std::nullopt;  // an unknown dataset is load_gpt_text's error
}

void validate_gpt_config(const GPTConfig& c, int64_t eval_windows, const SampleSettings& s) {
  usage_check(c.context >= 1 && c.context <= 4096, "gpt: --context {}: expected 1..4096 positions", c.context);
  usage_check(c.d_model >= 1 && c.n_heads >= 1 && c.n_layers >= 1 && c.mlp_hidden >= 1,
              "gpt: --d-model {}, --heads {}, --layers {}, --mlp {}: every size must be at least 1", c.d_model,
              c.n_heads, c.n_layers, c.mlp_hidden);
  usage_check(c.d_model % c.n_heads == 0, "gpt: --heads {} does not divide --d-model {} (each head gets d-model/heads)",
              c.n_heads, c.d_model);
  usage_check(c.kv_heads >= 0 && (c.kv_heads == 0 || c.n_heads % c.kv_heads == 0),
              "gpt: --kv-heads {} does not divide --heads {} (each key/value head serves heads/kv-heads query heads; "
              "0: --heads)",
              c.kv_heads, c.n_heads);
  usage_check(c.pos != "rope" || (c.d_model / c.n_heads) % 2 == 0,
              "gpt: --pos rope turns pairs of each head's dims: the head size --d-model/--heads = {} must be even",
              c.d_model / c.n_heads);
  usage_check(eval_windows >= 1, "gpt: --eval-windows {}: expected at least 1", eval_windows);
  usage_check(s.tokens >= 0, "gpt: --sample-tokens {}: expected >= 0", s.tokens);
  usage_check(s.temperature >= 0 && std::isfinite(s.temperature), "gpt: --temperature {}: expected >= 0 (0: greedy)",
              s.temperature);
  usage_check(s.top_k >= 0, "gpt: --top-k {}: expected >= 0 (0: all)", s.top_k);
  usage_check(s.seed >= -1, "gpt: --sample-seed {}: expected >= 0, or -1 for --seed", s.seed);
}

std::string load_gpt_text(const std::string& dataset, const std::string& text_file, const std::string& cache_dir,
                          const std::string& fortune_root) {
  if (!text_file.empty()) return data::read_text_file(text_file);
  if (dataset == "bible") return data::load_bible_kjv(cache_dir);
  if (dataset == "fortunes") return data::fortunes_english_text(fortune_root);
  throw Error(
      fmt::format("load_gpt_text: unknown dataset '{}' (expected bible or fortunes, or use --text-file)", dataset));
}

LMData make_lm_data(const std::string& text, double valid_fraction) {
  check(valid_fraction > 0 && valid_fraction < 1, "make_lm_data: valid_fraction {} is not in (0, 1)", valid_fraction);
  std::vector<uint32_t> cps = data::utf8_decode(text, "make_lm_data");
  const int64_t n = int64_t(cps.size());
  const int64_t k = int64_t(std::floor(double(n) * (1.0 - valid_fraction)));
  check(k >= 2 && n - k >= 2, "make_lm_data: a text of {} codepoints splits into {} train and {} validation; "
        "each needs at least 2", n, k, n - k);
  std::string train_text, valid_text;
  train_text.reserve(size_t(k));
  for (int64_t i = 0; i < k; ++i) data::utf8_append(train_text, cps[size_t(i)]);
  for (int64_t i = k; i < n; ++i) data::utf8_append(valid_text, cps[size_t(i)]);
  LMData d{data::CharTokenizer::from_text(train_text), {}, {}};
  d.train = d.tokenizer.encode(train_text);
  d.valid = d.tokenizer.encode(valid_text);
  return d;
}

nlohmann::json gpt_config_to_json(const GPTConfig& c) {
  nlohmann::json j = c;  // the keys of model.h's to_json
  const GPTConfig d;     // the choices at their defaults are left out (see model.h)
  if (c.pos == d.pos) j.erase("pos");
  if (c.kv_heads == d.kv_heads) j.erase("kv_heads");
  if (c.mlp_kind == d.mlp_kind) j.erase("mlp_kind");
  if (c.norm == d.norm) j.erase("norm");
  return j;
}

GPTConfig gpt_config_from_json(const nlohmann::json& j) {
  GPTConfig c;
  auto field = [&](const char* name, int64_t& v) {
    if (!j.is_object() || !j.contains(name) || !j[name].is_number_integer())
      fail("gpt config: field '{}' is missing or not an integer in {}", name, j.dump());
    v = j[name].get<int64_t>();
  };
  field("vocab", c.vocab), field("context", c.context), field("d_model", c.d_model);
  field("n_heads", c.n_heads), field("n_layers", c.n_layers), field("mlp_hidden", c.mlp_hidden);
  if (j.contains("dropout") && j["dropout"].is_number()) c.dropout = j["dropout"].get<double>();
  if (j.contains("kv_heads")) field("kv_heads", c.kv_heads);
  auto choice = [&](const char* name, std::string& v) {
    if (!j.contains(name)) return;
    const std::vector<std::string>& allowed = gpt_choices(name);
    const bool ok = j[name].is_string() &&
                    std::find(allowed.begin(), allowed.end(), j[name].get<std::string>()) != allowed.end();
    if (!ok) fail("gpt config: field '{}' is {}, expected one of {}", name, j[name].dump(), fmt::join(allowed, ", "));
    v = j[name].get<std::string>();
  };
  choice("pos", c.pos);
  choice("mlp_kind", c.mlp_kind);
  choice("norm", c.norm);
  return c;
}

// ---- evaluation --------------------------------------------------------------------------------

std::vector<int64_t> eval_starts(int64_t len, int64_t T, int64_t n) {
  check(T >= 1 && len >= T + 1, "eval_starts: a text of {} tokens is too short for windows of {} + 1", len, T);
  check(n >= 1, "eval_starts: {} windows asked for; need at least 1", n);
  std::vector<int64_t> starts(size_t(n), 0);
  const int64_t last = len - T - 1;
  for (int64_t i = 0; n > 1 && i < n; ++i) starts[size_t(i)] = i * last / (n - 1);
  return starts;
}

namespace {

// The last position's logits of logits (1, T, V), as V floats.
std::vector<float> last_logits(const Tensor& logits) {
  return logits.select(0, 0).select(0, logits.size(1) - 1).contiguous().to_vector<float>();
}

}  // namespace

std::vector<double> lm_loss_by_position(GPT& model, std::span<const int64_t> ids, const std::vector<int64_t>& starts,
                                        int64_t T, int64_t batch, bool sharded) {
  check(T >= 1 && model.cfg.has_positions(T),
        "lm_loss: window {} is outside [1, context {}] of a model with learned positions", T, model.cfg.context);
  check(batch >= 1, "lm_loss: batch {} must be positive", batch);
  check(!starts.empty(), "lm_loss: no windows");
  for (int64_t s : starts)
    check(s >= 0 && s + T + 1 <= int64_t(ids.size()), "lm_loss: window start {} + {} + 1 passes the end of {} tokens",
          s, T, ids.size());
  InferenceScope scope(model);
  std::vector<int64_t> mine;  // this rank's windows (all of them unless sharded)
  const int64_t n = int64_t(starts.size());
  for (int64_t i : sharded ? eval_part(n, dist::rank(), dist::world_size()) : eval_part(n, 0, 1))
    mine.push_back(starts[size_t(i)]);
  std::vector<double> total(size_t(T), 0.0);  // the loss summed over the windows, per position
  for (size_t b0 = 0; b0 < mine.size(); b0 += size_t(batch)) {
    const size_t nb = std::min(size_t(batch), mine.size() - b0);
    std::vector<int64_t> x(nb * size_t(T)), y(nb * size_t(T));
    for (size_t b = 0; b < nb; ++b)
      for (int64_t t = 0; t < T; ++t) {
        x[b * size_t(T) + size_t(t)] = ids[size_t(mine[b0 + b] + t)];
        y[b * size_t(T) + size_t(t)] = ids[size_t(mine[b0 + b] + t + 1)];
      }
    const int64_t N = int64_t(nb) * T;
    Tensor logits = model.forward(from_vector(x, {int64_t(nb), T}));
    const Tensor per_token =
        cross_entropy(logits.reshape({N, model.cfg.vocab}), from_vector(y, {N}, logits.device()), "none");
    const std::vector<double> sums = sum(per_token.reshape({int64_t(nb), T}).to(DType::f64), {0}).to_vector<double>();
    for (int64_t t = 0; t < T; ++t) total[size_t(t)] += sums[size_t(t)];
  }
  if (sharded) sum_over_ranks(total);
  for (double& v : total) v /= double(n);
  return total;
}

namespace {
// The mean over the window's positions of the loss by position: the mean over all of its targets,
// since every position has one target per window.
double mean_over_positions(const std::vector<double>& by_position) {
  return std::accumulate(by_position.begin(), by_position.end(), 0.0) / double(by_position.size());
}
}  // namespace

double lm_loss(GPT& model, std::span<const int64_t> ids, const std::vector<int64_t>& starts, int64_t T,
               int64_t batch, bool sharded) {
  return mean_over_positions(lm_loss_by_position(model, ids, starts, T, batch, sharded));
}

// ---- length extrapolation ----------------------------------------------------------------------

std::string length_eval_svg(const std::vector<nlohmann::json>& lines, int64_t block) {
  check(block >= 1, "length_eval_svg: block {} must be positive", block);
  std::vector<int64_t> lengths;
  for (const nlohmann::json& j : lines)
    if (j.contains("loss_by_position")) lengths.push_back(j.at("length").get<int64_t>());
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  std::vector<std::string> runs;  // a run keeps its colour in every chart: its place of first appearance
  for (const nlohmann::json& j : lines)
    if (std::find(runs.begin(), runs.end(), j.at("run").get<std::string>()) == runs.end())
      runs.push_back(j.at("run").get<std::string>());
  std::vector<LineChart> charts;
  for (int64_t L : lengths) {
    LineChart c;
    c.title = fmt::format("validation loss by position, windows of {}", L);
    c.x_label = "position in the window";
    c.y_label = fmt::format("loss (nats), mean of {} positions", block);
    for (const nlohmann::json& j : lines) {
      if (!j.contains("loss_by_position") || j.at("length").get<int64_t>() != L) continue;
      const auto v = j.at("loss_by_position").get<std::vector<double>>();
      Series sr;
      sr.name = fmt::format("{} (trained on {})", j.at("run").get<std::string>(), j.at("trained_context").get<int64_t>());
      sr.colour = int(std::find(runs.begin(), runs.end(), j.at("run").get<std::string>()) - runs.begin());
      for (size_t b0 = 0; b0 < v.size(); b0 += size_t(block)) {
        const size_t b1 = std::min(v.size(), b0 + size_t(block));
        sr.x.push_back(double(b0 + b1 - 1) / 2);
        sr.y.push_back(std::accumulate(v.begin() + long(b0), v.begin() + long(b1), 0.0) / double(b1 - b0));
      }
      c.series.push_back(std::move(sr));
    }
    charts.push_back(std::move(c));
  }
  check(!charts.empty(), "length_eval_svg: no line holds a loss_by_position");
  return svg_line_charts(charts, int(std::min<size_t>(charts.size(), 3)));
}

std::vector<nlohmann::json> evaluate_lengths(GPT& model, const std::string& name, std::span<const int64_t> ids,
                                             const std::vector<int64_t>& lengths, int64_t windows, int64_t batch,
                                             const std::string& jsonl, int64_t block) {
  std::vector<nlohmann::json> out;
  for (int64_t L : lengths) {
    nlohmann::json j = {{"run", name}, {"pos", model.cfg.pos}, {"trained_context", model.cfg.context}, {"length", L}};
    if (!model.cfg.has_positions(L)) {
      j["error"] = fmt::format("learned positions stop at the context of {}: no position past it to evaluate",
                               model.cfg.context);
      fmt::print("gpt: length {}: {}\n", L, j["error"].get<std::string>());
    } else {
      const std::vector<int64_t> starts = eval_starts(int64_t(ids.size()), L, windows);
      const std::vector<double> by_position = lm_loss_by_position(model, ids, starts, L, batch);
      const double loss = mean_over_positions(by_position);
      j["windows"] = windows, j["loss"] = loss, j["loss_by_position"] = by_position;
      fmt::print("gpt: length {}: validation loss {:.4f} over {} windows ({} positions past the training context)\n", L,
                 loss, windows, std::max<int64_t>(0, L - model.cfg.context));
    }
    out.push_back(j);
  }
  // append, then redraw the plot from every line of the file
  std::vector<nlohmann::json> all;
  if (std::filesystem::exists(jsonl)) {
    std::istringstream in(data::read_text_file(jsonl));
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) all.push_back(nlohmann::json::parse(line));
  }
  std::string text;
  for (const nlohmann::json& j : all) text += j.dump() + "\n";
  for (const nlohmann::json& j : out) text += j.dump() + "\n", all.push_back(j);
  write_file_atomic(jsonl, text);
  const std::string svg = std::filesystem::path(jsonl).replace_extension(".svg").string();
  write_file_atomic(svg, length_eval_svg(all, block));
  fmt::print("gpt: length evaluation appended to {}, plot {}\n", jsonl, svg);
  return out;
}

// ---- sampling ----------------------------------------------------------------------------------

int64_t sample_next(std::span<const float> logits, double temperature, int64_t top_k, double u) {
  const int64_t V = int64_t(logits.size());
  check(V >= 1, "sample_next: empty logits");
  // ids in order of decreasing logit, the lower id first on ties
  auto before = [&](int64_t a, int64_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  if (temperature <= 0 || top_k == 1) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (before(i, best)) best = i;
    return best;
  }
  const int64_t k = (top_k <= 0 || top_k >= V) ? V : top_k;
  std::vector<int64_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  // p_i proportional to exp((l_i - l_max) / temperature); l_max is order[0]'s logit, so the
  // largest term is exp(0) = 1 and nothing overflows
  const double l_max = logits[size_t(order[0])];
  std::vector<double> w(static_cast<size_t>(k));
  double z = 0;
  for (int64_t j = 0; j < k; ++j) {
    w[size_t(j)] = std::exp((double(logits[size_t(order[size_t(j)])]) - l_max) / temperature);
    z += w[size_t(j)];
  }
  // inverse CDF: the first id whose cumulative weight exceeds u * Z (the last kept one when
  // rounding leaves the sum just below)
  const double target = u * z;
  double cum = 0;
  for (int64_t j = 0; j < k; ++j) {
    cum += w[size_t(j)];
    if (cum > target) return order[size_t(j)];
  }
  return order[size_t(k - 1)];
}

std::vector<int64_t> generate(GPT& model, const std::vector<int64_t>& prompt, int64_t n_new, double temperature,
                              int64_t top_k, uint64_t seed, bool use_kv_cache) {
  check(!prompt.empty(), "generate: the prompt is empty; it needs at least one token");
  check(n_new >= 0, "generate: n_new {} is negative", n_new);
  for (int64_t id : prompt)
    check(id >= 0 && id < model.cfg.vocab, "generate: prompt token {} is outside the vocabulary [0, {})", id,
          model.cfg.vocab);
  InferenceScope scope(model);
  const int64_t C = model.cfg.context, keep = std::max<int64_t>(1, C / 2);
  std::vector<int64_t> ids = prompt;
  ids.reserve(prompt.size() + size_t(n_new));
  std::vector<nn::KVCache> caches;
  for (int64_t i = 0; i < model.cfg.n_layers; ++i) caches.emplace_back(C);
  Generator gen(seed);
  int64_t w = 0;  // the window ids[w, n) the model sees
  auto window = [&](int64_t from) {
    std::vector<int64_t> x(ids.begin() + from, ids.end());
    return from_vector(x, {1, int64_t(x.size())});
  };
  for (int64_t i = 0; i < n_new; ++i) {
    const int64_t n = int64_t(ids.size());
    bool restart = n - w > C;
    if (restart) w = n - keep;
    Tensor logits;
    if (!use_kv_cache) {
      logits = model.forward(window(w));
    } else if (restart || caches[0].length() == 0) {  // (re)fill the caches with the whole window
      for (auto& c : caches) c.clear();
      logits = model.forward(window(w), &caches);
    } else {  // the caches hold ids[w, n-1): feed the newest token
      logits = model.forward(window(n - 1), &caches);
    }
    const double u = rand({1}, DType::f64, &gen).item<double>();
    std::vector<float> l = last_logits(logits);
    ids.push_back(sample_next(l, temperature, top_k, u));
  }
  return ids;
}

// ---- attention plot ----------------------------------------------------------------------------

std::string token_label(const data::CharTokenizer& tok, int64_t id) {
  std::string s = tok.decode({id});
  if (s == "\n") return "\\n";
  if (s == "\t") return "\\t";
  if (s == " ") return "\u2423";  // ␣, the open box: a visible space
  return s;
}

std::vector<Heatmap> attention_maps(GPT& model, const std::vector<int64_t>& ids, const data::CharTokenizer& tok,
                                    int64_t max_tokens) {
  check(!ids.empty(), "attention_maps: no tokens");
  check(max_tokens >= 1, "attention_maps: max_tokens {} must be positive", max_tokens);
  const int64_t T = std::min({int64_t(ids.size()), max_tokens, model.cfg.context});
  std::vector<int64_t> x(ids.end() - T, ids.end());
  InferenceScope scope(model);
  const bool had = model.need_weights;
  model.need_weights = true;
  model.forward(from_vector(x, {1, T}));
  model.need_weights = had;
  Tensor a = (*model.blocks)[model.blocks->size() - 1].attn_weights;  // (1, H, T, T)
  check(a.defined() && a.ndim() == 4, "attention_maps: the last block kept no attention weights");
  std::vector<std::string> labels;
  for (int64_t id : x) labels.push_back(token_label(tok, id));
  std::vector<Heatmap> maps;
  for (int64_t h = 0; h < a.size(1); ++h)
    maps.push_back(heatmap_from_tensor(a.select(0, 0).select(0, h), fmt::format("head {}", h), labels, labels));
  return maps;
}

}  // namespace ag::apps
