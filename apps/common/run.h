#pragma once
// The plumbing every sample app shares, so that apps/vit, apps/textclf and apps/gpt (main.cpp)
// read as their model, their data and their training loop, nothing else:
//
//   RunOptions         the options every app has (steps, lr, schedule, batch, seed, threads,
//                      device, precision, run dir, resume, eval/checkpoint cadence, data dir,
//                      eval-only), registered on the app's CLI11 parser with their defaults
//   Run                one training run in its run directory:
//
//     <out>/checkpoint.safetensors   model + AdamW state + step + RNG + config (+ tokenizer), atomic
//     <out>/best.safetensors         the same, at the evaluation with the best validation metric
//     <out>/metrics.jsonl            one line every --log-every steps (train_loss, lr, grad_norm,
//                                    samples_per_s, tokens_per_s) and one per evaluation (val_*,
//                                    test_*, skipped_steps, rss_mb)
//     <out>/events.out.tfevents.*    the same scalars for `tensorboard --logdir <out>`
//     <out>/curves.svg               the training loss, lr, gradient norm and throughput over steps,
//                                    the evaluations' losses and accuracies beside them
//     <out>/report.json              the final report (also printed)
//
// A training loop on it:
//
//   Run run("vit", opts, model, opt, gen, config);   // header line, Ctrl-C handler, metrics files
//   run.evaluate_with([&](int64_t s) { run.log_eval(s, evaluate(validation split)); });
//   int64_t step = run.resume();                      // --resume: load the checkpoint, else 0
//   for (; step < opts.steps && !run.stop_requested(); ++step) {   // Ctrl-C, SIGTERM, --stop-at
//     sched.set_lr(opt, step);
//     ... forward, zero_grad, backward ...
//     run.optimizer_step(step + 1, loss);            // clip, health check, opt.step() or a skip
//     run.step_done(step + 1, loss, batch_samples, batch_tokens);   // progress bar, throughput
//     run.end_step(step + 1);                        // checkpoint_due: save; then eval_due: evaluate
//   }
//   run.save(step);   // also after Ctrl-C: nothing trained is lost (nothing written when unchanged)
//   run.load_best();  // the model of the best validation metric (run.select_by), for the test set
//   run.finish(report);   // after a stop: prints the command line that resumes
//
// Model selection never looks at the test set: the apps evaluate a validation split held out of
// the training data during training, and the test split once, at the end, on the best model.
// run.select_by("val_accuracy", true, "val_loss") before resume(): each log_eval holding that
// metric compares it with the best so far (on a tie, the tie-breaker decides, lower is better); a
// better one writes <out>/best.safetensors. With --patience P > 0, P evaluations in a row without a
// better one end the run early: saved and reported as a finished run, not an interruption.
//
// Data parallelism (dist/dist.h). Started by `mpirun -np N`, every app trains one model on N
// processes with no other change to its command line; alone, N = 1 and everything below is a no-op.
//   apply_run_options   joins the job (dist::init); ranks other than 0 print nothing but their errors
//   --batch B           the PER-RANK batch: the global batch is N x B. Every rank plans the global
//                       batch exactly as one process with --batch N*B would (same seed, same order)
//                       and takes its slice data::shard(N*B, rank, N): rank r gets samples [r B, (r+1) B)
//   Run (constructor)   broadcasts rank 0's initial parameters; a dist::GradReducer hooks backward
//   resume()            every rank loads the checkpoint, then rank 0's parameters are broadcast again
//   reduce_step         after backward: waits for the gradient all-reduce that ran during backward, so
//                       every .grad is the global batch's mean gradient (the slices are equal, so the
//                       mean of the ranks' means); returns the global batch's loss, samples and
//                       tokens; and agrees on stopping (Ctrl-C/SIGTERM on any rank stops all ranks
//                       after the same step). optimizer_step then clips, checks and steps the same
//                       gradients on every rank: the same update, the same parameters.
//   files, output       only rank 0 writes the run directory (checkpoint, metrics, events, plots,
//                       report) and prints the progress bar and logs. Evaluation runs the same on
//                       every rank (rank 0's result is the one logged).
// So a job of N ranks with --batch B trains as one process with --batch N*B, to float rounding
// (with dropout 0: each rank draws dropout masks from the same stream for its own slice), and
// checkpoints move between the two (the config records the global batch).
//
// Training health. A step whose loss or global gradient norm is NaN or infinite does not update
// anything: its gradients are dropped, the optimizer's moments and step counts stay as they were,
// the schedule moves on (the step counts as taken), one line names the step and the value, and
// the skip is counted (metrics.jsonl "skipped_steps", the report). After --max-skips skips in a
// row the run stops (an ag::Error: exit 1). A checkpoint is written only when every parameter and
// every optimizer moment is finite, so a run that went non-finite never replaces a good one.
#include <CLI/CLI.hpp>

