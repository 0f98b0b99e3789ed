// The char-level GPT app's data, evaluation, sampling and attention plot (see lib.h).
#include "apps/gpt/lib.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <numeric>
#include <sstream>

#include <fmt/ranges.h>

#include "apps/common/clock.h"
#include "apps/common/diagnose.h"
#include "apps/common/run.h"
#include "attograd.h"
#include "data/images.h"
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

std::string TextSource::cache_dir() const { return data_dir.empty() ? default_cache_dir() : data_dir; }
std::string TextSource::fortune_root() const { return data_dir.empty() ? data::kFortuneRoot : data_dir; }
std::string TextSource::name() const { return text_file.empty() ? dataset : text_file; }
std::string TextSource::where() const {
  if (!text_file.empty()) return "a UTF-8 file";
  return dataset == "bible" ? "cached in " + cache_dir() : "English entries under " + fortune_root();
}
std::string TextSource::default_prompt() const {
  return dataset == "bible" && text_file.empty() ? "And God said" : "\n";
}

LMData load_lm_data(const TextSource& src) {
  if (auto missing = missing_gpt_data(src.dataset, src.text_file, src.cache_dir(), src.fortune_root()))
    throw data::DatasetNotFound(*missing);
  return make_lm_data(load_gpt_text(src.dataset, src.text_file, src.cache_dir(), src.fortune_root()));
}

std::vector<int64_t> unproduced_ids(std::span<const int64_t> ids, int64_t vocab) {
  std::vector<char> seen(size_t(std::max<int64_t>(vocab, 0)), 0);
  for (int64_t id : ids) {
    check(id >= 0 && id < vocab, "unproduced_ids: id {} is outside the vocabulary [0, {})", id, vocab);
    seen[size_t(id)] = 1;
  }
  std::vector<int64_t> out;
  for (int64_t id = 0; id < vocab; ++id)
    if (!seen[size_t(id)]) out.push_back(id);
  return out;
}

