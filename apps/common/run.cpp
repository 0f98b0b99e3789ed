#include "apps/common/run.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/core.h>

#include "core/allocator.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/serialize.h"
#include "nn/checkpoint.h"

namespace ag::apps {

namespace fs = std::filesystem;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// "val_accuracy" -> ("accuracy", "val"): the chart and the series of a logged scalar.
std::pair<std::string, std::string> chart_and_series(const std::string& name) {
  for (const char* split : {"train_", "val_", "test_"}) {
    const std::string p = split;
    if (name.rfind(p, 0) == 0) return {name.substr(p.size()), p.substr(0, p.size() - 1)};
  }
  return {name, name};
}

}  // namespace

void add_run_options(CLI::App& cli, RunOptions& o) {
  cli.add_option("--steps", o.steps, "optimizer steps")->capture_default_str()->check(CLI::PositiveNumber);
  cli.add_option("--batch", o.batch, "batch size")->capture_default_str()->check(CLI::PositiveNumber);
  cli.add_option("--lr", o.lr, "peak learning rate (AdamW)")->capture_default_str()->check(CLI::PositiveNumber);
  cli.add_option("--min-lr", o.min_lr, "final learning rate of the cosine schedule")->capture_default_str();
  cli.add_option("--warmup", o.warmup, "fraction of the steps with a linear warmup")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cli.add_option("--schedule", o.schedule, "lr schedule: cosine (after warmup), constant, step (x0.1 every third)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cosine", "constant", "step"}));
  cli.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  cli.add_option("--clip", o.clip, "clip the global gradient norm to this (0: off)")->capture_default_str();
  cli.add_option("--dropout", o.dropout, "dropout probability")->capture_default_str()->check(CLI::Range(0.0, 0.99));
  cli.add_option("--seed", o.seed, "seed of initialisation, data order, dropout and sampling")->capture_default_str();
  cli.add_option("--threads", o.threads, "CPU threads (0: every core)")->capture_default_str();
  cli.add_option("--device", o.device, "cpu or cuda[:N]")->capture_default_str();
  cli.add_option("--precision", o.precision, "fp32, or bf16 (CUDA only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cli.add_option("--out,--checkpoint-dir", o.out_dir,
                 "run directory: checkpoint, metrics, TensorBoard events, plots, report (default runs/<app>)");
  cli.add_flag("--resume", o.resume, "continue from the checkpoint in the run directory");
  cli.add_option("--eval-every", o.eval_every, "steps between evaluations (0: ten per run)")->capture_default_str();
  cli.add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (0: at every evaluation)")
      ->capture_default_str();
  cli.add_option("--data-dir", o.data_dir, "where the data is")->capture_default_str();
  cli.add_flag("--eval-only", o.eval_only, "evaluate --checkpoint (or the run directory's) and exit");
  cli.add_option("--checkpoint", o.checkpoint, "checkpoint file for --eval-only");
  cli.add_flag("--quiet", o.quiet, "no progress bar (evaluation lines and the report only)");
}

void apply_run_options(RunOptions& o, const std::string& app) {
  if (o.threads > 0) set_num_threads(o.threads);
  check(o.device == "cpu" || o.device.rfind("cuda", 0) == 0, "--device: expected cpu or cuda[:N], got '{}'",
        o.device);
  if (o.device != "cpu") {
#if ATTOGRAD_WITH_CUDA
    throw Error(fmt::format("--device {}: the CUDA backend of this build has memory and copies but not yet the "
                            "kernels training needs; use --device cpu",
                            o.device));
#else
    throw Error(fmt::format("--device {}: this build has no CUDA backend (configure with -DATTOGRAD_CUDA=ON on a "
                            "machine with nvcc); use --device cpu",
                            o.device));
#endif
  }
  check(o.precision == "fp32", "--precision {}: mixed precision runs on the CUDA backend; the CPU trains in fp32",
        o.precision);
  check(o.clip >= 0 && o.weight_decay >= 0 && o.min_lr >= 0 && o.min_lr <= o.lr,
        "{}: expected clip >= 0, weight decay >= 0 and 0 <= min-lr <= lr, got {}, {}, {} and {}", app, o.clip,
        o.weight_decay, o.min_lr, o.lr);
  if (o.out_dir.empty()) o.out_dir = "runs/" + app;
  if (o.eval_every <= 0) o.eval_every = std::max<int64_t>(1, o.steps / 10);
  if (o.checkpoint_every <= 0) o.checkpoint_every = o.eval_every;
  if (o.checkpoint.empty()) o.checkpoint = o.out_dir + "/checkpoint.safetensors";
}

