#include "apps/common/run.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/core.h>

#include "apps/common/clock.h"
#include "apps/common/threads.h"
#include "autograd/ops.h"
#include "autograd/tape.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/serialize.h"
#include "cuda/memory.h"
#include "optim/clip.h"
#include "training/checkpoint.h"

namespace ag::apps {

namespace fs = std::filesystem;

namespace {

// Whether a metric gets a chart in curves.svg: everything but the bookkeeping.
bool drawn(const std::string& name) {
  return name != "step" && name != "time" && name != "skipped_steps" && name != "rss_mb";
}

// "val_accuracy" -> ("accuracy", "val"): the chart and the series of a logged scalar.
std::pair<std::string, std::string> chart_and_series(const std::string& name) {
  for (const char* split : {"train_", "val_", "test_"}) {
    const std::string p = split;
    if (name.rfind(p, 0) == 0) return {name.substr(p.size()), p.substr(0, p.size() - 1)};
  }
  return {name, name};
}

// The options the learning-rate schedule is a function of, as a checkpoint records them.
nlohmann::json schedule_json(const RunOptions& o) {
  return {{"--steps", o.steps}, {"--lr", o.lr}, {"--min-lr", o.min_lr}, {"--warmup", o.warmup},
          {"--schedule", o.schedule}};
}

}  // namespace

int64_t current_rss_bytes() {
  // statm: size resident shared text lib data dt, in pages
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * int64_t(sysconf(_SC_PAGESIZE));
}

bool all_finite(const std::vector<Tensor>& tensors) {
  NoGradGuard no_grad;
  for (const Tensor& t : tensors) {
    if (!t.defined() || !is_floating(t.dtype())) continue;
    const Tensor c = t.to(Device::cpu()).contiguous();
    bool ok = true;
    visit_floating("all_finite", c.dtype(), [&]<class T>() {
      const T* p = c.data<T>();
      const int64_t n = c.numel();
      // x - x is 0 for a finite x and NaN for an infinite or NaN one: one branch-free sum
      T acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < n; ++i) acc += p[i] - p[i];
      ok = acc == T(0);
    });
    if (!ok) return false;
  }
  return true;
}

bool json_integer_in(const nlohmann::json& v, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned()) return hi >= 0 && v.get<uint64_t>() >= uint64_t(std::max<int64_t>(lo, 0)) &&
                                     v.get<uint64_t>() <= uint64_t(hi);
  return v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
}

CheckpointInfo read_checkpoint_info(const std::string& path, const std::string& app) {
  check(fs::exists(path), "checkpoint '{}' does not exist", path);
  std::map<std::string, std::string> meta;
  load_safetensors(path, &meta);
  check(meta.count("format") && meta["format"] == "attograd-checkpoint-1",
        "checkpoint '{}': not an attograd training checkpoint (no format entry)", path);
  CheckpointInfo info;
  try {
    info.step = std::stoll(meta.at("step"));
    info.config = nlohmann::json::parse(meta.at("extra.config"));
  } catch (const std::exception& e) {
    throw Error(fmt::format("checkpoint '{}': missing or unreadable step/config metadata ({})", path, e.what()));
  }
  for (const auto& [key, value] : meta)
    if (key.rfind("extra.", 0) == 0 && key != "extra.config") info.extra[key.substr(6)] = value;
  if (auto it = info.extra.find("app"); it != info.extra.end()) info.app = it->second;
  // another app's model cannot be rebuilt from its config: say whose it is, not which entry is missing
  usage_check(app.empty() || info.app.empty() || info.app == app,
              "{}: '{}' is a checkpoint of {}, not of {}: give a checkpoint that {} wrote", app, path, info.app, app,
              app);
  return info;
}

// ---- Run ----------------------------------------------------------------------------------------

