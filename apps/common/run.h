#pragma once
// One training run in its run directory (default runs/<app>), which every app writes alike:
//
//   <out>/checkpoint.safetensors   model + AdamW state + step + RNG + config (+ tokenizer), atomic
//   <out>/best.safetensors         the same, at the evaluation with the best validation metric
//   <out>/metrics.jsonl            one line every --log-every steps (train_loss, lr, grad_norm,
//                                  samples_per_s, tokens_per_s) and one per evaluation (val_*,
//                                  test_*, skipped_steps, rss_mb)
//   <out>/events.out.tfevents.*    the same scalars for `tensorboard --logdir <out>`
//   <out>/curves.svg               the training loss, lr, gradient norm and throughput over steps,
//                                  the evaluations' losses and accuracies beside them
//   <out>/report.json              the final report (also printed)
//
// A training loop on it (apps/vit/main.cpp is one):
//
//   Run run("vit", o, model, opt, gen, config);       // header line, Ctrl-C handler, metrics files
//   run.evaluate_with([&](int64_t s) { run.log_eval(s, evaluate(validation split)); });
//   int64_t step = run.resume();                      // --resume: load the checkpoint, else 0
//   for (; step < o.steps && !run.stop_requested(); ++step) {   // Ctrl-C, SIGTERM, --stop-at
//     schedule->set_lr(opt, step);
//     const double loss = compute_gradients(opt, <the batch's mean loss>, run.loss_scale());
//     run.update(step + 1, loss, samples);   // reduce over ranks, clip, step, log, save, evaluate
//   }
//   run.save(step);   // also after Ctrl-C: nothing trained is lost (nothing written when unchanged)
//   run.load_best();  // the model of the best validation metric (run.select_by), for the test set
//   run.finish(report);   // after a stop: prints the command line that resumes
//
// The options (RunOptions) and the command line are apps/common/options.h; main()'s frame is
// apps/common/app.h; evaluation helpers are apps/common/evaluate.h.
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
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/core.h>

#include "apps/common/evaluate.h"
#include "apps/common/metrics.h"
#include "apps/common/options.h"
#include "apps/common/plot.h"
#include "apps/common/progress.h"
#include "apps/common/report.h"
#include "apps/common/signal.h"
#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"
#include "dist/dist.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"

namespace ag::apps {


// The current resident set size of this process in bytes (/proc/self/statm: resident pages times
// the page size; 0 where that file is missing). Current, not peak: what metrics.jsonl logs.
int64_t current_rss_bytes();

// Whether every element of every floating tensor is finite (integer tensors are skipped).
bool all_finite(const std::vector<Tensor>& tensors);

// The metadata a checkpoint carries besides tensors: the app's config and anything else the app
// needs to rebuild its model and data (the tokenizer), as JSON strings.
struct CheckpointInfo {
  std::string app;  // the app that wrote it ("" in files that do not say)
  int64_t step = 0;
  nlohmann::json config;               // the model + data config the run was started with
  std::map<std::string, std::string> extra;  // the app's entries (e.g. "tokenizer")
};
// Reads only the metadata of a checkpoint (to build the model before loading its weights). With
// `app`, a checkpoint another app wrote is refused with a UsageError that names both apps.
CheckpointInfo read_checkpoint_info(const std::string& path, const std::string& app = "");
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

// The gradients of one step: zeroes the optimizer's gradients, then runs backward from `loss`, a
// scalar mean over the batch, multiplied by `scale` first: the fp16 loss scale (Run::loss_scale);
// at 1 nothing is multiplied. Returns the loss's value, unscaled.
double compute_gradients(optim::Optimizer& opt, const Tensor& loss, double scale);

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
  // The bookkeeping of one step after its backward, in the order the calls below describe:
  // reduce_step (the global batch), optimizer_step (clip, check, update), step_done (progress and
  // logs) and end_step (save, then evaluate). `step` counts the steps made with this one (1-based);
  // `loss`, `samples` and `tokens` are this rank's. Returns whether the update was applied.
  bool update(int64_t step, double loss, int64_t samples, int64_t tokens = 0);

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
  // --resume with other schedule options (--steps, --lr, --min-lr, --warmup, --schedule) than the
  // checkpoint's: a UsageError naming the option and both values
  void check_resumed_schedule(const CheckpointInfo& info, const std::string& ckpt) const;
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

}  // namespace ag::apps
