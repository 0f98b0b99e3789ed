#include "apps/common/options.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/core.h>

#include "apps/common/threads.h"
#include "autograd/tape.h"
#include "core/error.h"
#include "core/parallel.h"
#include "cuda/memory.h"
#include "dist/dist.h"

namespace ag::apps {

namespace fs = std::filesystem;

namespace {

// The cadences left to --steps (their option was 0): ten evaluations, about 200 training lines,
// a checkpoint at every evaluation.
void derive_cadences(RunOptions& o) {
  if (o.eval_every_auto) o.eval_every = std::max<int64_t>(1, o.steps / 10);
  if (o.log_every_auto) o.log_every = std::max<int64_t>(1, o.steps / 200);
  if (o.checkpoint_every_auto) o.checkpoint_every = o.eval_every;
}

CLI::Validator bound_check(bool strict, const char* name) {
  return CLI::Validator(
      [strict](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || std::isnan(v)) return fmt::format("'{}' is not a number", text);
        if (strict ? v > 0 : v >= 0) return "";
        return fmt::format("{} is not {} 0", text, strict ? ">" : ">=");
      },
      strict ? "> 0" : ">= 0", name);
}

// On a rank other than 0: a duplicate of the stderr it started with (the console), for
// print_error; stdout and stderr themselves go to /dev/null. -1 on rank 0 and alone.
int g_console_fd = -1;

// Ranks other than 0 print nothing (the progress bar, logs and reports are rank 0's), except their
// errors: their stdout and stderr go to /dev/null, and print_error writes to g_console_fd.
void silence_other_ranks() {
  if (dist::is_main() || g_console_fd >= 0) return;
  std::fflush(stdout);
  std::fflush(stderr);
  const int null = ::open("/dev/null", O_WRONLY);
  if (null < 0) return;  // nothing to redirect to: keep printing
  g_console_fd = ::dup(STDERR_FILENO);
  ::dup2(null, STDOUT_FILENO);
  ::dup2(null, STDERR_FILENO);
  ::close(null);
}

// The ranks running on this host (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE; else all of them).
int ranks_on_this_host() {
  if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) return std::max(1, std::atoi(v));
  return dist::world_size();
}
}  // namespace

CLI::Validator positive() { return bound_check(true, "POSITIVE"); }
CLI::Validator non_negative() { return bound_check(false, "NONNEGATIVE"); }