Run::Run(std::string app, const RunOptions& o, nn::Module& model, optim::Optimizer& opt, Generator& gen,
         nlohmann::json config, std::map<std::string, std::string> extra)
    : app_(std::move(app)), dir_(o.out_dir), o_(o), model_(model), opt_(opt), gen_(gen), config_(std::move(config)),
      extra_(std::move(extra)), start_time_(now_seconds()) {
  check(!dir_.empty(), "{}: no run directory (call apply_run_options first)", app_);
  if (o.precision == "fp16") scaler_.emplace();
  for (const char* key : {"app", "config", "steps", "schedule", "run.loss_sum", "run.loss_count", "run.skipped",
                          "run.skips_in_a_row", "run.loss_scale", "run.loss_scale_tracker", "run.loss_scale_skips",
                          "run.log", "run.best"})
    check(extra_.count(key) == 0, "{}: '{}' is reserved in the checkpoint metadata", app_, key);
  if (dist::is_main()) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    check(!ec, "{}: cannot create the run directory '{}': {}", app_, dir_, ec.message());
    // the vocabulary beside the model as well as inside each checkpoint, for whoever wants to read
    // or reuse it without opening the checkpoint (CharTokenizer/WordTokenizer JSON, see data/)
    if (auto it = extra_.find("tokenizer"); it != extra_.end())
      write_file_atomic(path("tokenizer.json"), it->second + "\n");
  }
  const int world = dist::world_size();
  const std::string ranks =
      world > 1 ? fmt::format(" x {} ranks (global batch {} = {} x --batch {})", world, global_batch(o), world, o.batch)
                : std::string();
  const std::string where = fmt::format("{}{}", o.device == "cpu" ? "" : ", on " + o.device,
                                        o.precision == "fp32" ? "" : ", " + o.precision + " autocast");
  const std::optional<std::string> threads_line = auto_threads().settle();
  if (threads_line && dist::is_main()) fmt::print(stderr, "{}\n", *threads_line);
  fmt::print(stderr, "{}: {} parameters, {} thread{}{}{}, run directory {}\n", app_,
             format_count(double(model.num_parameters())), num_threads(), num_threads() == 1 ? "" : "s", ranks, where,
             dir_);
  // data parallelism: rank 0's initial weights everywhere, and the gradients averaged from now on
  // (the reducer's all-reduce runs during backward; with one process it does nothing)
  dist::broadcast(model_.parameters());
  reducer_ = std::make_unique<dist::GradReducer>(model_.parameters());
}

Run::~Run() = default;

