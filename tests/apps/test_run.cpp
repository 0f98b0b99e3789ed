// apps/common/run.h: the options every app shares and the run directory (checkpoint, resume,
// metrics, curves, report).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>

#include "apps/common/run.h"
#include "attograd.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "tests/apps/usage_error.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::apps;
using namespace ag::test;

namespace {

RunOptions parse(std::vector<std::string> args, const std::string& app = "demo") {
  CLI::App cli;
  RunOptions o;
  o.steps = 100;
  add_run_options(cli, o);
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector of arguments last first
  cli.parse(std::move(args));
  apply_run_options(o, app);
  return o;
}

// Steps [from, to) of an AdamW run of a Linear on fixed data through Run; returns the losses.
std::vector<double> train(Run& run, nn::Linear& lin, optim::AdamW& opt, const RunOptions& o, int64_t from,
                          int64_t to) {
  Generator data(9);
  Tensor x = randn({8, 3}, DType::f32, &data), y = randn({8, 2}, DType::f32, &data);
  auto sched = make_schedule(o);
  std::vector<double> losses;
  for (int64_t step = from; step < to; ++step) {
    sched->set_lr(opt, step);
    opt.zero_grad();
    Tensor loss = mse_loss(lin.forward(x), y);
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
    run.step_done(step + 1, losses.back(), 8);
    if (run.eval_due(step + 1)) run.log_eval(step + 1, {{"val_loss", losses.back()}});
    if (run.checkpoint_due(step + 1)) run.save(step + 1);
  }
  return losses;
}

}  // namespace

TEST_CASE("run: options, defaults and refusals") {
  RunOptions o = parse({"--steps", "50", "--lr", "0.01"});
  CHECK(o.steps == 50);
  CHECK(o.out_dir == "runs/demo");
  CHECK(o.eval_every == 5);
  CHECK(o.checkpoint == "runs/demo/checkpoint.safetensors");
  auto sched = make_schedule(o);  // 5% warmup of 50 steps: 3 steps (rounded), then cosine to 0
  CHECK(sched->lr_at(0) == 0.0);
  CHECK(sched->lr_at(3) == doctest::Approx(0.01));
  CHECK(sched->lr_at(50) == doctest::Approx(0.0));
  if (cuda::available())  // the apps train there
    CHECK(parse({"--device", "cuda"}).device == "cuda");
  else  // a build without CUDA, or no GPU visible
    AG_CHECK_ERROR(parse({"--device", "cuda"}), "--device cuda", "use --device cpu");
  AG_CHECK_ERROR(parse({"--device", "tpu"}), "--device", "'tpu'");
  AG_CHECK_ERROR(parse({"--device", "cuda:x"}), "--device", "'cuda:x'");
  AG_CHECK_ERROR(parse({"--min-lr", "1"}), "min-lr", "demo");
  CHECK_THROWS_AS(parse({"--precision", "fp8"}), CLI::ValidationError);
}

TEST_CASE("run: --precision bf16 turns autocast on for the thread that trains, fp32 leaves it off") {
  const AutocastGuard restore(Precision::fp32);  // the test's thread is fp32 again when it ends
  RunOptions o = parse({"--precision", "bf16"});
  CHECK(o.precision == "bf16");
  CHECK(training_precision(o) == Precision::bf16);
  CHECK(autocast_precision() == Precision::bf16);
  CHECK(autocast_operands(DType::f32) == Precision::bf16);
  o = parse({});
  CHECK(training_precision(o) == Precision::fp32);
  CHECK(autocast_precision() == Precision::fp32);
  // a caller that fills RunOptions itself gets the same check as the command line
  o.precision = "fp8";
  AG_CHECK_ERROR(validate_run_options(o, "demo"), "--precision fp8", "fp32, bf16 or fp16");
  o = parse({"--precision", "fp16"});
  CHECK(training_precision(o) == Precision::fp16);
  CHECK(autocast_precision() == Precision::fp16);
  CLI::App cli;
  RunOptions h;
  add_run_options(cli, h);
  CHECK(cli.help().find("fp16 with dynamic loss scaling") != std::string::npos);
}

TEST_CASE("run: json_integer_in accepts integers in range and nothing else") {
  CHECK(json_integer_in(nlohmann::json(5), 1, 5));
  CHECK(json_integer_in(nlohmann::json(-3), -3, 0));
  CHECK(json_integer_in(nlohmann::json(uint64_t(7)), -1, 7));
  CHECK_FALSE(json_integer_in(nlohmann::json(6), 1, 5));
  CHECK_FALSE(json_integer_in(nlohmann::json(0), 1, 5));
  CHECK_FALSE(json_integer_in(nlohmann::json(2.0), 1, 5));  // a float, even a whole one
  CHECK_FALSE(json_integer_in(nlohmann::json(1.2892e22), 1, std::numeric_limits<int64_t>::max()));
  CHECK_FALSE(json_integer_in(nlohmann::json(std::numeric_limits<uint64_t>::max()), 0,
                              std::numeric_limits<int64_t>::max()));
  CHECK_FALSE(json_integer_in(nlohmann::json(uint64_t(1)), -5, -1));
  CHECK_FALSE(json_integer_in(nlohmann::json("3"), 1, 5));
  CHECK_FALSE(json_integer_in(nlohmann::json(true), 0, 1));
}

