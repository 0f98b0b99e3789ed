#include "apps/common/run.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/core.h>

#include "apps/common/threads.h"
#include "autograd/ops.h"
#include "autograd/tape.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/serialize.h"
#include "cuda/memory.h"
#include "training/checkpoint.h"
#include "optim/clip.h"

namespace ag::apps {

namespace fs = std::filesystem;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The cadences left to --steps (their option was 0): ten evaluations, about 200 training lines,
// a checkpoint at every evaluation.
void derive_cadences(RunOptions& o) {
  if (o.eval_every_auto) o.eval_every = std::max<int64_t>(1, o.steps / 10);
  if (o.log_every_auto) o.log_every = std::max<int64_t>(1, o.steps / 200);
  if (o.checkpoint_every_auto) o.checkpoint_every = o.eval_every;
}

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
  cli.add_option("--steps", o.steps, "optimizer steps")->capture_default_str()->check(positive());
  cli.add_option("--batch", o.batch, "batch size (per process: under mpirun -np N the global batch is N x this)")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--lr", o.lr, "peak learning rate (AdamW)")->capture_default_str()->check(positive());
  cli.add_option("--min-lr", o.min_lr, "final learning rate of the cosine schedule")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--warmup", o.warmup, "fraction of the steps with a linear warmup")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cli.add_option("--schedule", o.schedule, "lr schedule: cosine (after warmup), constant, step (x0.1 every third)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cosine", "constant", "step"}));
  cli.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--clip", o.clip, "clip the global gradient norm to this (0: off; the norm is checked either way)")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--dropout", o.dropout, "dropout probability")->capture_default_str()->check(CLI::Range(0.0, 0.99));
  cli.add_option("--seed", o.seed, "seed of initialisation, data order, dropout and sampling")->capture_default_str();
  cli.add_option("--threads", o.threads,
                 "CPU threads (0: the cores other processes leave free, re-measured as the run goes; under mpirun, the "
                 "cores divided among this host's ranks)")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_flag("--deterministic", o.deterministic,
               "the same results bit for bit at any --threads (ag::set_deterministic; costs nothing on the f32 "
               "CPU path)");
  cli.add_flag("--detect-anomaly", o.detect_anomaly,
               "stop at the first op whose output, or the first backward node whose gradient, holds a NaN or an "
               "Inf, naming the op, its shapes and the source line that called it (ag::detect_anomaly; slower: "
               "every value is checked)");
  cli.add_option("--device", o.device, "cpu or cuda[:N] (under mpirun: cuda, each rank on the GPU of its local rank)")
      ->capture_default_str();
  cli.add_option("--precision", o.precision,
                 "fp32, bf16 or fp16: autocast (ag::AutocastGuard) of matmul, linear and attention to 16-bit "
                 "operands summed in f32, weights, gradients and optimizer in f32; fp16 with dynamic loss "
                 "scaling (tensor cores on a GPU; bf16 on a CPU with AVX512-BF16: native products, faster than fp32, "
                 "evaluation and generation reading bf16 copies of the weights; elsewhere emulated: the same "
                 "numbers, slower than fp32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cli.add_option("--out,--checkpoint-dir", o.out_dir,
                 "run directory: checkpoint, metrics, TensorBoard events, plots, report (default runs/<app>)");
  cli.add_flag("--resume", o.resume, "continue from the checkpoint in the run directory");
  cli.add_option("--eval-every", o.eval_every, "steps between evaluations (0: ten per run)")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--log-every", o.log_every,
                 "steps between training log lines (train loss, lr, gradient norm, throughput) in metrics.jsonl, "
                 "TensorBoard and curves.svg (0: about 200 per run)")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (0: at every evaluation)")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--data-dir", o.data_dir, "where the data is")->capture_default_str();
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
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--patience", o.patience,
                 "stop after this many evaluations without a better validation metric; the best model is kept "
                 "in best.safetensors and tested at the end (0: never stop early; -1: 5 for a small training "
                 "set, else 0)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(-1), std::numeric_limits<int64_t>::max()));
  cli.add_option("--max-skips", o.max_skips,
                 "stop (exit 1) after this many steps in a row with a non-finite loss or gradient norm, whose "
                 "updates are skipped (0: never)")
      ->capture_default_str()
      ->check(non_negative());
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