#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/core.h>

#include "apps/common/metrics.h"
#include "apps/common/plot.h"
#include "apps/common/progress.h"
#include "apps/common/report.h"
#include "apps/common/signal.h"
#include "autograd/autocast.h"
#include "autograd/tape.h"
#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"
#include "dist/dist.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace ag::apps {

// Exit codes of the apps: 0 done (or stopped by Ctrl-C after saving), 1 an error, 2 a usage error
// before any work starts: missing data (the message names the Debian package to install), or an
// unknown flag or a value out of range (one line naming it, and a pointer to --help).
constexpr int kExitError = 1;
constexpr int kExitNoData = 2;
constexpr int kExitUsage = 2;

// A bad option value or combination, found before any work starts (the apps exit kExitUsage and
// print it as one line with a pointer to --help). Raise it with usage_check.
struct UsageError : Error {
  using Error::Error;
};
template <class... Args>
void usage_check(bool cond, fmt::format_string<Args...> f, Args&&... args) {
  if (!cond) throw UsageError(fmt::format(f, std::forward<Args>(args)...));
}
// The one line an app prints for a UsageError: "app: <message> (app --help lists every option)".
void print_usage_error(const std::string& app, const std::string& message);

// Parses an app's command line. Returns -1 to go on; otherwise the code to exit with at once: 0
// after --help (printed), kExitUsage after a bad flag or value, reported on stderr in one line:
// "app: <what CLI11 found> (app --help lists every option)".
int parse_command_line(CLI::App& cli, int argc, const char* const* argv, const std::string& app);
// The options given on the command line after parsing, by their first long name ("--d-model").
std::vector<std::string> given_options(const CLI::App& cli);

// CLI11 checks for sizes and rates whose message states the bound ("--steps: -1 is not > 0");
// CLI::PositiveNumber's prints the largest double in full.
CLI::Validator positive();      // a number > 0
CLI::Validator non_negative();  // a number >= 0

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
  int threads = 0;             // 0: the cores other processes leave free (apps/common/threads.h)
  bool deterministic = false;  // ag::set_deterministic: the same bits at any thread count
  bool detect_anomaly = false;  // ag::detect_anomaly: the first op making a NaN/Inf raises, naming it
  std::string device = "cpu";
  std::string precision = "fp32";
  std::string out_dir;         // run directory; default runs/<app>
  bool resume = false;         // continue from <out>/checkpoint.safetensors
  int64_t eval_every = 0;      // steps between evaluations (0: 10 per run)
  int64_t log_every = 0;       // steps between training log lines (0: about 200 per run)
  int64_t checkpoint_every = 0;  // steps between checkpoints (0: at each evaluation)
  std::string data_dir;        // where the data is (each app has its default)
  bool eval_only = false;      // evaluate --checkpoint and exit
  std::string checkpoint;      // for --eval-only (default <out>/checkpoint.safetensors)
  std::string export_bf16;     // also write the tested model's weights in bf16 here (save_model)
  bool quiet = false;          // no progress bar
  int64_t stop_at = 0;         // stop after this step as Ctrl-C would: save, report, exit 0 (0: off)
  int64_t max_skips = 10;      // stop (exit 1) after this many non-finite steps in a row (0: never)
  int64_t patience = -1;       // stop after this many evaluations without a better validation metric
                               // (0: never; -1: the app decides from its data, resolve_patience)
  std::vector<std::string> command_line;  // argv as given: the resume hint repeats it + --resume
  std::vector<std::string> given;         // the options given on the command line (given_options)
  // which cadences apply_run_options derived from --steps (they were 0), so set_steps redoes them
  bool eval_every_auto = false, log_every_auto = false, checkpoint_every_auto = false;
};