TEST_CASE("run: eval_part gives each rank a strided part, the parts cover the split once") {
  CHECK(eval_part(7, 0, 1) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6});
  CHECK(eval_part(7, 0, 3) == std::vector<int64_t>{0, 3, 6});
  CHECK(eval_part(7, 1, 3) == std::vector<int64_t>{1, 4});
  CHECK(eval_part(7, 2, 3) == std::vector<int64_t>{2, 5});
  CHECK(eval_part(2, 2, 3).empty());  // more ranks than items: some evaluate nothing
  CHECK(eval_part(0, 0, 1).empty());
  for (int world : {1, 2, 3, 5}) {  // every item exactly once, over all ranks
    std::vector<int> seen(101, 0);
    for (int r = 0; r < world; ++r)
      for (int64_t i : eval_part(101, r, world)) seen[size_t(i)] += 1;
    CHECK(std::count(seen.begin(), seen.end(), 1) == 101);
  }
  AG_CHECK_ERROR(eval_part(5, 2, 2), "eval_part", "rank 2 of a world of 2");
  // in a job of one, the sum over the ranks is the rank's own
  std::vector<double> v = {1.5, 2.0};
  ConfusionMatrix cm(2);
  cm.add(1, 0);
  sum_over_ranks(v, &cm);
  CHECK(v == std::vector<double>{1.5, 2.0});
  CHECK(cm.at(1, 0) == 1);
}

TEST_CASE("run: --detect-anomaly turns anomaly mode on, and an op making a NaN then names itself") {
  const DetectAnomalyGuard restore(false);  // the mode is process-wide: off again when the test ends
  CHECK_FALSE(parse({}).detect_anomaly);
  CHECK_FALSE(anomaly_enabled());
  RunOptions o = parse({"--detect-anomaly"});
  CHECK(o.detect_anomaly);
  CHECK(anomaly_enabled());
  AG_CHECK_ERROR(log(tensor({-1.f})), "anomaly: 'log' produced 1 non-finite value", "test_run.cpp:");
  CLI::App cli;
  RunOptions h;
  add_run_options(cli, h);
  CHECK(cli.help().find("--detect-anomaly") != std::string::npos);
}

TEST_CASE("run: a bad flag or value is a usage error (exit 2, one line), --help exits 0") {
  auto exit_code = [](std::vector<const char*> argv) {
    CLI::App cli{"demo"};
    RunOptions o;
    add_run_options(cli, o);
    return parse_command_line(cli, int(argv.size()), argv.data(), "demo");
  };
  CHECK(exit_code({"demo", "--steps", "5"}) == -1);  // go on
  CHECK(exit_code({"demo", "--bogus"}) == kExitUsage);
  CHECK(exit_code({"demo", "--steps", "-1"}) == kExitUsage);
  CHECK(exit_code({"demo", "--steps", "many"}) == kExitUsage);
  CHECK(exit_code({"demo", "--help"}) == 0);
  CHECK(kExitUsage == 2);
}

TEST_CASE("run: --precision fp16 unscales, an overflow halves the scale without counting as a skip, the scale resumes") {
  const AutocastGuard restore(Precision::fp32);  // parse sets the thread's precision
  TempDir tmp("run_fp16");
  const std::string dir = tmp.dir.string() + "/run";
  const nlohmann::json config = {{"width", 3}};
  const double inf = std::numeric_limits<double>::infinity();
  auto set_grads = [](nn::Linear& lin, double v) {
    for (Tensor p : lin.parameters()) p.set_grad(full(p.shape(), v));
  };
  {
    Generator gen(1);
    nn::Linear lin(3, 2, true, DType::f32, &gen);  // 8 parameters
    optim::AdamW opt(lin.parameters(), {.lr = 0.05});
    RunOptions o = parse({"--precision", "fp16", "--out", dir, "--quiet", "--max-skips", "1", "--clip", "0"});
    Run run("demo", o, lin, opt, gen, config);
    run.resume();
    CHECK(run.loss_scale() == 65536);
    // an overflowing gradient with a finite loss: skipped, the scale halved, and not one of the
    // --max-skips (1 here: a counted skip would have raised)
    set_grads(lin, inf);
    CHECK_FALSE(run.optimizer_step(1, 0.5));
    CHECK(run.loss_scale() == 32768);
    CHECK(run.loss_scale_skips() == 1);
    CHECK(run.skipped_steps() == 0);
    // a finite scaled gradient: divided by the scale before the norm and the step
    set_grads(lin, 32768 * 0.25);
    CHECK(run.optimizer_step(2, 0.5));
    CHECK(run.last_grad_norm() == doctest::Approx(0.25 * std::sqrt(8.0)));
    CHECK(run.loss_scale() == 32768);
    // a non-finite loss is a divergence all the same: counted, and with --max-skips 1 it stops
    // (its gradients are as good as non-finite: the scale is halved too, as PyTorch's would be)
    set_grads(lin, 1.0);
    AG_CHECK_ERROR(run.optimizer_step(3, std::nan("")), "--max-skips 1");
    CHECK(run.loss_scale() == 16384);
    run.save(2);
  }
  Generator gen(2);
  nn::Linear lin(3, 2, true, DType::f32, &gen);
  optim::AdamW opt(lin.parameters(), {.lr = 0.05});
  RunOptions o = parse({"--precision", "fp16", "--out", dir, "--quiet", "--resume"});
  Run run("demo", o, lin, opt, gen, config);
  REQUIRE(run.resume() == 2);
  CHECK(run.loss_scale() == 16384);  // not the initial 65536
  CHECK(run.loss_scale_skips() == 1);
  // an fp32 run ignores the scale entirely
  RunOptions o32 = parse({"--out", dir, "--quiet", "--resume"});
  Generator gen32(2);
  nn::Linear lin32(3, 2, true, DType::f32, &gen32);
  optim::AdamW opt32(lin32.parameters(), {.lr = 0.05});
  Run run32("demo", o32, lin32, opt32, gen32, config);
  run32.resume();
  CHECK(run32.loss_scale() == 1);
}

