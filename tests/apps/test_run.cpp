// apps/common/run.h: the options every app shares and the run directory (checkpoint, resume,
// metrics, curves, report).
#include <filesystem>
#include <fstream>

#include "apps/common/run.h"
#include "attograd.h"
#include "nn/linear.h"
#include "optim/adam.h"
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
  AG_CHECK_ERROR(parse({"--device", "cuda"}), "--device cuda", "use --device cpu");
  AG_CHECK_ERROR(parse({"--device", "tpu"}), "--device", "'tpu'");
  AG_CHECK_ERROR(parse({"--min-lr", "1"}), "min-lr", "demo");
  CHECK_THROWS_AS(parse({"--precision", "fp8"}), CLI::ValidationError);
  AG_CHECK_ERROR(parse({"--precision", "bf16"}), "--precision bf16", "CUDA");
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
  // metrics.jsonl: evaluations at 2 and 4 (first process), 6 (resumed)
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) steps.push_back(nlohmann::json::parse(line)["step"].get<int64_t>());
  CHECK(steps == std::vector<int64_t>{2, 4, 6});
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
    AG_CHECK_ERROR(run.resume(), "a run of 6 steps", "--steps 8");
  }
  AG_CHECK_ERROR(read_checkpoint_info(dir + "/nothing.safetensors"), "nothing.safetensors", "does not exist");
}