// An option that sets the model or its data, and where the app's saved config holds its value (a
// JSON pointer: "/model/d_model").
struct SavedOption {
  std::string option, key;
};
// --eval-only evaluates the model as its checkpoint saved it: the model and its data are built from
// the checkpoint's config, not from the command line. So an option of `options` given on the
// command line (o.given) with another value than the checkpoint's would change nothing, silently:
// it is refused with a UsageError naming the option, its value, the checkpoint's value and the
// file. The same command as the training run plus --eval-only passes. `given`: the config the
// command line makes, by the same to_json as the checkpoint's `saved`; a key that `saved` lacks (a
// file from before the option existed) is not compared.
void check_eval_only_options(const RunOptions& o, const nlohmann::json& saved, const nlohmann::json& given,
                             std::span<const SavedOption> options, const std::string& app);

// Changes --steps after apply_run_options (an app's default that depends on its data) and derives
// again the cadences that were derived from it (--eval-every, --log-every, --checkpoint-every 0).
void set_steps(RunOptions& o, int64_t steps);

// Registers every RunOptions field as --steps, --batch, --lr, ..., showing the defaults the
// app set in `o` beforehand; the app adds its own model and data options next to them.
void add_run_options(CLI::App& cli, RunOptions& o);

// After parsing: joins the data-parallel job when started by mpirun (dist::init; on ranks other
// than 0, stdout and stderr then go to /dev/null, and print_error alone reaches the console),
// checks every value and combination (validate_run_options), sets the thread count (--threads 0
// under mpirun: the cores divided among this host's ranks), determinism, anomaly mode
// (--detect-anomaly) and this thread's autocast precision (--precision), fills the defaults that
// depend on others (out_dir, eval_every, checkpoint path).
void apply_run_options(RunOptions& o, const std::string& app);

// --patience -1 (the default): `small_data` decides, 5 evaluations for a small training set (where
// a model memorises before the schedule ends), 0 (off) otherwise. Returns the line that says what
// was chosen and why ("" when --patience was given).
std::string resolve_patience(RunOptions& o, bool small_data, const std::string& why);
// Below this many training samples the apps count a set as small (vit, textclf, longseq): it is
// memorised long before their default schedules end, so their data-size defaults apply.
constexpr int64_t kSmallTrainSet = 20000;

// The global batch of a data-parallel job: world_size() x the per-rank --batch.
int64_t global_batch(const RunOptions& o);
// The checks alone, before anything is set up: a UsageError naming the option and its value for
// steps, batch, lr < 1; min-lr outside [0, lr]; warmup outside [0, 1]; weight decay, clip,
// threads, eval/checkpoint cadence or max-skips < 0; dropout outside [0, 1); stop-at outside
// [0, steps]; a --device that does not parse, a cuda one in a build without CUDA or on a machine
// without that GPU; under mpirun with more than one rank, --device cuda:N (each rank takes the GPU
// of its local rank: --device cuda), --device cuda in a build without NCCL (ATTOGRAD_NCCL), or more
// ranks on this host than GPUs; a precision other than fp32, bf16 or fp16.
void validate_run_options(const RunOptions& o, const std::string& app);

// The device --device names (after validate_run_options): the app moves its model there with
// model.to() before building the optimizer; the models copy each host batch there in forward.
// Under mpirun, --device cuda is this rank's GPU (dist::rank_gpu(): its local rank's).
Device training_device(const RunOptions& o);
// The autocast precision --precision names; apply_run_options sets it on the calling thread
// (ag::set_autocast_precision) for the whole run.
Precision training_precision(const RunOptions& o);

// Sharded evaluation in a data-parallel job: each rank evaluates a part of the split and the
// partial sums are added over the ranks, so every rank returns the whole split's result in 1/N of
// the time. eval_part(n, r, N) = the items {r, r + N, r + 2N, ...} of [0, n): strided, so that a
// split sorted by length gives every rank the same mix. sum_over_ranks adds `values` (loss sums,
// counts) and `cm`'s counts (may be null) over the job's ranks (dist::all_reduce_sum; nothing in
// a job of one). Every rank must call it, the same number of times.
std::vector<int64_t> eval_part(int64_t n, int rank, int world);
void sum_over_ranks(std::vector<double>& values, ConfusionMatrix* cm = nullptr);