std::unique_ptr<optim::Schedule> make_schedule(const RunOptions& o) {
  if (o.schedule == "constant") return std::make_unique<optim::ConstantLR>(o.lr);
  if (o.schedule == "step") return std::make_unique<optim::StepLR>(o.lr, std::max<int64_t>(1, o.steps / 3), 0.1);
  const auto warmup = int64_t(std::llround(o.warmup * double(o.steps)));
  return std::make_unique<optim::WarmupCosineLR>(o.lr, o.min_lr, warmup, o.steps);
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
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
  return info;
}

// ---- Run ----------------------------------------------------------------------------------------

Run::Run(std::string app, const RunOptions& o, nn::Module& model, optim::Optimizer& opt, Generator& gen,
         nlohmann::json config, std::map<std::string, std::string> extra)
    : app_(std::move(app)), dir_(o.out_dir), o_(o), model_(model), opt_(opt), gen_(gen), config_(std::move(config)),
      extra_(std::move(extra)), start_time_(now_seconds()) {
  check(!dir_.empty(), "{}: no run directory (call apply_run_options first)", app_);
  check(extra_.count("config") == 0 && extra_.count("steps") == 0,
        "{}: 'config' and 'steps' are reserved in the checkpoint metadata", app_);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  check(!ec, "{}: cannot create the run directory '{}': {}", app_, dir_, ec.message());
  fmt::print(stderr, "{}: {} parameters, {} threads, run directory {}\n", app_, format_count(double(model.num_parameters())),
             num_threads(), dir_);
}

Run::~Run() = default;