int64_t Run::resume() {
  const std::string ckpt = path("checkpoint.safetensors");
  const bool resuming = o_.resume && fs::exists(ckpt);
  if (o_.resume && !resuming) fmt::print(stderr, "{}: no checkpoint in {} yet: starting from step 0\n", app_, dir_);
  if (resuming) {
    const CheckpointInfo info = read_checkpoint_info(ckpt, app_);
    usage_check(info.config == config_,
                "{}: --resume: {} was trained with the config\n  {}\nbut this run asks for\n  {}", app_, ckpt,
                info.config.dump(), config_.dump());
    check_resumed_schedule(info, ckpt);
    const training::Checkpoint c = training::load_checkpoint(ckpt, model_, &opt_, &gen_);  // on every rank
    dist::broadcast(model_.parameters());  // the ranks start from rank 0's weights, bit for bit
    first_step_ = c.step;
    // the partial training-loss average of the next log line and the skip counts, as they were
    // (absent in checkpoints written before them: zero)
    auto entry = [&](const char* key) -> std::string {
      auto it = c.extra.find(key);
      return it == c.extra.end() ? "0" : it->second;
    };
    try {
      loss_sum_ = std::stod(entry("run.loss_sum"));  // written with 17 digits: the same double
      loss_count_ = std::stoll(entry("run.loss_count"));
      skipped_ = std::stoll(entry("run.skipped"));
      skips_in_a_row_ = std::stoll(entry("run.skips_in_a_row"));
      scale_skips_ = std::stoll(entry("run.loss_scale_skips"));
      eval_pending_ = entry("run.eval_pending") == "1";
      if (c.extra.count("run.best")) {  // model selection so far
        const auto j = nlohmann::json::parse(c.extra.at("run.best"));
        best_.step = j.at("step").get<int64_t>(), best_.evals_since = j.at("evals_since").get<int64_t>();
        best_.value = j.at("value").get<double>(), best_.tie = j.at("tie").get<double>();
      }
      if (c.extra.count("run.log")) {  // the training log line's partial interval
        const auto j = nlohmann::json::parse(c.extra.at("run.log"));
        log_.loss_sum = j.at("loss_sum").get<double>(), log_.loss_count = j.at("loss_count").get<int64_t>();
        log_.grad_norm_sum = j.at("grad_norm_sum").get<double>();
        log_.grad_norm_count = j.at("grad_norm_count").get<int64_t>();
      }
      // an fp16 run's loss scale where it was (a checkpoint of another precision: the initial scale)
      if (scaler_ && c.extra.count("run.loss_scale"))
        scaler_->load_state(std::stod(entry("run.loss_scale")), std::stoll(entry("run.loss_scale_tracker")));
    } catch (const std::exception& e) {
      throw Error(fmt::format("{}: --resume: {} has unreadable run.* metadata ({})", app_, ckpt, e.what()));
    }
    last_saved_step_ = first_step_;
    changed_ = false;
    // the curves so far come back from the metrics of the interrupted run
    std::ifstream in;
    if (dist::is_main()) in.open(path("metrics.jsonl"));  // the curves are rank 0's to draw
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      // a line this run did not write whole (or not at all) is skipped, never converted blindly
      if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
          j["step"].get<int64_t>() > first_step_)
        continue;
      for (const auto& [name, value] : j.items())
        if (drawn(name) && value.is_number()) {
          auto [chart, series] = chart_and_series(name);
          curves_.add(chart, series, double(j["step"].get<int64_t>()), value.get<double>());
        }
    }
    fmt::print(stderr, "{}: resumed from {} at step {}{}\n", app_, ckpt, first_step_,
               eval_pending_ && evaluate_ ? ", evaluating that step first (the checkpoint was written before its evaluation)" : "");
  }
  if (dist::is_main()) metrics_ = std::make_unique<MetricsLogger>(dir_, resuming);
  last_step_ = first_step_;
  if (!o_.quiet && dist::is_main()) {
    ProgressOptions po;
    po.label = app_;
    bar_ = std::make_unique<ProgressBar>(o_.steps, po);
  }
  last_step_time_ = now_seconds();
  if (eval_pending_ && evaluate_) evaluate_(first_step_);  // saved before its evaluation, which did not finish
  return first_step_;
}

bool Run::stop_requested() const {
  // a signal on one rank stops all of them after the same step: under mpirun only the signal that
  // reduce_step shared counts. --stop-at equal to --steps is the normal end of the run, not a stop.
  const bool signalled = dist::world_size() > 1 ? agreed_signal_ != 0 : apps::stop_requested();
  return signalled || early_stop_ || (o_.stop_at > 0 && o_.stop_at < o_.steps && last_step_ >= o_.stop_at);
}

void Run::select_by(std::string metric, bool higher_is_better, std::string tie_breaker) {
  select_metric_ = std::move(metric), select_higher_ = higher_is_better, select_tie_ = std::move(tie_breaker);
}

void Run::evaluate_with(std::function<void(int64_t)> evaluate) { evaluate_ = std::move(evaluate); }

void Run::end_step(int64_t step) {
  if (checkpoint_due(step)) save(step);  // first: a crash in the evaluation loses no training
  if (eval_due(step) && evaluate_) evaluate_(step);
}

int64_t Run::load_best() {
  const std::string file = path("best.safetensors");
  // best_ is the same on every rank (their evaluations agree); alone, a deleted file is only said
  if (best_.step < 0 || (dist::world_size() == 1 && !fs::exists(file))) {
    print(fmt::format("{}: testing the model of step {} (no best.safetensors from this run)", app_, last_step_));
    return -1;
  }
  // rank 0 wrote the file; a rank on another host may not see it: rank 0's weights are broadcast
  if (dist::is_main() || fs::exists(file)) training::load_checkpoint(file, model_, nullptr, nullptr);
  dist::broadcast(model_.parameters());
  print(fmt::format("{}: testing the best model by validation: step {} ({} {:.4g}), from {}", app_, best_.step,
                    select_metric_, best_.value, file));
  return best_.step;
}