// Eval mode and no recording for its lifetime (inference: generation, evaluation, scoring); the
// model's previous mode is restored after.
struct InferenceScope {
  nn::Module& m;
  bool was_training;
  NoGradGuard no_grad;
  explicit InferenceScope(nn::Module& mod) : m(mod), was_training(mod.is_training()) { m.eval(); }
  ~InferenceScope() { m.train(was_training); }
  InferenceScope(const InferenceScope&) = delete;
  InferenceScope& operator=(const InferenceScope&) = delete;
};

// A classifier's evaluation on items [0, n) of a split, `batch` items per forward, in eval mode
// and without recording (the model's mode is restored): `logits_labels(indices)` runs the model on
// those items and returns their logits (B, K) and labels (B). With `sharded`, each rank evaluates
// its eval_part and the sums are added over the ranks (every rank must call it). Returns the mean
// cross-entropy, the accuracy and `confusion` filled with every item.
struct ClassifierEval {
  double loss = 0;      // mean cross-entropy (no label smoothing)
  double accuracy = 0;  // fraction of argmax == label
  int64_t samples = 0;
  std::optional<ConfusionMatrix> confusion;  // rows: true class, columns: predicted
};
ClassifierEval evaluate_classifier(
    nn::Module& model, int64_t n, int64_t batch, bool sharded, ConfusionMatrix confusion,
    const std::function<std::pair<Tensor, Tensor>(std::span<const int64_t>)>& logits_labels);

// Where the apps cache data they make from Debian's packages (the text of bible-kjv):
// $HOME/.cache/attograd, or ./.cache/attograd without $HOME.
std::string default_cache_dir();
// The shell command that resumes a stopped run: `argv` (quoted where the shell needs it) without
// --stop-at and its value, plus --resume (unless already there).
std::string resume_command(const std::vector<std::string>& argv);

// The current resident set size of this process in bytes (/proc/self/statm: resident pages times
// the page size; 0 where that file is missing). Current, not peak: what metrics.jsonl logs.
int64_t current_rss_bytes();

// Whether every element of every floating tensor is finite (integer tensors are skipped).
bool all_finite(const std::vector<Tensor>& tensors);

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
// Whether a config value read back from a checkpoint is an integer in [lo, hi]: what must hold
// before it is converted (a float such as 1e22 has no integer value: converting it is undefined).
bool json_integer_in(const nlohmann::json& v, int64_t lo, int64_t hi);
// j[key] as T, or an ag::Error naming `app` and the key (nlohmann's own message says neither which
// key nor which file): an integer T must hold the value (json_integer_in, within int64's range).
template <class T>
T config_value(const nlohmann::json& j, const char* key, std::string_view app) {
  if (!j.is_object() || !j.contains(key)) fail("{}: the config has no '{}' entry: {}", app, key, j.dump());
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    constexpr int64_t lo = std::is_signed_v<T> ? int64_t(std::numeric_limits<T>::min()) : 0;
    constexpr int64_t hi = std::numeric_limits<T>::max() > uint64_t(std::numeric_limits<int64_t>::max())
                               ? std::numeric_limits<int64_t>::max()
                               : int64_t(std::numeric_limits<T>::max());
    if (!json_integer_in(j.at(key), lo, hi))
      fail("{}: the config's '{}' entry must be an integer that fits, got {}", app, key, j.at(key).dump());
  }
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(fmt::format("{}: the config's '{}' entry has the wrong type: {}", app, key, j.at(key).dump()));
  }
}

class Run {
 public:
  // `config`: the app's model and data settings (saved with every checkpoint and in the report);
  // `extra`: more string metadata for checkpoints (e.g. the tokenizer's JSON).
  Run(std::string app, const RunOptions& o, nn::Module& model, optim::Optimizer& opt, Generator& gen,
      nlohmann::json config, std::map<std::string, std::string> extra = {});
  ~Run();