TEST_CASE("run: checkpoints resume the exact run, metrics and curves continue") {
  TempDir tmp("run");
  const std::string root = tmp.dir.string();
  const std::string dir = root + "/run";
  auto make = [&](int64_t steps, std::vector<std::string> extra_args, const std::string& out = "") {
    std::vector<std::string> args = {"--steps", std::to_string(steps), "--out", out.empty() ? dir : out, "--eval-every", "2", "--quiet"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    return parse(args);
  };
  const nlohmann::json config = {{"width", 3}};
  std::vector<double> straight;
  {  // 6 steps in one go
    Generator gen(1);
    nn::Linear lin(3, 2, true, DType::f32, &gen);
    optim::AdamW opt(lin.parameters(), {.lr = 0.05});
    RunOptions o = make(6, {}, root + "/straight");
    Run run("demo", o, lin, opt, gen, config);
    CHECK(run.resume() == 0);
    straight = train(run, lin, opt, o, 0, 6);
  }
  std::vector<double> resumed;
  {  // 4 of the 6 steps, saved; then another process resumes below
    Generator gen(1);
    nn::Linear lin(3, 2, true, DType::f32, &gen);
    optim::AdamW opt(lin.parameters(), {.lr = 0.05});
    RunOptions o = make(6, {});
    Run run("demo", o, lin, opt, gen, config);
    run.resume();
    resumed = train(run, lin, opt, o, 0, 4);
    run.save(4);
  }
  {
    Generator gen(123);  // different init: the checkpoint must overwrite it
    nn::Linear lin(3, 2, true, DType::f32, &gen);
    optim::AdamW opt(lin.parameters(), {.lr = 0.05});
    RunOptions o = make(6, {"--resume"});
    Run run("demo", o, lin, opt, gen, config);
    REQUIRE(run.resume() == 4);
    auto rest = train(run, lin, opt, o, 4, 6);
    resumed.insert(resumed.end(), rest.begin(), rest.end());
  }
  REQUIRE(resumed.size() == straight.size());
  for (size_t i = 0; i < straight.size(); ++i) CHECK(resumed[i] == straight[i]);  // bitwise
  // metrics.jsonl: evaluations at 2 and 4 (first process), 6 (resumed); a training line at every
  // step (--log-every's default for 6 steps: 1)
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<int64_t> evals, trains;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    (j.contains("skipped_steps") ? evals : trains).push_back(j["step"].get<int64_t>());
  }
  CHECK(evals == std::vector<int64_t>{2, 4, 6});
  CHECK(trains == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  CHECK(std::filesystem::exists(dir + "/curves.svg"));
  const CheckpointInfo info = read_checkpoint_info(dir + "/checkpoint.safetensors");
  CHECK(info.step == 6);
  CHECK(info.config == config);
  {  // resuming with another config is refused, naming both
    Generator gen(1);
    nn::Linear lin(3, 2, true, DType::f32, &gen);
    optim::AdamW opt(lin.parameters(), {.lr = 0.05});
    RunOptions o = make(6, {"--resume"});
    Run run("demo", o, lin, opt, gen, nlohmann::json{{"width", 4}});
    AG_CHECK_ERROR(run.resume(), "--resume", "{\"width\":4}");
  }
  {  // and so is another step total (the schedule would change under the resumed run)
    Generator gen(1);
    nn::Linear lin(3, 2, true, DType::f32, &gen);
    optim::AdamW opt(lin.parameters(), {.lr = 0.05});
    RunOptions o = make(8, {"--resume"});
    Run run("demo", o, lin, opt, gen, config);
    AG_CHECK_ERROR(run.resume(), "a run with --steps 6 ", "this run asks for --steps 8");
  }
  // a checkpoint names its app: another app refuses it naming both, the same app and a caller
  // that names none read it
  CHECK(read_checkpoint_info(dir + "/checkpoint.safetensors").app == "demo");
  CHECK(read_checkpoint_info(dir + "/checkpoint.safetensors", "demo").step == 6);
  check_usage_error([&] { read_checkpoint_info(dir + "/checkpoint.safetensors", "other"); },
                    {"other:", "is a checkpoint of demo, not of other"});
  AG_CHECK_ERROR(read_checkpoint_info(dir + "/nothing.safetensors"), "nothing.safetensors", "does not exist");
}

// ---- training health, --stop-at, rss_mb, option checks --------------------------------------------

namespace {

// A tiny run to poke at: Linear(3 -> 2) with AdamW on fixed data, in its own run directory.
struct TinyRun {
  Generator gen{1};
  nn::Linear lin{3, 2, true, DType::f32, &gen};
  optim::AdamW opt{lin.parameters(), {.lr = 0.05}};
  Tensor x, y;
  RunOptions o;
  std::unique_ptr<Run> run;
  int64_t first_step = 0;  // what resume() returned
  TinyRun(const std::string& dir, std::vector<std::string> args = {}) {
    Generator data(9);
    x = randn({8, 3}, DType::f32, &data), y = randn({8, 2}, DType::f32, &data);
    std::vector<std::string> all = {"--out", dir, "--quiet"};
    for (const char* flag : {"--steps", "--eval-every"})  // defaults 6 and 2, unless `args` has the flag
      if (std::find(args.begin(), args.end(), flag) == args.end()) all.insert(all.end(), {flag, flag[2] == 's' ? "6" : "2"});
    all.insert(all.end(), args.begin(), args.end());
    o = parse(all);
    run = std::make_unique<Run>("demo", o, lin, opt, gen, nlohmann::json{{"width", 3}});
    first_step = run->resume();
  }
  // forward + backward: the loss (gradients in place, no update yet)
  double backward() {
    opt.zero_grad();
    Tensor loss = mse_loss(lin.forward(x), y);
    loss.backward();
    return loss.item<double>();
  }
  std::vector<std::vector<float>> params() const {
    return {lin.weight.to_vector<float>(), lin.bias.to_vector<float>()};
  }
  std::vector<std::vector<double>> optimizer_state() const {  // moments and step counts, as doubles
    std::vector<std::vector<double>> out;
    for (const auto& [name, t] : opt.state_dict()) out.push_back(t.to(DType::f64).to_vector<double>());
    return out;
  }
};

// The lines of <dir>/metrics.jsonl of one kind: "train" (step_done's, every --log-every steps) or
// "eval" (log_eval's); "" for all of them.
std::vector<nlohmann::json> metrics_lines(const std::string& dir, const std::string& kind = "") {
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    const bool train = j.contains("lr"), eval = j.contains("skipped_steps");
    REQUIRE(train != eval);  // every line is one of the two kinds
    if (kind.empty() || (kind == "train") == train) lines.push_back(std::move(j));
  }
  return lines;
}

}  // namespace