void Run::check_resumed_schedule(const CheckpointInfo& info, const std::string& ckpt) const {
  // the learning rate is a function of the step and these options: other values would bend the
  // schedule halfway (a file without the "schedule" entry records --steps alone, as "steps")
  nlohmann::json saved;
  if (auto it = info.extra.find("schedule"); it != info.extra.end()) {
    saved = nlohmann::json::parse(it->second, nullptr, false);
  } else if (auto st = info.extra.find("steps"); st != info.extra.end()) {
    saved = {{"--steps", nlohmann::json::parse(st->second, nullptr, false)}};
  }
  check(saved.is_object() || saved.is_null(), "{}: --resume: {} has an unreadable schedule entry", app_, ckpt);
  const nlohmann::json now = schedule_json(o_);
  // as a user types them: 0 and 1e-06, not 0.0 and 1e-06 in JSON's spelling
  const auto shown = [](const nlohmann::json& v) {
    return v.is_string() ? v.get<std::string>() : v.is_number_float() ? fmt::format("{}", v.get<double>()) : v.dump();
  };
  for (const auto& [option, value] : saved.items())
    usage_check(!now.contains(option) || now.at(option) == value,
                "{}: --resume: {} belongs to a run with {} {} (its learning-rate schedule), this run asks for {} {}; "
                "resume with the same schedule options, or start a new run (--out)",
                app_, ckpt, option, shown(value), option, shown(now.at(option)));
}

double compute_gradients(optim::Optimizer& opt, const Tensor& loss, double scale) {
  opt.zero_grad();
  (scale == 1.0 ? loss : mul(loss, scale)).backward();
  return loss.item<double>();
}

bool Run::update(int64_t step, double loss, int64_t samples, int64_t tokens) {
  const StepTotals t = reduce_step(loss, samples, tokens);
  const bool applied = optimizer_step(step, t.loss);
  step_done(step, t.loss, t.samples, t.tokens);
  end_step(step);
  return applied;
}

Run::StepTotals Run::reduce_step(double loss, int64_t samples, int64_t tokens) {
  reduced_ = true;
  if (dist::world_size() == 1) return {loss, samples, tokens};
  reducer_->finish();  // wait for the buckets, divide by N: .grad is the global-batch gradient
  const int sig = apps::stop_signal();
  std::vector<double> v = {loss * double(samples), double(samples), double(tokens), sig == SIGINT ? 1.0 : 0.0,
                           sig != 0 && sig != SIGINT ? 1.0 : 0.0};
  dist::all_reduce_sum(v);  // one small all-reduce per step; a NaN loss on any rank makes the sum NaN
  if (agreed_signal_ == 0) agreed_signal_ = v[3] > 0 ? SIGINT : v[4] > 0 ? SIGTERM : 0;
  return {v[0] / v[1], int64_t(v[1]), int64_t(v[2])};
}

bool Run::optimizer_step(int64_t step, double loss) {
  changed_ = true;
  check(reduced_ || dist::world_size() == 1,
        "{}: step {}: optimizer_step without reduce_step: under mpirun the gradients would differ across ranks",
        app_, step);
  reduced_ = dist::world_size() == 1;
  // --clip 0 only measures: with the largest finite max_norm the clip coefficient of a finite
  // norm is >= 1, so nothing is scaled (a non-finite norm scales by 0 or NaN: dropped below)
  const double max_norm = o_.clip > 0 ? o_.clip : std::numeric_limits<double>::max();
  if (scaler_) scaler_->unscale(opt_.params());  // fp16: the true gradients, before clip and check
  last_grad_norm_ = optim::clip_grad_norm(opt_.params(), max_norm);
  const bool finite = std::isfinite(loss) && std::isfinite(last_grad_norm_);
  if (scaler_) scaler_->update(!finite);
  if (finite) {
    opt_.step();
    skips_in_a_row_ = 0;
    return true;
  }
  opt_.zero_grad();  // the gradients go; the parameters and the optimizer state stay as they were
  if (scaler_ && std::isfinite(loss)) {  // an fp16 overflow: the scale was just halved
    ++scale_skips_;
    return false;
  }
  ++skipped_, ++skips_in_a_row_;
  const std::string what = !std::isfinite(loss) ? fmt::format("the loss is {}", loss)
                                                : fmt::format("the gradient norm is {} (loss {:.4g})", last_grad_norm_, loss);
  print(fmt::format("{}: step {}: {}: update skipped ({} skipped so far, {} in a row). If this recurs, rerun with "
                    "a lower --lr (now {}) or with gradient clipping (--clip, now {}); --detect-anomaly names the "
                    "first op (and source line) that makes a NaN or an Inf",
                    app_, step, what, skipped_, skips_in_a_row_, o_.lr, o_.clip));
  check(o_.max_skips == 0 || skips_in_a_row_ < o_.max_skips,
        "{}: stopping at step {}: {} steps in a row had a non-finite loss or gradient norm (--max-skips {}); {}. "
        "Rerun with a lower --lr or with --clip, or with --detect-anomaly to find the first op that makes a NaN or an "
        "Inf",
        app_, step, skips_in_a_row_, o_.max_skips,
        last_saved_step_ >= 0
            ? fmt::format("{} still holds the finite model of step {}", path("checkpoint.safetensors"), last_saved_step_)
            : std::string("no checkpoint was written by this run"));
  return false;
}