  // With --resume and a checkpoint in the run dir: loads model, optimizer, RNG and returns its
  // step (the metrics files are appended to). Otherwise 0. A checkpoint written before the
  // evaluation of its step (see save) has that step evaluated (evaluate_with) before it returns.
  int64_t resume();
  // Ctrl-C or SIGTERM arrived, --stop-at's step (when before the last) is done, or --patience
  // evaluations passed without a better validation metric. Under mpirun a signal counts once
  // reduce_step has shared it, so every rank stops after the same step (the evaluations, and so an
  // early stop, are the same on every rank).
  bool stop_requested() const;

  // Model selection (see the top of this file). Call before resume().
  void select_by(std::string metric, bool higher_is_better, std::string tie_breaker = "");
  struct Best {
    int64_t step = -1;  // -1: no evaluation yet
    double value = 0, tie = 0;
    int64_t evals_since = 0;  // evaluations since the best one
  };
  const Best& best() const { return best_; }
  bool early_stopped() const { return early_stop_; }
  // Loads the model weights of best.safetensors (when this run has written one) and returns its
  // step; else leaves the model as it is and returns -1. Prints one line saying which model the
  // final evaluation sees.
  int64_t load_best();

  // What one step trained on, over all ranks.
  struct StepTotals {
    double loss = 0;          // mean loss over the global batch
    int64_t samples = 0, tokens = 0;
  };
  // After backward on this rank's slice (`loss` its mean loss over `samples` samples and `tokens`
  // tokens): finishes the gradient all-reduce (every .grad is then the mean over the global
  // batch), and sums over the ranks in one all-reduce
  //   loss = sum_r loss_r samples_r / sum_r samples_r,  samples = sum_r samples_r,  tokens likewise,
  // and whether a stop signal arrived on any rank. With one process it returns its arguments.
  // Call it every step, on every rank, before optimizer_step.
  StepTotals reduce_step(double loss, int64_t samples, int64_t tokens = 0);

  // After backward (and reduce_step): the guarded update of step `step` (1-based, as step_done).
  // `loss` is the global batch's (reduce_step's), so every rank decides alike. Clips the global
  // gradient norm to --clip (with --clip 0 the norm is only measured), then, when `loss` and the
  // norm are both finite, opt.step() and returns true. Otherwise skips the update as described at
  // the top of this file and returns false; raises ag::Error when that makes --max-skips in a row.
  // With --precision fp16 the gradients are first divided by the loss scale; a finite loss with a
  // non-finite gradient norm is then an fp16 overflow, not a divergence: the update is skipped,
  // the scale halved (optim::GradScaler), and the step counts in loss_scale_skips(), not towards
  // --max-skips.
  bool optimizer_step(int64_t step, double loss);
  double last_grad_norm() const { return last_grad_norm_; }  // before clipping
  // The factor the app multiplies its loss by before backward: the GradScaler's scale with
  // --precision fp16, else 1.
  double loss_scale() const { return scaler_ ? scaler_->get_scale() : 1.0; }
  int64_t loss_scale_skips() const { return scale_skips_; }
  int64_t skipped_steps() const { return skipped_; }

