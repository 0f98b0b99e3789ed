#pragma once
// The options every app shares and the rules of its command line: the RunOptions fields and their
// flags (--steps, --lr, --resume, ...), the checks before any work starts, the exit codes, and the
// one line an app prints for an error. apps/common/app.h puts them together into an app's main().
#include <CLI/CLI.hpp>

#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "autograd/autocast.h"
#include "core/dtype.h"
#include "core/error.h"
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
  std::string out_dir{};       // run directory; default runs/<app>
  bool resume = false;         // continue from <out>/checkpoint.safetensors
  int64_t eval_every = 0;      // steps between evaluations (0: 10 per run)
  int64_t log_every = 0;       // steps between training log lines (0: about 200 per run)
  int64_t checkpoint_every = 0;  // steps between checkpoints (0: at each evaluation)
  std::string data_dir{};      // where the data is (each app has its default)
  bool eval_only = false;      // evaluate --checkpoint and exit
  std::string checkpoint{};    // for --eval-only (default <out>/checkpoint.safetensors)
  std::string export_bf16{};   // also write the tested model's weights in bf16 here (save_model)
  bool quiet = false;          // no progress bar
  int64_t stop_at = 0;         // stop after this step as Ctrl-C would: save, report, exit 0 (0: off)
  int64_t max_skips = 10;      // stop (exit 1) after this many non-finite steps in a row (0: never)
  int64_t patience = -1;       // stop after this many evaluations without a better validation metric
                               // (0: never; -1: the app decides from its data, resolve_patience)
  std::vector<std::string> command_line{};  // argv as given: the resume hint repeats it + --resume
  std::vector<std::string> given{};         // the options given on the command line (given_options)
  // which cadences apply_run_options derived from --steps (they were 0), so set_steps redoes them
  bool eval_every_auto = false, log_every_auto = false, checkpoint_every_auto = false;
};

// Whether `option` ("--steps") was given on the command line (RunOptions::given): an app's default
// that depends on its data never overrides what the user asked for.
bool was_given(const RunOptions& o, const std::string& option);

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

// The validation split of every app: --val-size -1 holds out kValPercent% of the `n_train`
// training samples, at least 1 and at most kValCap (a few thousand samples measure an accuracy to
// within about a point; more would only take training data away); a count >= 0 is taken as it
// is. A UsageError names `option` when the split leaves no training sample.
constexpr int64_t kValPercent = 10, kValCap = 5000;
int64_t validation_size(int64_t requested, int64_t n_train, const std::string& option = "--val-size");

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

// Where the apps cache data they make from Debian's packages (the text of bible-kjv):
// $HOME/.cache/attograd, or ./.cache/attograd without $HOME.
std::string default_cache_dir();
// The shell command that resumes a stopped run: `argv` (quoted where the shell needs it) without
// --stop-at and its value, plus --resume (unless already there).
std::string resume_command(const std::vector<std::string>& argv);

// The schedule the options describe: a linear warmup then cosine to --min-lr, constant, or step
// decay by 0.1 every third of the steps.
std::unique_ptr<optim::Schedule> make_schedule(const RunOptions& o);

// Prints "app: message" on stderr: the one line an app prints for an error before it exits. A
// message that already starts with "app:" (the app's own checks) is printed as it is, not twice.
// On a rank other than 0 of a data-parallel job it reaches the console, as "app: rank r of N: ...".
void print_error(const std::string& app, const std::string& message);

// The exit of an app after print_error: returns `code`, except in a job of several ranks, where
// returning would leave the other ranks waiting in a collective: it ends the whole job with
// `code` at once (dist::abort).
int error_exit(int code);

}  // namespace ag::apps