int64_t Run::resume() {
  const std::string ckpt = path("checkpoint.safetensors");
  const bool resuming = o_.resume && fs::exists(ckpt);
  if (o_.resume && !resuming) fmt::print(stderr, "{}: no checkpoint in {} yet: starting from step 0\n", app_, dir_);
  if (resuming) {
    const CheckpointInfo info = read_checkpoint_info(ckpt);
    check(info.config == config_, "{}: --resume: {} was trained with the config\n  {}\nbut this run asks for\n  {}",
          app_, ckpt, info.config.dump(), config_.dump());
    // the schedule is a function of the step and the total: a different --steps would bend it
    check(!info.extra.count("steps") || info.extra.at("steps") == std::to_string(o_.steps),
          "{}: --resume: {} belongs to a run of {} steps (its lr schedule), this run asks for --steps {}", app_,
          ckpt, info.extra.count("steps") ? info.extra.at("steps") : "", o_.steps);
    first_step_ = nn::load_checkpoint(ckpt, model_, &opt_, &gen_).step;
    // the curves so far come back from the metrics of the interrupted run
    std::ifstream in(path("metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("step") || j["step"].get<int64_t>() > first_step_) continue;
      for (const auto& [name, value] : j.items())
        if (name != "step" && name != "time" && value.is_number()) {
          auto [chart, series] = chart_and_series(name);
          curves_.add(chart, series, double(j["step"].get<int64_t>()), value.get<double>());
        }
    }
    fmt::print(stderr, "{}: resumed from {} at step {}\n", app_, ckpt, first_step_);
  }
  metrics_ = std::make_unique<MetricsLogger>(dir_, resuming);
  last_step_ = first_step_;
  if (!o_.quiet) {
    ProgressOptions po;
    po.label = app_;
    bar_ = std::make_unique<ProgressBar>(o_.steps, po);
  }
  last_step_time_ = now_seconds();
  return first_step_;
}

bool Run::stop_requested() const { return apps::stop_requested(); }

void Run::step_done(int64_t step, double loss, int64_t samples, int64_t tokens) {
  const double t = now_seconds();
  train_seconds_ += t - last_step_time_;
  last_step_time_ = t;
  last_step_ = step;
  samples_ += samples, tokens_ += tokens;
  loss_sum_ += loss, ++loss_count_;
  if (bar_) bar_->update(step, {{"loss", loss_sum_ / double(loss_count_)}, {"lr", opt_.lr()}});
}

bool Run::eval_due(int64_t step) const { return step % o_.eval_every == 0 || step == o_.steps; }
bool Run::checkpoint_due(int64_t step) const { return step % o_.checkpoint_every == 0 || step == o_.steps; }

void Run::log_eval(int64_t step, const Scalars& scalars) {
  Scalars all;
  if (loss_count_ > 0) all.emplace_back("train_loss", loss_sum_ / double(loss_count_));
  all.insert(all.end(), scalars.begin(), scalars.end());
  all.emplace_back("lr", opt_.lr());
  check(metrics_ != nullptr, "{}: log_eval before resume()", app_);
  metrics_->log(step, all);
  std::string line = fmt::format("step {}/{}:", step, o_.steps);
  for (const auto& [name, value] : all) {
    line += fmt::format(" {} {:.4g}", name, value);
    if (name == "lr") continue;
    auto [chart, series] = chart_and_series(name);
    curves_.add(chart, series, double(step), value);
  }
  curves_.write(path("curves.svg"));
  print(line);
  loss_sum_ = 0, loss_count_ = 0;
  last_step_time_ = now_seconds();  // evaluation time is not training time
}

void Run::save(int64_t step) {
  std::map<std::string, std::string> meta = extra_;
  meta["config"] = config_.dump();
  meta["steps"] = std::to_string(o_.steps);
  nn::save_checkpoint(path("checkpoint.safetensors"), model_, opt_, step, gen_, meta);
  last_step_time_ = now_seconds();
}

void Run::print(const std::string& line) {
  if (bar_)
    bar_->print(line);
  else
    fmt::print(stderr, "{}\n", line);
}

void Run::finish(RunReport& report) {
  if (bar_) bar_->finish();
  report.app = app_;
  report.wall_seconds = now_seconds() - start_time_;
  report.train_seconds = train_seconds_;
  report.steps = last_step_ - first_step_;
  report.parameters = model_.num_parameters();
  report.samples = double(samples_);
  report.tokens = double(tokens_);
  report.peak_rss_bytes = peak_rss_bytes();
  report.peak_tensor_bytes = int64_t(alloc_stats().peak_bytes_in_use);
  report.interrupted = apps::stop_requested();
  fmt::print("{}", report.to_text());
  nlohmann::json j = report.to_json();
  j["config"] = config_;
  write_file_atomic(path("report.json"), j.dump(2) + "\n");
  fmt::print("run directory: {} (curves.svg, metrics.jsonl, TensorBoard events, report.json, checkpoint)\n", dir_);
}

int parse_command_line(CLI::App& cli, int argc, const char* const* argv, const std::string& app) {
  try {
    cli.parse(argc, argv);
    return -1;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return cli.exit(e);  // --help: CLI11 prints it
    fmt::print(stderr, "{}: {} ({} --help lists every option)\n", app, e.what(), app);
    return kExitUsage;
  }
}

void print_error(const std::string& app, const std::string& message) {
  const std::string prefix = app + ":";
  if (message.compare(0, prefix.size(), prefix) == 0)
    fmt::print(stderr, "{}\n", message);
  else
    fmt::print(stderr, "{} {}\n", prefix, message);
}

}  // namespace ag::apps