  // After the update that made `step` steps: advances the progress bar (loss, lr, smoothed
  // throughput) and averages the training loss for the next lines. `samples` and `tokens` are the
  // global batch's (reduce_step's). Every --log-every steps (and at the last) it logs, to
  // metrics.jsonl, tfevents and curves.svg, the means since the previous such line of the finite
  // training losses ("train_loss") and of the finite gradient norms before clipping
  // ("grad_norm"), the learning rate ("lr") and the training throughput over that interval
  // ("samples_per_s", and "tokens_per_s" when the app counts tokens; evaluation and checkpoint
  // time left out).
  void step_done(int64_t step, double loss, int64_t samples, int64_t tokens = 0);
  bool eval_due(int64_t step) const;
  bool checkpoint_due(int64_t step) const;
  // The app's evaluation of its validation split at a step, which calls log_eval. Call before
  // resume().
  void evaluate_with(std::function<void(int64_t)> evaluate);
  // After step_done: saves when checkpoint_due(step), then evaluates when eval_due(step). The
  // save comes first so that a crash during the evaluation loses no training (see save).
  void end_step(int64_t step);
  // Logs scalars (e.g. {"val_loss", ..}, {"val_accuracy", ..}) with the skipped steps so far and
  // the current RSS ("rss_mb") to metrics.jsonl and tfevents (curves.svg gets the losses and
  // accuracies); prints one line, which also shows the mean finite training loss since the
  // previous evaluation and the learning rate (the training curve itself is step_done's).
  void log_eval(int64_t step, const Scalars& scalars);
  // Writes the checkpoint atomically (model, optimizer, step, RNG, config, extra, and the partial
  // training-loss average and skip counts, so a resumed run logs what an unbroken one would).
  // Refuses when a parameter or an optimizer moment is not finite: says so, leaves the previous
  // checkpoint as it was and returns false. Under mpirun only rank 0 writes (the ranks hold the
  // same parameters); the others return true.
  // end_step saves a step before it evaluates it, so that a crash during the evaluation (or any
  // time before the next save) loses no training: a checkpoint of an eval_due step not yet
  // evaluated is marked ("run.eval_pending"), and a run resumed from it evaluates that step first
  // (resume), which gives what the unbroken run gave: the same model, RNG and selection state. A
  // second save of the same step with nothing logged or trained since writes nothing.
  bool save(int64_t step);
  // Prints a line without breaking the progress bar (rank 0 only).
  void print(const std::string& line);

  // Fills the timing, throughput, memory and skip fields of `report`, prints it and writes
  // <out>/report.json (rank 0). After Ctrl-C, SIGTERM or --stop-at, prints how to resume.
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
  std::unique_ptr<dist::GradReducer> reducer_;  // under mpirun: averages the gradients
  bool reduced_ = true;         // reduce_step ran since the last optimizer_step
  int agreed_signal_ = 0;       // the stop signal any rank received, as reduce_step shared it
  std::unique_ptr<MetricsLogger> metrics_;
  std::unique_ptr<ProgressBar> bar_;
  TrainingCurves curves_;
  double start_time_, train_seconds_ = 0, last_step_time_ = 0;
  double loss_sum_ = 0;  // since the last evaluation line (printed with it)
  int64_t loss_count_ = 0, first_step_ = 0, last_step_ = 0, samples_ = 0, tokens_ = 0;
  // since the last training log line (step_done): the checkpoint carries them, so that a resumed
  // run logs the numbers an unbroken one would; the throughput restarts at the resume
  struct LogInterval {
    double loss_sum = 0, grad_norm_sum = 0;
    int64_t loss_count = 0, grad_norm_count = 0, samples = 0, tokens = 0;
  } log_;
  double log_train_start_ = 0;  // train_seconds_ at the last training log line
  void log_train(int64_t step);
  double last_grad_norm_ = 0;
  int64_t skipped_ = 0, skips_in_a_row_ = 0, last_saved_step_ = -1;
  int64_t last_eval_step_ = -1;  // the step of the last log_eval
  bool eval_pending_ = false;    // the resumed checkpoint's "run.eval_pending"
  std::function<void(int64_t)> evaluate_;  // evaluate_with's
  bool changed_ = true;          // trained or logged since the last save
  void write_checkpoint(const std::string& file, int64_t step, const std::map<std::string, std::string>& more = {});
  // What a saved model of this run carries to read_checkpoint_info: the caller's extra entries,
  // the config, --steps (checkpoints add the run's own state to it; --export-bf16 files do not).
  std::map<std::string, std::string> model_metadata() const;
  std::string select_metric_, select_tie_;
  bool select_higher_ = true;
  Best best_;
  bool early_stop_ = false;
  std::optional<optim::GradScaler> scaler_;  // --precision fp16
  int64_t scale_skips_ = 0;                   // updates skipped for an fp16 gradient overflow
};

// Prints "app: message" on stderr: the one line an app prints for an error before it exits. A
// message that already starts with "app:" (the app's own checks) is printed as it is, not twice.
// On a rank other than 0 of a data-parallel job it reaches the console, as "app: rank r of N: ...".
void print_error(const std::string& app, const std::string& message);

// The exit of an app after print_error: returns `code`, except in a job of several ranks, where
// returning would leave the other ranks waiting in a collective: it ends the whole job with
// `code` at once (dist::abort).
int error_exit(int code);

}  // namespace ag::apps