TEST_CASE("run: a NaN loss or an infinite gradient norm skips the update and is counted") {
  TempDir tmp("run_skip");
  TinyRun t(tmp.file("r"), {"--log-every", "4"});
  const double loss1 = t.backward();
  CHECK(t.run->optimizer_step(1, loss1));  // a healthy step updates
  t.run->step_done(1, loss1, 8);
  const auto params = t.params();
  const auto state = t.optimizer_state();

  // step 2: the loss is NaN (as if the forward had overflowed): no update at all
  t.backward();
  CHECK_FALSE(t.run->optimizer_step(2, std::nan("")));
  t.run->step_done(2, std::nan(""), 8);
  CHECK(t.params() == params);           // bitwise: the parameters did not move
  CHECK(t.optimizer_state() == state);   // nor the moments, nor the per-parameter step counts
  CHECK_FALSE(t.lin.weight.grad().defined());  // the gradients were dropped
  CHECK(t.run->skipped_steps() == 1);

  // step 3: a finite loss but an infinite gradient
  const double loss3 = t.backward();
  t.lin.weight.grad().data<float>()[4] = std::numeric_limits<float>::infinity();
  CHECK_FALSE(t.run->optimizer_step(3, loss3));
  CHECK(std::isinf(t.run->last_grad_norm()));
  t.run->step_done(3, loss3, 8);
  CHECK(t.params() == params);
  CHECK(t.optimizer_state() == state);
  CHECK(t.run->skipped_steps() == 2);

  // step 4 is healthy again: it updates, from the state of step 1
  const double loss4 = t.backward();
  CHECK(t.run->optimizer_step(4, loss4));
  t.run->step_done(4, loss4, 8);
  CHECK(t.params() != params);
  t.run->log_eval(4, {});
  // metrics.jsonl: the mean training loss over the finite steps 1, 3, 4 (the training line of
  // step 4), and the skips so far (the evaluation line)
  const auto train = metrics_lines(tmp.file("r"), "train"), eval = metrics_lines(tmp.file("r"), "eval");
  REQUIRE(train.size() == 1);
  REQUIRE(eval.size() == 1);
  CHECK(train[0]["step"] == 4);
  CHECK(train[0]["train_loss"].get<double>() == doctest::Approx((loss1 + loss3 + loss4) / 3));
  CHECK(eval[0]["skipped_steps"] == 2);
  RunReport report;
  t.run->finish(report);
  CHECK(report.skipped_steps == 2);
  CHECK(nlohmann::json::parse(read_bytes(tmp.file("r/report.json")))["skipped_steps"] == 2);
}