void Run::step_done(int64_t step, double loss, int64_t samples, int64_t tokens) {
  changed_ = true;
  const double t = now_seconds();
  train_seconds_ += t - last_step_time_;
  last_step_time_ = t;
  last_step_ = step;
  samples_ += samples, tokens_ += tokens;
  if (std::isfinite(loss)) {  // a skipped step's NaN would poison the means
    loss_sum_ += loss, ++loss_count_;
    log_.loss_sum += loss, ++log_.loss_count;
  }
  if (std::isfinite(last_grad_norm_)) log_.grad_norm_sum += last_grad_norm_, ++log_.grad_norm_count;
  log_.samples += samples, log_.tokens += tokens;
  if (bar_)
    bar_->update(step, {{"loss", loss_count_ > 0 ? loss_sum_ / double(loss_count_) : loss}, {"lr", opt_.lr()}});
  if (step % o_.log_every == 0 || step == o_.steps) log_train(step);
  if (const std::optional<std::string> line = auto_threads().poll()) print(*line);
}

void Run::log_train(int64_t step) {
  const double seconds = train_seconds_ - log_train_start_;
  Scalars s;
  if (log_.loss_count > 0) s.emplace_back("train_loss", log_.loss_sum / double(log_.loss_count));
  s.emplace_back("lr", opt_.lr());
  if (log_.grad_norm_count > 0) s.emplace_back("grad_norm", log_.grad_norm_sum / double(log_.grad_norm_count));
  if (seconds > 0) {
    s.emplace_back("samples_per_s", double(log_.samples) / seconds);
    if (log_.tokens > 0) s.emplace_back("tokens_per_s", double(log_.tokens) / seconds);
  }
  log_ = {};
  log_train_start_ = train_seconds_;
  if (!dist::is_main()) return;
  check(metrics_ != nullptr, "{}: step_done before resume()", app_);
  metrics_->log(step, s);
  for (const auto& [name, value] : s) {
    auto [chart, series] = chart_and_series(name);
    curves_.add(chart, series, double(step), value);
  }
  curves_.write(path("curves.svg"));
}

bool Run::eval_due(int64_t step) const { return step % o_.eval_every == 0 || step == o_.steps; }
bool Run::checkpoint_due(int64_t step) const { return step % o_.checkpoint_every == 0 || step == o_.steps; }