void add_run_options(CLI::App& cli, RunOptions& o) {
  // every option below shows its default in --help; the caller's setting for its own options is
  // restored at the end
  const bool shown = cli.option_defaults()->get_always_capture_default();
  cli.option_defaults()->always_capture_default();
  cli.add_option("--steps", o.steps, "optimizer steps")->check(positive());
  cli.add_option("--batch", o.batch, "batch size (per process: under mpirun -np N the global batch is N x this)")
      ->check(positive());
  cli.add_option("--lr", o.lr, "peak learning rate (AdamW)")->check(positive());
  cli.add_option("--min-lr", o.min_lr, "final learning rate of the cosine schedule")
      ->check(non_negative());
  cli.add_option("--warmup", o.warmup, "fraction of the steps with a linear warmup")
      ->check(CLI::Range(0.0, 1.0));
  cli.add_option("--schedule", o.schedule, "lr schedule: cosine (after warmup), constant, step (x0.1 every third)")
      ->check(CLI::IsMember({"cosine", "constant", "step"}));
  cli.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay")
      ->check(non_negative());
  cli.add_option("--clip", o.clip, "clip the global gradient norm to this (0: off; the norm is checked either way)")
      ->check(non_negative());
  cli.add_option("--dropout", o.dropout, "dropout probability")->check(CLI::Range(0.0, 0.99));
  cli.add_option("--seed", o.seed, "seed of initialisation, data order, dropout and sampling");
  cli.add_option("--threads", o.threads,
                 "CPU threads (0: the cores other processes leave free, re-measured as the run goes; under mpirun, the "
                 "cores divided among this host's ranks)")
      ->check(non_negative());
  cli.add_flag("--deterministic", o.deterministic,
               "the same results bit for bit at any --threads (ag::set_deterministic; costs nothing on the f32 "
               "CPU path)");
  cli.add_flag("--detect-anomaly", o.detect_anomaly,
               "stop at the first op whose output, or the first backward node whose gradient, holds a NaN or an "
               "Inf, naming the op, its shapes and the source line that called it (ag::detect_anomaly; slower: "
               "every value is checked)");
  cli.add_option("--device", o.device, "cpu or cuda[:N] (under mpirun: cuda, each rank on the GPU of its local rank)");
  cli.add_option("--precision", o.precision,
                 "fp32, bf16 or fp16: autocast (ag::AutocastGuard) of matmul, linear and attention to 16-bit "
                 "operands summed in f32, weights, gradients and optimizer in f32; fp16 with dynamic loss "
                 "scaling (tensor cores on a GPU; bf16 on a CPU with AVX512-BF16: native products, faster than fp32, "
                 "evaluation and generation reading bf16 copies of the weights; elsewhere emulated: the same "
                 "numbers, slower than fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cli.add_option("--out,--checkpoint-dir", o.out_dir,
                 "run directory: checkpoint, metrics, TensorBoard events, plots, report (default runs/<app>)");
  cli.add_flag("--resume", o.resume, "continue from the checkpoint in the run directory");
  cli.add_option("--eval-every", o.eval_every, "steps between evaluations (0: ten per run)")
      ->check(non_negative());
  cli.add_option("--log-every", o.log_every,
                 "steps between training log lines (train loss, lr, gradient norm, throughput) in metrics.jsonl, "
                 "TensorBoard and curves.svg (0: about 200 per run)")
      ->check(non_negative());
  cli.add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (0: at every evaluation)")
      ->check(non_negative());
  cli.add_option("--data-dir", o.data_dir, "where the data is");
  cli.add_flag("--eval-only", o.eval_only,
               "evaluate --checkpoint (or the run directory's) and exit: the model and its data as the checkpoint "
               "saved them (an option of theirs given with another value is refused)");
  cli.add_option("--checkpoint", o.checkpoint, "checkpoint file for --eval-only");
  cli.add_option("--export-bf16", o.export_bf16,
                 "at the end of training, also write the model that was tested, its weights rounded to bf16 "
                 "(half the size, no optimizer state), to this file: for --eval-only --checkpoint FILE and "
                 "generation, not for --resume");
  cli.add_flag("--quiet", o.quiet, "no progress bar (evaluation lines and the report only)");
  cli.add_option("--stop-at", o.stop_at,
                 "stop after this step of the --steps schedule as Ctrl-C would: save, report, exit 0; continue "
                 "with --resume (0: off)")
      ->check(non_negative());
  cli.add_option("--patience", o.patience,
                 "stop after this many evaluations without a better validation metric; the best model is kept "
                 "in best.safetensors and tested at the end (0: never stop early; -1: 5 for a small training "
                 "set, else 0)")
      ->check(CLI::Range(int64_t(-1), std::numeric_limits<int64_t>::max()));
  cli.add_option("--max-skips", o.max_skips,
                 "stop (exit 1) after this many steps in a row with a non-finite loss or gradient norm, whose "
                 "updates are skipped (0: never)")
      ->check(non_negative());
  cli.option_defaults()->always_capture_default(shown);
}