TEST_CASE("run: --clip 0 still measures the gradient norm, and leaves the gradients as they are") {
  TempDir tmp("run_clip0");
  TinyRun t(tmp.file("r"), {"--clip", "0"});
  const double loss = t.backward();
  // the norm by hand: sqrt of the sum of every squared gradient element
  double sq = 0;
  for (const Tensor& p : t.lin.parameters())
    for (float g : p.grad().to_vector<float>()) sq += double(g) * g;
  const std::vector<float> before = t.lin.weight.grad().to_vector<float>();
  Tensor g = t.lin.weight.grad();  // the optimizer step reads this same tensor
  REQUIRE(std::sqrt(sq) > 0);
  CHECK(t.run->optimizer_step(1, loss));
  CHECK(t.run->last_grad_norm() == doctest::Approx(std::sqrt(sq)).epsilon(1e-6));
  CHECK(g.to_vector<float>() == before);  // not scaled
  TinyRun c(tmp.file("c"), {"--clip", "1e-3"});  // a clip below the norm scales the gradients down
  const double loss_c = c.backward();
  Tensor gc = c.lin.weight.grad();
  const std::vector<float> before_c = gc.to_vector<float>();
  CHECK(c.run->optimizer_step(1, loss_c));
  CHECK(std::abs(gc.to_vector<float>()[0]) < std::abs(before_c[0]));
}

TEST_CASE("run: --max-skips stops after that many non-finite steps in a row, a good step resets the count") {
  TempDir tmp("run_maxskips");
  TinyRun t(tmp.file("r"), {"--max-skips", "3"});
  auto nan_step = [&](int64_t step) {
    t.backward();
    return t.run->optimizer_step(step, std::nan(""));
  };
  CHECK_FALSE(nan_step(1));
  CHECK_FALSE(nan_step(2));
  CHECK(t.run->optimizer_step(3, t.backward()));  // finite: the run of skips is broken
  CHECK_FALSE(nan_step(4));
  CHECK_FALSE(nan_step(5));
  AG_CHECK_ERROR(nan_step(6), "step 6", "3 steps in a row", "--max-skips 3", "--lr");
  CHECK(t.run->skipped_steps() == 5);

  TinyRun never(tmp.file("n"), {"--max-skips", "0"});  // 0: never stop
  for (int64_t s = 1; s <= 12; ++s) {
    never.backward();
    CHECK_FALSE(never.run->optimizer_step(s, std::nan("")));
  }
}

TEST_CASE("run: save refuses a non-finite model and keeps the previous checkpoint") {
  TempDir tmp("run_save_nonfinite");
  TinyRun t(tmp.file("r"));
  CHECK(t.run->optimizer_step(1, t.backward()));
  REQUIRE(t.run->save(1));
  const std::string ckpt = tmp.file("r/checkpoint.safetensors");
  const std::string good = read_bytes(ckpt);

  const float w0 = t.lin.weight.data<float>()[0];
  t.lin.weight.data<float>()[0] = std::nanf("");  // a parameter went NaN
  CHECK_FALSE(t.run->save(2));
  CHECK(read_bytes(ckpt) == good);  // the step-1 file, byte for byte
  CHECK(read_checkpoint_info(ckpt).step == 1);
  t.lin.weight.data<float>()[0] = w0;

  for (const auto& [name, s] : t.opt.state_dict())  // an optimizer moment went infinite
    if (name.find("exp_avg_sq") != std::string::npos) {
      s.data<float>()[0] = std::numeric_limits<float>::infinity();
      break;
    }
  CHECK_FALSE(t.run->save(3));
  CHECK(read_bytes(ckpt) == good);
}