int64_t global_batch(const RunOptions& o) { return int64_t(dist::world_size()) * o.batch; }

std::vector<int64_t> eval_part(int64_t n, int rank, int world) {
  check(world >= 1 && rank >= 0 && rank < world, "eval_part: rank {} of a world of {}", rank, world);
  std::vector<int64_t> items;
  items.reserve(size_t(std::max<int64_t>(0, (n - rank + world - 1) / world)));
  for (int64_t i = rank; i < n; i += world) items.push_back(i);
  return items;
}

void sum_over_ranks(std::vector<double>& values, ConfusionMatrix* cm) {
  if (dist::world_size() == 1) return;
  const size_t k = values.size();
  if (cm) values.insert(values.end(), cm->counts.begin(), cm->counts.end());  // counts < 2^53: exact
  dist::all_reduce_sum(values);
  if (cm)
    for (size_t i = 0; i < cm->counts.size(); ++i) cm->counts[i] = int64_t(values[k + i]);
  values.resize(k);
}

ClassifierEval evaluate_classifier(
    nn::Module& model, int64_t n, int64_t batch, bool sharded, ConfusionMatrix confusion,
    const std::function<std::pair<Tensor, Tensor>(std::span<const int64_t>)>& logits_labels) {
  check(batch >= 1, "evaluation batch must be >= 1, got {}", batch);
  check(n >= 1, "nothing to evaluate: the split is empty");
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  ClassifierEval r;
  r.confusion = std::move(confusion);
  std::vector<double> loss_sum = {0.0};
  const std::vector<int64_t> part = sharded ? eval_part(n, dist::rank(), dist::world_size()) : eval_part(n, 0, 1);
  for (size_t b0 = 0; b0 < part.size(); b0 += size_t(batch)) {
    const std::span<const int64_t> idx(part.data() + b0, std::min(part.size() - b0, size_t(batch)));
    const auto [logits, labels] = logits_labels(idx);
    loss_sum[0] += cross_entropy(logits, labels.to(logits.device()), "sum").item<double>();
    r.confusion->add(labels.to_vector<int64_t>(), argmax(logits, 1).to_vector<int64_t>());
  }
  if (sharded) sum_over_ranks(loss_sum, &*r.confusion);
  model.train(was_training);
  r.samples = n;
  r.loss = loss_sum[0] / double(n);
  r.accuracy = r.confusion->accuracy();
  return r;
}

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

std::unique_ptr<optim::Schedule> make_schedule(const RunOptions& o) {
  if (o.schedule == "constant") return std::make_unique<optim::ConstantLR>(o.lr);
  if (o.schedule == "step") return std::make_unique<optim::StepLR>(o.lr, std::max<int64_t>(1, o.steps / 3), 0.1);
  const auto warmup = int64_t(std::llround(o.warmup * double(o.steps)));
  return std::make_unique<optim::WarmupCosineLR>(o.lr, o.min_lr, warmup, o.steps);
}

bool json_integer_in(const nlohmann::json& v, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned()) return hi >= 0 && v.get<uint64_t>() >= uint64_t(std::max<int64_t>(lo, 0)) &&
                                     v.get<uint64_t>() <= uint64_t(hi);
  return v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
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
  if (o.precision == "fp16") scaler_.emplace();
  for (const char* key : {"config", "steps", "run.loss_sum", "run.loss_count", "run.skipped", "run.skips_in_a_row",
                          "run.loss_scale", "run.loss_scale_tracker", "run.loss_scale_skips", "run.log",
                          "run.best"})
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
    const CheckpointInfo info = read_checkpoint_info(ckpt);
    check(info.config == config_, "{}: --resume: {} was trained with the config\n  {}\nbut this run asks for\n  {}",
          app_, ckpt, info.config.dump(), config_.dump());
    // the schedule is a function of the step and the total: a different --steps would bend it
    check(!info.extra.count("steps") || info.extra.at("steps") == std::to_string(o_.steps),
          "{}: --resume: {} belongs to a run of {} steps (its lr schedule), this run asks for --steps {}", app_,
          ckpt, info.extra.count("steps") ? info.extra.at("steps") : "", o_.steps);
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
  meta["config"] = config_.dump();
  meta["steps"] = std::to_string(o_.steps);
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