void validate_run_options(const RunOptions& o, const std::string& app) {
  // CLI11 already refuses most of these at parse time; checked again here for callers that fill
  // RunOptions themselves, and for the combinations no single option's check can see
  usage_check(o.steps >= 1, "{}: --steps {}: expected at least 1", app, o.steps);
  usage_check(o.export_bf16.empty() || !o.eval_only,
              "{}: --export-bf16 {}: writes the model at the end of training; --eval-only trains nothing", app,
              o.export_bf16);
  if (!o.export_bf16.empty()) {  // found out now, not after the training
    const fs::path dir = fs::path(o.export_bf16).parent_path();
    usage_check(!fs::is_directory(o.export_bf16) && (dir.empty() || fs::is_directory(dir)),
                "{}: --export-bf16 {}: expected a file in an existing folder", app, o.export_bf16);
  }
  usage_check(o.batch >= 1, "{}: --batch {}: expected at least 1", app, o.batch);
  usage_check(o.lr > 0 && std::isfinite(o.lr), "{}: --lr {}: expected a finite value > 0", app, o.lr);
  usage_check(o.min_lr >= 0 && o.min_lr <= o.lr, "{}: --min-lr {}: expected 0 <= min-lr <= --lr {}", app, o.min_lr,
              o.lr);
  usage_check(o.warmup >= 0 && o.warmup <= 1, "{}: --warmup {}: expected a fraction of the steps in [0, 1]", app,
              o.warmup);
  usage_check(o.weight_decay >= 0 && std::isfinite(o.weight_decay), "{}: --weight-decay {}: expected >= 0", app,
              o.weight_decay);
  usage_check(o.clip >= 0 && std::isfinite(o.clip), "{}: --clip {}: expected >= 0 (0: off)", app, o.clip);
  usage_check(o.dropout >= 0 && o.dropout < 1, "{}: --dropout {}: expected a probability in [0, 1)", app, o.dropout);
  usage_check(o.threads >= 0 && o.threads <= max_threads(),
              "{}: --threads {}: expected 0 (the free cores) to {} (4 x this machine's {} processors)", app, o.threads,
              max_threads(), omp_get_num_procs());
  usage_check(o.eval_every >= 0, "{}: --eval-every {}: expected >= 0 (0: ten evaluations per run)", app,
              o.eval_every);
  usage_check(o.log_every >= 0, "{}: --log-every {}: expected >= 0 (0: about 200 lines per run)", app, o.log_every);
  usage_check(o.checkpoint_every >= 0, "{}: --checkpoint-every {}: expected >= 0 (0: at every evaluation)", app,
              o.checkpoint_every);
  usage_check(o.stop_at >= 0 && o.stop_at <= o.steps,
              "{}: --stop-at {} is outside [0, --steps {}] (0: off; the run stops after that step, resumable)", app,
              o.stop_at, o.steps);
  usage_check(o.patience >= -1, "{}: --patience {}: expected >= 0 (0: never stop early; -1: by the data size)", app,
              o.patience);
  usage_check(o.max_skips >= 0, "{}: --max-skips {}: expected >= 0 (0: never stop)", app, o.max_skips);
  Device device = Device::cpu();
  try {
    device = Device::parse(o.device);
  } catch (const Error&) {
    throw UsageError(fmt::format("{}: --device: expected cpu, cuda or cuda:N, got '{}'", app, o.device));
  }
  if (device.is_cuda()) {
#if ATTOGRAD_WITH_CUDA
    const int world = dist::world_size(), gpus = cuda::device_count();
    if (world > 1) {
      // data parallel on GPUs: one GPU per rank, the one of its local rank (dist::rank_gpu), and
      // the gradients all-reduced in device memory by NCCL
      usage_check(o.device == "cuda",
                  "{}: --device {}: under mpirun ({} ranks) use --device cuda, each rank takes the GPU of its local "
                  "rank",
                  app, o.device, world);
      usage_check(dist::nccl_available(),
                  "{}: --device cuda under mpirun ({} ranks): this build has no NCCL, which data-parallel training "
                  "on GPUs needs (configure with -DATTOGRAD_NCCL=ON; NCCL comes with the CUDA toolkit or "
                  "libnccl-dev); use --device cpu, or one process",
                  app, world);
      usage_check(gpus >= ranks_on_this_host(),
                  "{}: --device cuda: {} ranks on this host, but {} (nvidia-smi lists the GPUs); each rank needs a "
                  "GPU of its own: start at most as many ranks per host as there are GPUs, or use --device cpu",
                  app, ranks_on_this_host(),
                  gpus == 0 ? std::string("no CUDA GPU is visible")
                            : fmt::format("only {} CUDA GPU(s) are visible", gpus));
    } else {
      usage_check(gpus > device.index, "{}: --device {}: {} (nvidia-smi lists the GPUs); use --device cpu", app,
                  o.device,
                  gpus == 0 ? std::string("no CUDA GPU is visible")
                            : fmt::format("only {} CUDA GPU(s) are visible", gpus));
    }
#else
    throw UsageError(fmt::format("{}: --device {}: this build has no CUDA backend (configure with "
                                 "-DATTOGRAD_CUDA=ON on a machine with nvcc); use --device cpu",
                                 app, o.device));
#endif
  }
  usage_check(parse_precision(o.precision).has_value(), "{}: --precision {}: expected fp32, bf16 or fp16", app,
              o.precision);
}