void Run::log_eval(int64_t step, const Scalars& scalars) {
  last_eval_step_ = step, changed_ = true;
  // model selection, on every rank alike (their evaluations agree)
  std::string selection;
  if (!select_metric_.empty()) {
    auto find = [&](const std::string& name) -> std::optional<double> {
      for (const auto& [n, v] : scalars)
        if (n == name) return v;
      return std::nullopt;
    };
    if (const auto v = find(select_metric_); v && std::isfinite(*v)) {
      const double tie = select_tie_.empty() ? 0.0 : find(select_tie_).value_or(0.0);
      const bool better = best_.step < 0 || (select_higher_ ? *v > best_.value : *v < best_.value) ||
                          (*v == best_.value && std::isfinite(tie) && tie < best_.tie);
      if (better) {
        best_ = {step, *v, tie, 0};
        if (dist::is_main()) write_checkpoint(path("best.safetensors"), step);
        selection = " (best so far: best.safetensors)";
      } else {
        ++best_.evals_since;
        selection = fmt::format(" (best {:.4g} at step {})", best_.value, best_.step);
        if (o_.patience > 0 && best_.evals_since >= o_.patience && step < o_.steps) {
          early_stop_ = true;
          selection += fmt::format(": no better {} in {} evaluations, stopping early (--patience {})", select_metric_,
                                   best_.evals_since, o_.patience);
        }
      }
    }
  }
  Scalars all = scalars;
  all.emplace_back("skipped_steps", double(skipped_));
  all.emplace_back("rss_mb", double(current_rss_bytes()) / (1 << 20));
  check(metrics_ != nullptr || !dist::is_main(), "{}: log_eval before resume()", app_);
  if (!dist::is_main()) {  // rank 0 logs; the others only start the next average as it does
    loss_sum_ = 0, loss_count_ = 0;
    last_step_time_ = now_seconds();
    return;
  }
  metrics_->log(step, all);
  // the printed line: the training loss since the previous evaluation, the evaluation, the lr
  std::string line = fmt::format("step {}/{}:", step, o_.steps);
  if (loss_count_ > 0) line += fmt::format(" train_loss {:.4g}", loss_sum_ / double(loss_count_));
  for (const auto& [name, value] : scalars) line += fmt::format(" {} {:.4g}", name, value);
  line += fmt::format(" lr {:.4g}", opt_.lr());
  if (skipped_ > 0) line += fmt::format(" skipped_steps {}", skipped_);
  line += selection;
  for (const auto& [name, value] : all)
    if (drawn(name)) {
      auto [chart, series] = chart_and_series(name);
      curves_.add(chart, series, double(step), value);
    }
  curves_.write(path("curves.svg"));
  print(line);
  loss_sum_ = 0, loss_count_ = 0;
  last_step_time_ = now_seconds();  // evaluation time is not training time
}

bool Run::save(int64_t step) {
  if (step == last_saved_step_ && !changed_) return true;  // the file holds this state already
  std::vector<Tensor> state;
  for (const auto& [name, t] : opt_.state_dict()) state.push_back(t);
  if (!all_finite(model_.parameters()) || !all_finite(state)) {
    print(fmt::format("{}: step {}: a parameter or an optimizer moment is NaN or infinite: NOT saving; {} keeps {}",
                      app_, step, path("checkpoint.safetensors"),
                      last_saved_step_ >= 0 ? fmt::format("step {}", last_saved_step_)
                                            : std::string("what it held (no checkpoint of this run yet)")));
    return false;
  }
  if (dist::is_main()) {  // rank 0 writes; every rank holds the same parameters and moments
    std::map<std::string, std::string> meta;
    if (eval_due(step) && last_eval_step_ != step) meta["run.eval_pending"] = "1";
    write_checkpoint(path("checkpoint.safetensors"), step, meta);  // restarts the step clock after the write
  }
  last_saved_step_ = step, changed_ = false;
  return true;
}

std::map<std::string, std::string> Run::model_metadata() const {
  std::map<std::string, std::string> meta = extra_;
  meta["app"] = app_;
  meta["config"] = config_.dump();
  meta["schedule"] = schedule_json(o_).dump();
  return meta;
}