data::Windows train_windows(std::span<const int64_t> train, int64_t global_batch, int64_t T, uint64_t seed,
                            int64_t step, int rank, int ranks) {
  data::Windows w = data::random_windows(train, global_batch, T, seed, uint64_t(step));
  if (ranks > 1) {
    const data::Range mine = data::shard(global_batch, rank, ranks);
    w.x = w.x.narrow(0, mine.begin, mine.size()).contiguous();
    w.y = w.y.narrow(0, mine.begin, mine.size()).contiguous();
  }
  return w;
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

nlohmann::json gpt_run_config(const GPTConfig& c, const TextSource& src, int64_t global_batch, uint64_t seed,
                              bool grad_checkpointing) {
  nlohmann::json config = {{"model", gpt_config_to_json(c)},
                           {"data", {{"dataset", src.dataset}, {"text_file", src.text_file}, {"valid_fraction", 0.1}}},
                           {"train", {{"batch", global_batch}, {"seed", seed}}}};
  if (grad_checkpointing) config["train"]["grad_checkpointing"] = true;  // absent when off, as in older runs
  return config;
}

GptCheckpoint read_gpt_checkpoint(const nlohmann::json& config, const std::map<std::string, std::string>& extra,
                                  const std::string& path) {
  check(config.contains("model") && config.contains("data") && extra.count("tokenizer") == 1,
        "'{}' is not a gpt checkpoint (no model, data or tokenizer entry; config {})", path, config.dump());
  const nlohmann::json& data = config.at("data");
  return {.model = gpt_config_from_json(config.at("model")),
          .text = {.dataset = config_value<std::string>(data, "dataset", "gpt"),
                   .text_file = config_value<std::string>(data, "text_file", "gpt")},
          .tokenizer = data::CharTokenizer::from_json(extra.at("tokenizer"), path)};
}

const std::vector<SavedOption>& gpt_saved_options() {
  static const std::vector<SavedOption> options = {
      {"--dataset", "/data/dataset"}, {"--text-file", "/data/text_file"}, {"--context", "/model/context"},
      {"--d-model", "/model/d_model"}, {"--heads", "/model/n_heads"},     {"--layers", "/model/n_layers"},
      {"--mlp", "/model/mlp_hidden"},  {"--pos", "/model/pos"},           {"--kv-heads", "/model/kv_heads"},
      {"--mlp-kind", "/model/mlp_kind"}, {"--norm", "/model/norm"}};
  return options;
}

nlohmann::json gpt_checked_config(const GPTConfig& model, const TextSource& text) {
  return {{"model", nlohmann::json(model)}, {"data", {{"dataset", text.dataset}, {"text_file", text.text_file}}}};
}

std::string fit_patience_to_text(RunOptions& o, int64_t train_chars, int64_t T) {
  const double epochs = double(o.steps) * double(global_batch(o)) * double(T) / double(train_chars);
  return resolve_patience(o, epochs > 20,
                          fmt::format("{} training characters, read {:.1f} times by {} steps of {} x {}{}", train_chars,
                                      epochs, o.steps, global_batch(o), T, epochs > 20 ? " (> 20: a small text)" : ""));
}

// ---- training ----------------------------------------------------------------------------------

double forward_backward(GPT& model, optim::Optimizer& opt, const data::Windows& w, double loss_scale) {
  model.train();
  const int64_t N = w.x.numel(), V = model.cfg.vocab;
  const Tensor logits = model.forward(w.x).reshape({N, V});  // (B T, V)
  const Tensor loss = cross_entropy(logits, w.y.reshape({N}).to(logits.device()));
  return compute_gradients(opt, loss, loss_scale);
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
  const float no = -std::numeric_limits<float>::infinity();
  const int64_t possible = std::count_if(logits.begin(), logits.end(), [&](float l) { return l > no; });
  check(possible >= 1, "sample_next: every one of the {} logits is -inf: no id to sample", V);
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
  // the ids at -inf sort last and are left out, so neither top-k nor the rounding fallback below
  // can return one
  const int64_t k = std::min(possible, (top_k <= 0 || top_k >= V) ? V : top_k);
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

std::vector<int64_t> generate(GPT& model, const std::vector<int64_t>& prompt, int64_t n_new,
                              const GenerateOptions& g) {
  check(!prompt.empty(), "generate: the prompt is empty; it needs at least one token");
  check(n_new >= 0, "generate: n_new {} is negative", n_new);
  const int64_t V = model.cfg.vocab;
  for (int64_t id : prompt)
    check(id >= 0 && id < V, "generate: prompt token {} is outside the vocabulary [0, {})", id, V);
  std::vector<char> never(size_t(V), 0);
  for (int64_t id : g.never) {
    check(id >= 0 && id < V, "generate: never-sampled id {} is outside the vocabulary [0, {})", id, V);
    never[size_t(id)] = 1;
  }
  check(std::count(never.begin(), never.end(), 1) < V, "generate: all {} ids are never to be sampled", V);
  InferenceScope scope(model);
  const int64_t C = model.cfg.context, keep = std::max<int64_t>(1, C / 2);
  std::vector<int64_t> ids = prompt;
  ids.reserve(prompt.size() + size_t(n_new));
  std::vector<nn::KVCache> caches;
  for (int64_t i = 0; i < model.cfg.n_layers; ++i) caches.emplace_back(C);
  Generator gen(g.seed);
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
    if (!g.kv_cache) {
      logits = model.forward(window(w));
    } else if (restart || caches[0].length() == 0) {  // (re)fill the caches with the whole window
      for (auto& c : caches) c.clear();
      logits = model.forward(window(w), &caches);
    } else {  // the caches hold ids[w, n-1): feed the newest token
      logits = model.forward(window(n - 1), &caches);
    }
    const double u = rand({1}, DType::f64, &gen).item<double>();
    std::vector<float> l = last_logits(logits);
    for (int64_t id = 0; id < V; ++id)  // before top-k and temperature (GenerateOptions::never)
      if (never[size_t(id)]) l[size_t(id)] = -std::numeric_limits<float>::infinity();
    ids.push_back(sample_next(l, g.temperature, g.top_k, u));
  }
  return ids;
}

double sample_and_plot(GPT& model, const LMData& d, const SampleSettings& s, uint64_t seed, const std::string& dir) {
  const std::vector<int64_t> prompt = d.tokenizer.encode(s.prompt);
  GenerateOptions g{.temperature = s.temperature, .top_k = s.top_k, .seed = seed, .kv_cache = !s.no_kv_cache,
                    .never = unproduced_ids(d.train, model.cfg.vocab)};
  const double t0 = now_seconds();
  const std::vector<int64_t> ids = generate(model, prompt, s.tokens, g);
  const double secs = seconds_since(t0), rate = double(s.tokens) / std::max(secs, 1e-9);
  const std::string text = d.tokenizer.decode(ids);
  fmt::print("---- sample (temperature {}, top-k {}, seed {}) ----\n{}\n---- end of sample ----\n", s.temperature,
             s.top_k, seed, text);
  fmt::print("generation: {} tokens in {:.2f} s = {:.0f} tokens/s ({})\n", s.tokens, secs, rate,
             g.kv_cache ? "KV cache" : "no KV cache: a full forward per token");
  if (s.compare) {
    g.kv_cache = !g.kv_cache;
    const double t1 = now_seconds();
    const std::vector<int64_t> other = generate(model, prompt, s.tokens, g);
    const double secs2 = seconds_since(t1);
    fmt::print("generation {}: {:.0f} tokens/s; the tokens are {}\n",
               g.kv_cache ? "with the KV cache" : "without the KV cache", double(s.tokens) / std::max(secs2, 1e-9),
               other == ids ? "identical" : "DIFFERENT");
  }
  write_file_atomic(dir + "/sample.txt", text + "\n");
  HeatmapOptions ho;
  ho.title = "causal attention of the last block over the end of the sample (rows: queries, columns: keys)";
  ho.columns = 2;
  ho.cell = 14;
  write_file_atomic(dir + "/attention.svg", svg_heatmaps(attention_maps(model, ids, d.tokenizer, 40), ho));
  fmt::print("plots: {}/attention.svg, sample: {}/sample.txt\n", dir, dir);
  return rate;
}

void diagnose(GPT& model, std::span<const int64_t> ids, const std::vector<int64_t>& starts, int64_t T, int64_t batch,
              const std::string& dir) {
  const int64_t n = std::clamp<int64_t>(batch, 1, int64_t(starts.size()));
  std::vector<int64_t> x;
  for (int64_t i = 0; i < n; ++i)
    x.insert(x.end(), ids.begin() + starts[size_t(i)], ids.begin() + starts[size_t(i)] + T);
  const Tensor batch_x = from_vector(x, {n, T});
  std::string path;
  const nn::AttentionReport r = write_attention_diagnostics(model, [&] { model.forward(batch_x); }, dir, &path);
  fmt::print("attention diagnostics on {} validation windows of {} characters:\n{}written to {}\n", n, T,
             r.to_text(), path);
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