void apply_run_options(RunOptions& o, const std::string& app) {
  try {
    dist::init();  // mpirun's job, or a job of one
  } catch (const Error& e) {  // started by mpirun, but this build has no MPI
    throw UsageError(fmt::format("{}: {}", app, e.what()));
  }
  silence_other_ranks();
  validate_run_options(o, app);
  auto_threads().stop();
  if (o.threads > 0)
    set_num_threads(o.threads);
  else if (ranks_on_this_host() > 1)  // every core, shared among the ranks: no oversubscription
    set_num_threads(std::max(1, num_threads() / ranks_on_this_host()));
  else if (dist::world_size() == 1)  // the cores other processes leave free (apps/common/threads.h)
    auto_threads().start();
  if (o.deterministic) set_deterministic(true);
  if (o.detect_anomaly) detect_anomaly(true);
  // this thread's autocast precision for the whole run: training, evaluation and sampling alike
  set_autocast_precision(training_precision(o));
  if (o.out_dir.empty()) o.out_dir = "runs/" + app;
  o.eval_every_auto |= o.eval_every <= 0, o.log_every_auto |= o.log_every <= 0;
  o.checkpoint_every_auto |= o.checkpoint_every <= 0;
  derive_cadences(o);
  if (o.checkpoint.empty()) o.checkpoint = o.out_dir + "/checkpoint.safetensors";
}

Device training_device(const RunOptions& o) {
  // under mpirun, --device cuda is each rank's own GPU (validate_run_options refuses cuda:N there)
  if (o.device == "cuda" && dist::world_size() > 1) return dist::rank_gpu();
  return Device::parse(o.device);
}

Precision training_precision(const RunOptions& o) {
  const std::optional<Precision> p = parse_precision(o.precision);
  check(p.has_value(), "--precision {}: expected fp32, bf16 or fp16", o.precision);
  return *p;
}

std::string resolve_patience(RunOptions& o, bool small_data, const std::string& why) {
  if (o.patience >= 0) return "";
  o.patience = small_data ? 5 : 0;
  return small_data ? fmt::format("--patience 5: {}, so the run stops after 5 evaluations without a better "
                                  "validation metric (--patience 0: never)",
                                  why)
                    : fmt::format("--patience 0: {}; the best model by validation is still the one tested", why);
}

void set_steps(RunOptions& o, int64_t steps) {
  usage_check(steps >= 1, "--steps {}: expected at least 1", steps);
  o.steps = steps;
  derive_cadences(o);
  o.stop_at = std::min(o.stop_at, o.steps);
}

bool was_given(const RunOptions& o, const std::string& option) {
  return std::find(o.given.begin(), o.given.end(), option) != o.given.end();
}

int64_t validation_size(int64_t requested, int64_t n_train, const std::string& option) {
  const int64_t n = requested >= 0 ? requested
                                   : std::clamp<int64_t>(n_train * kValPercent / 100, 1,
                                                         std::min<int64_t>(kValCap, std::max<int64_t>(1, n_train - 1)));
  usage_check(n < n_train, "{} {}: leaves no training sample (the training set has {})", option, n, n_train);
  return n;
}