TEST_CASE("run: a training line every --log-every steps, about 200 per run by default, with the means of its interval") {
  TempDir tmp("run_log_every");
  TinyRun t(tmp.file("r"), {"--steps", "400", "--eval-every", "100"});
  REQUIRE(t.o.log_every == 2);  // 400 / 200
  std::vector<double> losses, norms, lrs;
  for (int64_t step = 0; step < t.o.steps; ++step) {
    make_schedule(t.o)->set_lr(t.opt, step);
    const double loss = t.backward();
    REQUIRE(t.run->optimizer_step(step + 1, loss));
    losses.push_back(loss), norms.push_back(t.run->last_grad_norm()), lrs.push_back(t.opt.lr());
    t.run->step_done(step + 1, loss, 8, 24);
    if (t.run->eval_due(step + 1)) t.run->log_eval(step + 1, {{"val_loss", 0.5}});
  }
  const auto train = metrics_lines(tmp.file("r"), "train"), eval = metrics_lines(tmp.file("r"), "eval");
  REQUIRE(train.size() == 200);
  REQUIRE(eval.size() == 4);
  for (size_t i = 0; i < train.size(); ++i) {
    INFO("training line " << i);
    const nlohmann::json& j = train[i];
    CHECK(j["step"] == int64_t(2 * i + 2));
    // the means of the two steps of the interval, as the hand computes them
    CHECK(j["train_loss"].get<double>() == doctest::Approx((losses[2 * i] + losses[2 * i + 1]) / 2).epsilon(1e-12));
    CHECK(j["grad_norm"].get<double>() == doctest::Approx((norms[2 * i] + norms[2 * i + 1]) / 2).epsilon(1e-12));
    CHECK(j["lr"].get<double>() == lrs[2 * i + 1]);  // the lr of the interval's last step
    CHECK(j["samples_per_s"].get<double>() > 0);
    CHECK(j["tokens_per_s"].get<double>() == doctest::Approx(3 * j["samples_per_s"].get<double>()));
    CHECK_FALSE(j.contains("val_loss"));
  }
  CHECK(eval[0]["val_loss"] == 0.5);
  CHECK_FALSE(eval[0].contains("train_loss"));
  // curves.svg: a chart for the loss (train and val), the lr, the gradient norm and the throughput
  const std::string svg = read_bytes(tmp.file("r/curves.svg"));
  for (const char* title : {">loss<", ">lr<", ">grad_norm<", ">samples_per_s<", ">tokens_per_s<"})
    CHECK_MESSAGE(svg.find(title) != std::string::npos, title);
  // TensorBoard holds the same 200 training points
  const std::string events = [&] {
    for (const auto& e : std::filesystem::directory_iterator(tmp.file("r")))
      if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) return e.path().string();
    return std::string();
  }();
  int64_t grad_norms = 0;
  for (const TfScalar& sc : read_tfevents(events).scalars) grad_norms += sc.tag == "grad_norm";
  CHECK(grad_norms == 200);
}

TEST_CASE("run: the best model by validation goes to best.safetensors, --patience stops early, load_best restores it") {
  TempDir tmp("run_best");
  TinyRun t(tmp.file("r"), {"--steps", "20", "--eval-every", "2", "--patience", "2"});
  t.run->select_by("val_accuracy", true, "val_loss");
  // (accuracy, loss) at steps 2, 4, 6, 8: 4 is better than 2 by the tie-breaker, 6 worse, 8 ties
  // 4's accuracy with a higher loss: 2 evaluations without a better one
  const std::vector<std::pair<double, double>> evals = {{0.5, 1.0}, {0.5, 0.9}, {0.4, 0.8}, {0.5, 0.95}};
  std::vector<std::vector<float>> params_at_4;
  int64_t step = 0;
  for (; step < t.o.steps && !t.run->stop_requested(); ++step) {
    const double loss = t.backward();
    REQUIRE(t.run->optimizer_step(step + 1, loss));
    t.run->step_done(step + 1, loss, 8);
    if (t.run->eval_due(step + 1)) {
      const auto [acc, vloss] = evals.at(size_t(step / 2));
      t.run->log_eval(step + 1, {{"val_loss", vloss}, {"val_accuracy", acc}});
      if (step + 1 == 4) params_at_4 = t.params();
    }
    if (t.run->checkpoint_due(step + 1)) t.run->save(step + 1);
  }
  CHECK(step == 8);  // stopped after the evaluation of step 8
  CHECK(t.run->early_stopped());
  CHECK(t.run->best().step == 4);
  CHECK(t.run->best().value == 0.5);
  CHECK(t.run->best().tie == 0.9);
  CHECK(t.run->best().evals_since == 2);
  CHECK(read_checkpoint_info(tmp.file("r/best.safetensors")).step == 4);
  t.run->save(step);
  CHECK(t.params() != params_at_4);
  CHECK(t.run->load_best() == 4);
  CHECK(t.params() == params_at_4);  // bitwise: the weights of step 4
  RunReport report;
  t.run->finish(report);
  CHECK_FALSE(report.interrupted);  // an early stop is an end, not an interruption
  CHECK(report.early_stopped);
  CHECK(report.best_step == 4);
  const auto j = nlohmann::json::parse(read_bytes(tmp.file("r/report.json")));
  CHECK(j.at("best_step") == 4);
  CHECK(j.at("early_stopped") == true);

  // the selection state travels in the checkpoint: a resumed run knows step 4 was the best
  TinyRun again(tmp.file("r"), {"--steps", "20", "--eval-every", "2", "--patience", "3", "--resume"});
  again.run->select_by("val_accuracy", true, "val_loss");
  CHECK(again.first_step == 8);
  CHECK(again.run->best().step == 4);
  CHECK(again.run->best().evals_since == 2);
  CHECK_FALSE(again.run->early_stopped());
  // without a metric (or with --patience 0) nothing is selected and nothing stops
  TinyRun plain(tmp.file("p"), {"--patience", "0"});
  plain.run->select_by("val_accuracy", true);
  for (int64_t s = 1; s <= 6; ++s) {
    plain.run->optimizer_step(s, plain.backward());
    plain.run->step_done(s, 1.0, 8);
    if (plain.run->eval_due(s)) plain.run->log_eval(s, {{"val_accuracy", 1.0 / double(s)}});  // only worse
  }
  CHECK_FALSE(plain.run->stop_requested());
  CHECK(plain.run->best().step == 2);
  CHECK(plain.run->best().evals_since == 2);
}

