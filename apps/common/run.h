#pragma once
// The plumbing every sample app shares, so that apps/vit.cpp, apps/textclf.cpp and apps/gpt.cpp
// read as their model, their data and their training loop, nothing else:
//
//   RunOptions         the options every app has (steps, lr, schedule, batch, seed, threads,
//                      device, precision, run dir, resume, eval/checkpoint cadence, data dir,
//                      eval-only), registered on the app's CLI11 parser with their defaults
//   Run                one training run in its run directory:
//
//     <out>/checkpoint.safetensors   model + AdamW state + step + RNG + config (+ tokenizer), atomic
//     <out>/metrics.jsonl            one line per evaluation (and per log interval of train loss)
//     <out>/events.out.tfevents.*    the same scalars for `tensorboard --logdir <out>`
//     <out>/curves.svg               train / validation loss and accuracy over steps
//     <out>/report.json              the final report (also printed)
//
// A training loop on it:
//
//   Run run("vit", opts, model, opt, gen, config);   // header line, Ctrl-C handler, metrics files
//   int64_t step = run.resume();                      // --resume: load the checkpoint, else 0
//   for (; step < opts.steps && !run.stop_requested(); ++step) {
//     sched.set_lr(opt, step);
//     ... forward, backward, clip, opt.step() ...
//     run.step_done(step + 1, loss, batch_samples, batch_tokens);   // progress bar, throughput
//     if (run.eval_due(step + 1)) run.log_eval(step + 1, evaluate(...));
//     if (run.checkpoint_due(step + 1)) run.save(step + 1);
//   }
//   run.save(step);   // also after Ctrl-C: nothing trained is lost
//   run.finish(report);
#include <CLI/CLI.hpp>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "apps/common/metrics.h"
#include "apps/common/plot.h"
#include "apps/common/progress.h"
#include "apps/common/report.h"
#include "apps/common/signal.h"
#include "core/random.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace ag::apps {

// Exit codes of the apps: 0 done (or stopped by Ctrl-C after saving), 1 an error, 2 a usage error
// before any work starts: missing data (the message names the Debian package to install), or an
// unknown flag or a value out of range (one line naming it, and a pointer to --help).
constexpr int kExitError = 1;
constexpr int kExitNoData = 2;
constexpr int kExitUsage = 2;

// Parses an app's command line. Returns -1 to go on; otherwise the code to exit with at once: 0
// after --help (printed), kExitUsage after a bad flag or value, reported on stderr in one line:
// "app: <what CLI11 found> (app --help lists every option)".
int parse_command_line(CLI::App& cli, int argc, const char* const* argv, const std::string& app);

struct RunOptions {
  int64_t steps = 1000;       // optimizer steps (the cosine schedule needs the total up front)
  int64_t batch = 64;
  double lr = 1e-3;           // peak learning rate
  double min_lr = 0.0;        // cosine floor
  double warmup = 0.05;       // fraction of the steps with a linear warmup
  std::string schedule = "cosine";  // cosine | constant | step
  double weight_decay = 0.05;  // AdamW, decoupled
  double clip = 1.0;           // global gradient-norm clip (0: off)
  double dropout = 0.0;
  uint64_t seed = 1;
  int threads = 0;             // 0: every core
  std::string device = "cpu";
  std::string precision = "fp32";
  std::string out_dir;         // run directory; default runs/<app>
  bool resume = false;         // continue from <out>/checkpoint.safetensors
  int64_t eval_every = 0;      // steps between evaluations (0: 10 per run)
  int64_t checkpoint_every = 0;  // steps between checkpoints (0: at each evaluation)
  std::string data_dir;        // where the data is (each app has its default)
  bool eval_only = false;      // evaluate --checkpoint and exit
  std::string checkpoint;      // for --eval-only (default <out>/checkpoint.safetensors)
  bool quiet = false;          // no progress bar
};

// Registers every RunOptions field as --steps, --batch, --lr, ..., showing the defaults the
// app set in `o` beforehand; the app adds its own model and data options next to them.
void add_run_options(CLI::App& cli, RunOptions& o);

// After parsing: sets the thread count, checks device and precision (an ag::Error naming the
// option when the build or machine cannot honour it), fills the defaults that depend on others
// (out_dir, eval_every, checkpoint path).
void apply_run_options(RunOptions& o, const std::string& app);

// The schedule the options describe (warmup + cosine to min_lr, constant, or step decay by 0.1
// at 50% and 75%).
std::unique_ptr<optim::Schedule> make_schedule(const RunOptions& o);

// The metadata a checkpoint carries besides tensors: the app's config and anything else the app
// needs to rebuild its model and data (the tokenizer), as JSON strings.
struct CheckpointInfo {
  int64_t step = 0;
  nlohmann::json config;               // the model + data config the run was started with
  std::map<std::string, std::string> extra;  // the app's entries (e.g. "tokenizer")
};
// Reads only the metadata of a checkpoint (to build the model before loading its weights).
CheckpointInfo read_checkpoint_info(const std::string& path);

class Run {
 public:
  // `config`: the app's model and data settings (saved with every checkpoint and in the report);
  // `extra`: more string metadata for checkpoints (e.g. the tokenizer's JSON).
  Run(std::string app, const RunOptions& o, nn::Module& model, optim::Optimizer& opt, Generator& gen,
      nlohmann::json config, std::map<std::string, std::string> extra = {});
  ~Run();

  // With --resume and a checkpoint in the run dir: loads model, optimizer, RNG and returns its
  // step (the metrics files are appended to). Otherwise 0.
  int64_t resume();
  bool stop_requested() const;

  // After the update that made `step` steps: advances the progress bar (loss, lr, smoothed
  // throughput) and averages the training loss for the next log line.
  void step_done(int64_t step, double loss, int64_t samples, int64_t tokens = 0);
  bool eval_due(int64_t step) const;
  bool checkpoint_due(int64_t step) const;
  // Logs scalars (e.g. {"val_loss", ..}, {"val_accuracy", ..}) with the mean training loss since
  // the last call, to metrics.jsonl, tfevents and curves.svg; prints one line.
  void log_eval(int64_t step, const Scalars& scalars);
  // Writes the checkpoint atomically (model, optimizer, step, RNG, config, extra).
  void save(int64_t step);
  // Prints a line without breaking the progress bar.
  void print(const std::string& line);

  // Fills the timing, throughput and memory fields of `report`, prints it and writes
  // <out>/report.json.
  void finish(RunReport& report);

  const std::string& dir() const { return dir_; }
  std::string path(const std::string& file) const { return dir_ + "/" + file; }

 private:
  std::string app_, dir_;
  RunOptions o_;
  nn::Module& model_;
  optim::Optimizer& opt_;
  Generator& gen_;
  nlohmann::json config_;
  std::map<std::string, std::string> extra_;
  StopGuard stop_;
  std::unique_ptr<MetricsLogger> metrics_;
  std::unique_ptr<ProgressBar> bar_;
  TrainingCurves curves_;
  double start_time_, train_seconds_ = 0, last_step_time_ = 0;
  double loss_sum_ = 0;
  int64_t loss_count_ = 0, first_step_ = 0, last_step_ = 0, samples_ = 0, tokens_ = 0;
};

// Prints "app: message" on stderr: the one line an app prints for an error before it exits. A
// message that already starts with "app:" (the app's own checks) is printed as it is, not twice.
void print_error(const std::string& app, const std::string& message);

}  // namespace ag::apps