int64_t global_batch(const RunOptions& o) { return int64_t(dist::world_size()) * o.batch; }

std::string default_cache_dir() {
  const char* home = std::getenv("HOME");
  return (home && *home ? std::string(home) : std::string(".")) + "/.cache/attograd";
}

std::string resume_command(const std::vector<std::string>& argv) {
  // a word the shell reads as it is: letters, digits and a few punctuation marks; anything else
  // goes in single quotes (a ' inside becomes '\'')
  auto quote = [](const std::string& w) {
    const bool plain = !w.empty() && std::all_of(w.begin(), w.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("-_./=:,+@%", c) != nullptr;
    });
    if (plain) return w;
    std::string q = "'";
    for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  std::string cmd;
  bool has_resume = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--stop-at") {  // and its value
      ++i;
      continue;
    }
    if (argv[i].rfind("--stop-at=", 0) == 0) continue;
    has_resume = has_resume || argv[i] == "--resume";
    cmd += (cmd.empty() ? "" : " ") + quote(argv[i]);
  }
  return has_resume ? cmd : cmd + " --resume";
}

std::unique_ptr<optim::Schedule> make_schedule(const RunOptions& o) {
  if (o.schedule == "constant") return std::make_unique<optim::ConstantLR>(o.lr);
  if (o.schedule == "step") return std::make_unique<optim::StepLR>(o.lr, std::max<int64_t>(1, o.steps / 3), 0.1);
  const auto warmup = int64_t(std::llround(o.warmup * double(o.steps)));
  return std::make_unique<optim::WarmupCosineLR>(o.lr, o.min_lr, warmup, o.steps);
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

std::vector<std::string> given_options(const CLI::App& cli) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : cli.get_options())
    if (opt->count() > 0) names.push_back(opt->get_name());
  return names;
}

void check_eval_only_options(const RunOptions& o, const nlohmann::json& saved, const nlohmann::json& given,
                             std::span<const SavedOption> options, const std::string& app) {
  for (const SavedOption& so : options) {
    if (std::find(o.given.begin(), o.given.end(), so.option) == o.given.end()) continue;
    const nlohmann::json::json_pointer key(so.key);
    check(given.contains(key), "check_eval_only_options: {} names no value ({}) of the command line's config",
          so.option, so.key);
    if (!saved.contains(key) || saved.at(key) == given.at(key)) continue;
    const auto shown = [](const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
    throw UsageError(fmt::format(
        "{}: {} {}: --eval-only evaluates the model as '{}' saved it, with {} {}; drop the option, or train a "
        "model with it",
        app, so.option, shown(given.at(key)), o.checkpoint, so.option, shown(saved.at(key))));
  }
}

void print_usage_error(const std::string& app, const std::string& message) {
  const std::string prefix = app + ":";
  const std::string text = message.compare(0, prefix.size(), prefix) == 0 ? message : prefix + " " + message;
  fmt::print(stderr, "{} ({} --help lists every option)\n", text, app);
}

void print_error(const std::string& app, const std::string& message) {
  const std::string prefix = app + ":";
  std::string text = message;
  if (text.compare(0, prefix.size(), prefix) == 0) text.erase(0, text.find_first_not_of(' ', prefix.size()));
  if (g_console_fd < 0) {
    fmt::print(stderr, "{} {}\n", prefix, text);
    return;
  }
  const std::string line = fmt::format("{} rank {} of {}: {}\n", prefix, dist::rank(), dist::world_size(), text);
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(g_console_fd, line.data() + done, line.size() - done);
    if (n <= 0) break;
    done += size_t(n);
  }
}

int error_exit(int code) {
  if (dist::world_size() > 1) dist::abort("", code);  // the message is out already (print_error)
  return code;
}

}  // namespace ag::apps