TEST_CASE("run: --patience -1 is decided by the data size, and said") {
  RunOptions o;
  o.patience = -1;
  CHECK(resolve_patience(o, true, "800 texts").find("--patience 5: 800 texts") == 0);
  CHECK(o.patience == 5);
  o.patience = -1;
  CHECK(resolve_patience(o, false, "60000 images").find("--patience 0: 60000 images") == 0);
  CHECK(o.patience == 0);
  o.patience = 3;  // given: it stands, and nothing is said
  CHECK(resolve_patience(o, true, "800 texts").empty());
  CHECK(o.patience == 3);
  // set_steps derives the cadences that were derived from --steps again, and keeps given ones
  RunOptions d = parse({"--steps", "1000"});
  set_steps(d, 400);
  CHECK(d.eval_every == 40);
  CHECK(d.log_every == 2);
  CHECK(d.checkpoint_every == 40);
  RunOptions g = parse({"--steps", "1000", "--eval-every", "7"});
  set_steps(g, 400);
  CHECK(g.eval_every == 7);
  CHECK(g.checkpoint_every == 7);
  CHECK(g.log_every == 2);
}

TEST_CASE("run: all_finite and current_rss_bytes") {
  CHECK(all_finite({tensor({1.f, -2.f}), tensor<double>({3.0, 1e300}), Tensor()}));
  CHECK_FALSE(all_finite({tensor({1.f, std::numeric_limits<float>::infinity()})}));
  CHECK_FALSE(all_finite({tensor({1.f}), tensor<double>({std::nan(""), 0.0})}));
  const Tensor strided = tensor({1.f, std::nanf(""), 3.f, 4.f});  // views: only their own elements count
  CHECK(all_finite({strided.slice(0, 0, 4, 2)}));
  CHECK_FALSE(all_finite({strided.slice(0, 1, 4, 2)}));
  const int64_t rss = current_rss_bytes();
  CHECK(rss > (int64_t(1) << 20));         // this binary holds more than 1 MiB
  // current <= peak, give or take: the kernel folds its per-thread RSS counters into ru_maxrss
  // lazily, so the peak can trail the current figure by a few hundred KiB
  CHECK(rss <= peak_rss_bytes() + (int64_t(4) << 20));
}

TEST_CASE("run: --stop-at stops after that step as Ctrl-C would, the resumed run logs what a straight one did") {
  TempDir tmp("run_stop_at");
  auto losses_and_metrics = [&](const std::string& name, std::vector<std::string> args, int64_t from) {
    TinyRun t(tmp.file(name), args);
    REQUIRE(t.first_step == from);
    int64_t step = from;
    for (; step < t.o.steps && !t.run->stop_requested(); ++step) {
      make_schedule(t.o)->set_lr(t.opt, step);
      const double loss = t.backward();
      t.run->optimizer_step(step + 1, loss);
      t.run->step_done(step + 1, loss, 8);
      if (t.run->eval_due(step + 1)) t.run->log_eval(step + 1, {});
      if (t.run->checkpoint_due(step + 1)) t.run->save(step + 1);
    }
    t.run->save(step);
    RunReport report;
    t.run->finish(report);
    return std::make_pair(step, report.interrupted);
  };
  CHECK(losses_and_metrics("straight", {"--log-every", "2"}, 0) == std::make_pair(int64_t(6), false));
  CHECK(losses_and_metrics("to_the_end", {"--log-every", "2", "--stop-at", "6"}, 0) ==
        std::make_pair(int64_t(6), false));  // = --steps
  // stop after step 3, between the training lines of steps 2 and 4: the half-averaged training
  // loss and gradient norm of step 3 travel in the checkpoint
  CHECK(losses_and_metrics("split", {"--log-every", "2", "--stop-at", "3"}, 0) == std::make_pair(int64_t(3), true));
  CHECK(read_checkpoint_info(tmp.file("split/checkpoint.safetensors")).step == 3);
  CHECK(losses_and_metrics("split", {"--log-every", "2", "--resume"}, 3) == std::make_pair(int64_t(6), false));
  const auto a = metrics_lines(tmp.file("straight"), "train"), b = metrics_lines(tmp.file("split"), "train");
  REQUIRE(a.size() == 3);
  REQUIRE(b.size() == 3);
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i]["step"] == b[i]["step"]);
    CHECK(a[i]["train_loss"].get<double>() == b[i]["train_loss"].get<double>());  // bitwise
    CHECK(a[i]["grad_norm"].get<double>() == b[i]["grad_norm"].get<double>());
    CHECK(a[i]["lr"].get<double>() == b[i]["lr"].get<double>());
  }
  const auto ea = metrics_lines(tmp.file("straight"), "eval"), eb = metrics_lines(tmp.file("split"), "eval");
  REQUIRE(ea.size() == 3);
  REQUIRE(eb.size() == 3);
  for (size_t i = 0; i < ea.size(); ++i) {
    CHECK(ea[i]["step"] == eb[i]["step"]);
    CHECK(eb[i]["rss_mb"].get<double>() > 1.0);  // every evaluation line has the resident memory
    CHECK(eb[i]["skipped_steps"] == 0);
  }
  CHECK(read_bytes(tmp.file("straight/checkpoint.safetensors")).size() > 0);
}