void Run::write_checkpoint(const std::string& file, int64_t step, const std::map<std::string, std::string>& more) {
  std::map<std::string, std::string> meta = model_metadata();
  meta.insert(more.begin(), more.end());
  meta["run.loss_sum"] = fmt::format("{:.17g}", loss_sum_);
  meta["run.loss_count"] = std::to_string(loss_count_);
  meta["run.skipped"] = std::to_string(skipped_);
  meta["run.skips_in_a_row"] = std::to_string(skips_in_a_row_);
  meta["run.log"] = nlohmann::json{{"loss_sum", log_.loss_sum},
                                   {"loss_count", log_.loss_count},
                                   {"grad_norm_sum", log_.grad_norm_sum},
                                   {"grad_norm_count", log_.grad_norm_count}}
                        .dump();
  if (scaler_) {
    meta["run.loss_scale"] = fmt::format("{:.17g}", scaler_->get_scale());
    meta["run.loss_scale_tracker"] = std::to_string(scaler_->growth_tracker());
    meta["run.loss_scale_skips"] = std::to_string(scale_skips_);
  }
  meta["run.best"] = nlohmann::json{{"step", best_.step},
                                    {"value", best_.value},
                                    {"tie", best_.tie},
                                    {"evals_since", best_.evals_since}}
                         .dump();
  training::save_checkpoint(file, model_, opt_, step, gen_, meta);
  last_step_time_ = now_seconds();
}

void Run::print(const std::string& line) {
  if (!dist::is_main()) return;
  if (bar_)
    bar_->print(line);
  else
    fmt::print(stderr, "{}\n", line);
}

void Run::finish(RunReport& report) {
  if (bar_) bar_->finish();
  report.app = app_;
  report.device = o_.device;
  report.precision = o_.precision;
  report.wall_seconds = now_seconds() - start_time_;
  report.train_seconds = train_seconds_;
  report.steps = last_step_ - first_step_;
  report.parameters = model_.num_parameters();
  report.samples = double(samples_);
  report.tokens = double(tokens_);
  report.peak_rss_bytes = peak_rss_bytes();
  report.peak_tensor_bytes = int64_t(alloc_stats(training_device(o_)).peak_bytes_in_use);  // on --device
  report.skipped_steps = skipped_;
  if (scaler_) {
    report.loss_scale = scaler_->get_scale();
    report.loss_scale_skips = scale_skips_;
  }
  const bool stopped = stop_requested() && !early_stop_ && last_step_ < o_.steps;
  report.interrupted = stopped;
  if (best_.step >= 0) report.best_step = best_.step;
  report.early_stopped = early_stop_;
  if (!dist::is_main()) return;  // rank 0 reports for the job
  fmt::print("{}", report.to_text());
  if (!o_.export_bf16.empty()) {  // the model just tested: the best by validation, else the last
    const int64_t step = best_.step >= 0 ? best_.step : last_step_;
    training::save_model(o_.export_bf16, model_, step, gen_, model_metadata(), FloatStorage::bf16);
    fmt::print("{}: the model of step {} in bf16: {} ({:.2f} MB)\n", app_, step, o_.export_bf16,
               double(fs::file_size(o_.export_bf16)) / 1e6);
  }
  nlohmann::json j = report.to_json();
  j["config"] = config_;
  write_file_atomic(path("report.json"), j.dump(2) + "\n");
  fmt::print("run directory: {} (curves.svg, metrics.jsonl, TensorBoard events, report.json, checkpoint{})\n", dir_,
             best_.step >= 0 ? ", best.safetensors" : "");
  if (early_stop_)
    fmt::print("stopped early after step {} of {}: no better {} in {} evaluations (--patience {}); best.safetensors "
               "holds step {}, the model tested\n",
               last_step_, o_.steps, select_metric_, best_.evals_since, o_.patience, best_.step);
  if (stopped) {
    const int sig = dist::world_size() > 1 ? agreed_signal_ : apps::stop_signal();
    const std::string why = sig != 0 ? (sig == SIGINT ? "Ctrl-C" : "SIGTERM") : fmt::format("--stop-at {}", o_.stop_at);
    std::string cmd =
        o_.command_line.empty() ? fmt::format("{} <the same options> --resume", app_) : resume_command(o_.command_line);
    // a job resumes as a job (or alone, with --batch times the ranks: the same global batch)
    if (dist::world_size() > 1) cmd = fmt::format("mpirun -np {} {}", dist::world_size(), cmd);
    fmt::print("stopped after step {} of {} ({}); {}. To continue:\n  {}\n", last_step_, o_.steps, why,
               last_saved_step_ == last_step_ ? "the checkpoint holds it"
                                              : fmt::format("the checkpoint holds step {}", last_saved_step_),
               cmd);
  }
}

}  // namespace ag::apps