TEST_CASE("run: the resume command is the command line without --stop-at, plus --resume") {
  CHECK(resume_command({"build/vit", "--steps", "6", "--stop-at", "3", "--out", "runs/a"}) ==
        "build/vit --steps 6 --out runs/a --resume");
  CHECK(resume_command({"build/gpt", "--stop-at=3", "--prompt", "And God said", "--resume"}) ==
        "build/gpt --prompt 'And God said' --resume");  // quoted for the shell; --resume once
  CHECK(resume_command({"textclf", "--tsv-file", "it's.tsv"}) == "textclf --tsv-file 'it'\\''s.tsv' --resume");
}

TEST_CASE("run: option values out of range are usage errors naming the option and value") {
  // through CLI11 (what a user types) and through validate_run_options (RunOptions filled by code)
  auto cli_code = [](std::vector<const char*> argv) {
    CLI::App cli{"demo"};
    RunOptions o;
    add_run_options(cli, o);
    return parse_command_line(cli, int(argv.size()), argv.data(), "demo");
  };
  for (const char* flag : {"--eval-every", "--log-every", "--checkpoint-every", "--stop-at", "--max-skips", "--threads", "--clip",
                           "--weight-decay", "--min-lr"})
    CHECK_MESSAGE(cli_code({"demo", flag, "-1"}) == kExitUsage, flag);
  CHECK(cli_code({"demo", "--batch", "0"}) == kExitUsage);
  auto check_one = [](RunOptions o, const char* what, const char* value) {
    try {
      validate_run_options(o, "demo");
      FAIL("no UsageError for " << what);
    } catch (const UsageError& e) {
      const std::string m = e.what();
      CHECK_MESSAGE(m.find(what) != std::string::npos, m);
      CHECK_MESSAGE(m.find(value) != std::string::npos, m);
      CHECK_MESSAGE(m.find('\n') == std::string::npos, m);  // one line
    }
  };
  RunOptions ok;
  ok.steps = 10;
  CHECK_NOTHROW(validate_run_options(ok, "demo"));
  RunOptions o = ok;
  o.stop_at = 11;
  check_one(o, "--stop-at", "11");
  o = ok, o.stop_at = -1;
  check_one(o, "--stop-at", "-1");
  o = ok, o.eval_every = -2;
  check_one(o, "--eval-every", "-2");
  o = ok, o.log_every = -5;
  check_one(o, "--log-every", "-5");
  o = ok, o.checkpoint_every = -3;
  check_one(o, "--checkpoint-every", "-3");
  o = ok, o.max_skips = -1;
  check_one(o, "--max-skips", "-1");
  o = ok, o.threads = -4;
  check_one(o, "--threads", "-4");
  o = ok, o.threads = 100000;  // an OpenMP team that large crashed or hung at start-up
  check_one(o, "--threads", "100000");
  o = ok, o.threads = max_threads();
  CHECK_NOTHROW(validate_run_options(o, "demo"));
  o = ok, o.threads = max_threads() + 1;
  check_one(o, "--threads", std::to_string(max_threads() + 1).c_str());
  o = ok, o.steps = 0;
  check_one(o, "--steps", "0");
  o = ok, o.batch = 0;
  check_one(o, "--batch", "0");
  o = ok, o.lr = 0;
  check_one(o, "--lr", "0");
  o = ok, o.warmup = 1.5;
  check_one(o, "--warmup", "1.5");
  o = ok, o.dropout = 1;
  check_one(o, "--dropout", "1");
  o = ok, o.clip = -1;
  check_one(o, "--clip", "-1");
  o = ok, o.device = "cuda:9";  // no machine here has ten GPUs
  check_one(o, "--device cuda:9", "cpu");
}
