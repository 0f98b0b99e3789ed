// Training checkpoints (training/checkpoint.h): a resumed run is bit for bit the run that never stopped;
// the file is a plain safetensors file with the documented names; a failed or interrupted save
// leaves the previous checkpoint loadable; every bad file is an ag::Error naming it.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/serialize.h"
#include "nn/activation.h"
#include "training/checkpoint.h"
#include "nn/dropout.h"
#include "nn/linear.h"
#include "nn/sequential.h"
#include "optim/adam.h"
#include "optim/schedule.h"
#include "optim/sgd.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::training;
using namespace ag::test;
namespace fs = std::filesystem;

namespace {


// One training run: Linear(4,8) - GELU - Dropout(0.25) - Linear(8,3), AdamW, warmup + cosine over
// 8 steps, MSE on a fixed batch. `init_seed` draws the weights, `drop_seed` the dropout masks.
// Not movable: the Dropout layer points at `drop_gen`.
struct Run {
  Generator init_gen, drop_gen;
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::AdamW> opt;
  optim::WarmupCosineLR sched{1e-2, 1e-3, 2, 8};

  Run(uint64_t init_seed, uint64_t drop_seed) : init_gen(init_seed), drop_gen(drop_seed) {
    model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
        std::make_shared<nn::Linear>(4, 8, true, DType::f32, &init_gen), std::make_shared<nn::GELU>(),
        std::make_shared<nn::Dropout>(0.25, &drop_gen), std::make_shared<nn::Linear>(8, 3, true, DType::f32, &init_gen)});
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamW::Options{.lr = 1e-2, .weight_decay = 0.1});
  }
  Run(const Run&) = delete;

  // One update at schedule position `step`; returns the loss before it.
  float step(int64_t step) {
    Generator data(123);  // the same batch at every step
    Tensor x = randn({5, 4}, DType::f32, &data), y = randn({5, 3}, DType::f32, &data);
    sched.set_lr(*opt, step);
    opt->zero_grad();
    Tensor loss = mse_loss(model->forward(x), y);
    loss.backward();
    opt->step();
    return loss.item<float>();
  }
};

std::vector<std::vector<float>> values(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& [n, t] : m.state_dict()) out.push_back(t.to_vector<float>());
  return out;
}

}  // namespace

TEST_CASE("checkpoint: a resumed run equals the uninterrupted one bit for bit") {
  TempDir tmp("resume");
  const std::string path = tmp.file("ckpt.safetensors");
  constexpr int64_t N = 8, k = 3;

  Run straight(1, 7);
  std::vector<float> losses_straight;
  for (int64_t s = 0; s < N; ++s) losses_straight.push_back(straight.step(s));

  std::vector<float> losses_resumed;
  {
    Run first(1, 7);
    for (int64_t s = 0; s < k; ++s) losses_resumed.push_back(first.step(s));
    save_checkpoint(path, *first.model, *first.opt, k, first.drop_gen, {{"data.position", "15"}});
  }
  // A fresh run with other weights, other dropout seed and optimizer state of its own: the load
  // must overwrite all of it.
  Run second(2, 99);
  second.step(5);
  CHECK(values(*second.model) != values(*straight.model));
  training::Checkpoint c = load_checkpoint(path, *second.model, second.opt.get(), &second.drop_gen);
  CHECK(c.step == k);
  CHECK(c.extra == std::map<std::string, std::string>{{"data.position", "15"}});
  for (int64_t s = c.step; s < N; ++s) losses_resumed.push_back(second.step(s));

  CHECK(losses_resumed == losses_straight);  // exact, not close
  CHECK(values(*second.model) == values(*straight.model));
  CHECK(second.drop_gen.seed() == straight.drop_gen.seed());
  CHECK(second.drop_gen.offset() == straight.drop_gen.offset());
  auto opt_a = second.opt->state_dict(), opt_b = straight.opt->state_dict();
  REQUIRE(opt_a.size() == opt_b.size());
  for (size_t i = 0; i < opt_a.size(); ++i) {
    CHECK(opt_a[i].first == opt_b[i].first);
    CHECK(opt_a[i].second.to_vector<double>() == opt_b[i].second.to_vector<double>());
  }

  // The test can fail: without the generator restored the dropout masks, hence the losses, differ.
  Run third(2, 99);
  load_checkpoint(path, *third.model, third.opt.get(), nullptr);
  std::vector<float> losses_no_rng(losses_straight.begin(), losses_straight.begin() + k);
  for (int64_t s = k; s < N; ++s) losses_no_rng.push_back(third.step(s));
  CHECK(losses_no_rng != losses_straight);
}

TEST_CASE("checkpoint: the file is plain safetensors with model.*, optim.* and the metadata") {
  TempDir tmp("layout");
  const std::string path = tmp.file("ckpt.safetensors");
  Run run(1, 7);
  run.step(0);
  run.step(1);
  save_checkpoint(path, *run.model, *run.opt, 2, run.drop_gen, {{"note", "hello"}});

  std::map<std::string, std::string> meta;
  auto ts = load_safetensors(path, &meta);
  CHECK(meta == std::map<std::string, std::string>{{"format", "attograd-checkpoint-1"},
                                                   {"step", "2"},
                                                   {"rng.seed", "7"},
                                                   {"rng.offset", std::to_string(run.drop_gen.offset())},
                                                   {"extra.note", "hello"}});
  CHECK(run.drop_gen.offset() > 0);  // the dropout did draw

  // the model's state_dict, then the optimizer's, in order, each under its prefix, same values
  std::vector<std::pair<std::string, Tensor>> expected;
  for (auto& [n, t] : run.model->state_dict()) expected.emplace_back("model." + n, t);
  for (auto& [n, t] : run.opt->state_dict()) expected.emplace_back("optim." + n, t);
  REQUIRE(ts.size() == expected.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    CHECK(ts[i].first == expected[i].first);
    CHECK(ts[i].second.dtype() == expected[i].second.dtype());
    CHECK(ts[i].second.shape() == expected[i].second.shape());
    CHECK(ts[i].second.to_vector<double>() == expected[i].second.to_vector<double>());
  }
  auto by_name = load_safetensors_map(path);
  for (const char* name : {"model.0.weight", "model.0.bias", "model.3.weight", "model.3.bias", "optim.state.0.step",
                           "optim.state.0.exp_avg", "optim.state.3.exp_avg_sq", "optim.param_groups.0.lr"}) {
    INFO(name);
    CHECK(by_name.count(name) == 1);
  }
  CHECK(by_name.at("optim.state.2.step").item<int64_t>() == 2);
  // the lr saved is the one the schedule set for step 1: 1e-2 * 1 / 2
  CHECK(by_name.at("optim.param_groups.0.lr").item<double>() == 5e-3);
}

TEST_CASE("checkpoint: a failed or interrupted save leaves the previous checkpoint loadable") {
  TempDir tmp("crash");
  const std::string path = tmp.file("ckpt.safetensors");
  Run run(1, 7);
  run.step(0);
  save_checkpoint(path, *run.model, *run.opt, 1, run.drop_gen);
  const auto saved = values(*run.model);
  const std::string old_bytes = read_bytes(path);
  run.step(1);

  // the save fails before writing anything: a folder sits at the temporary's name
  const std::string temp_name = path + ".tmp." + std::to_string(::getpid());
  fs::create_directory(temp_name);
  AG_CHECK_ERROR(save_checkpoint(path, *run.model, *run.opt, 2, run.drop_gen), "save_safetensors", path.c_str());
  fs::remove(temp_name);
  CHECK(read_bytes(path) == old_bytes);

  // a process killed mid-write leaves a half-written temporary beside the checkpoint
  const std::string other = tmp.file("other.safetensors");
  save_checkpoint(other, *run.model, *run.opt, 2, run.drop_gen);
  const std::string new_bytes = read_bytes(other);
  write_bytes(path + ".tmp.999999", new_bytes.substr(0, new_bytes.size() / 2));

  Run fresh(2, 99);
  training::Checkpoint c = load_checkpoint(path, *fresh.model, fresh.opt.get(), &fresh.drop_gen);
  CHECK(c.step == 1);
  CHECK(values(*fresh.model) == saved);
  CHECK(values(*fresh.model) != values(*run.model));  // the step-2 weights were not saved there
}

TEST_CASE("checkpoint: corrupt, truncated and foreign files are errors naming the file") {
  TempDir tmp("corrupt");
  const std::string good_path = tmp.file("good.safetensors");
  Run run(1, 7);
  run.step(0);
  save_checkpoint(good_path, *run.model, *run.opt, 1, run.drop_gen);
  const std::string good = read_bytes(good_path);
  const auto saved = values(*run.model);

  Run fresh(2, 99);
  const auto fresh_values = values(*fresh.model);
  const std::string path = tmp.file("bad.safetensors");
  auto load = [&] { return load_checkpoint(path, *fresh.model, fresh.opt.get(), &fresh.drop_gen); };

  AG_CHECK_ERROR(load(), "load_checkpoint", path.c_str(), "cannot open");
  for (size_t cut : {size_t(3), size_t(100), good.size() / 2, good.size() - 1}) {
    INFO("cut to " << cut << " of " << good.size() << " bytes");
    write_bytes(path, good.substr(0, cut));
    AG_CHECK_ERROR(load(), "load_checkpoint", path.c_str());
  }
  write_bytes(path, std::string(good.size(), 'x'));
  AG_CHECK_ERROR(load(), "load_checkpoint", path.c_str());

  // a valid safetensors file, but not a checkpoint, or with bad metadata
  auto tensors = load_safetensors(good_path);
  std::map<std::string, std::string> meta{
      {"format", "attograd-checkpoint-1"}, {"step", "1"}, {"rng.seed", "7"}, {"rng.offset", "4"}};
  auto with = [&](const std::string& key, const std::string* value) {
    auto m = meta;
    if (value)
      m[key] = *value;
    else
      m.erase(key);
    save_safetensors(path, tensors, m);
  };
  save_safetensors(path, tensors);
  AG_CHECK_ERROR(load(), "load_checkpoint", path.c_str(), "not an attograd checkpoint", "no 'format'");
  const std::string other_format = "pytorch", bad_numbers[] = {"", "12a", "-1", " 3", "1.5", "99999999999999999999"};
  with("format", &other_format);
  AG_CHECK_ERROR(load(), "load_checkpoint", path.c_str(), "not an attograd checkpoint", "'pytorch'");
  for (const char* key : {"step", "rng.seed", "rng.offset"}) {
    INFO(key);
    with(key, nullptr);
    AG_CHECK_ERROR(load(), "load_checkpoint", path.c_str(), key, "is missing");
    for (const auto& bad : bad_numbers) {
      INFO("value '" << bad << "'");
      with(key, &bad);
      AG_CHECK_ERROR(load(), "load_checkpoint", path.c_str(), key, "whole number");
    }
  }
  const std::string too_big = "9223372036854775808";  // 2^63: no int64_t step
  with("step", &too_big);
  AG_CHECK_ERROR(load(), "load_checkpoint", path.c_str(), "step", "whole number");

  auto stray = tensors;
  stray.emplace_back("ema.0.weight", tensors[0].second);
  save_safetensors(path, stray, meta);
  AG_CHECK_ERROR(load(), "load_checkpoint", path.c_str(), "'ema.0.weight'", "neither");

  // optimizer mismatch: one of AdamW's state tensors is missing
  auto no_exp_avg = tensors;
  std::erase_if(no_exp_avg, [](const auto& nt) { return nt.first == "optim.state.1.exp_avg"; });
  save_safetensors(path, no_exp_avg, meta);
  AG_CHECK_ERROR(load(), "load_checkpoint", path.c_str(), "AdamW", "state.1.exp_avg");
  // a checkpoint of another optimizer
  {
    Run sgd_run(1, 7);
    optim::SGD sgd(sgd_run.model->parameters(), {.lr = 0.1, .momentum = 0.9});
    save_checkpoint(path, *sgd_run.model, sgd, 0, sgd_run.drop_gen);
  }
  AG_CHECK_ERROR(load(), "load_checkpoint", path.c_str(), "AdamW");

  // nothing was changed by any failed load; without an optimizer the last file loads fine
  CHECK(values(*fresh.model) == fresh_values);
  CHECK(fresh.drop_gen.seed() == 99);
  CHECK(load_checkpoint(path, *fresh.model, nullptr, nullptr).step == 0);
  CHECK(values(*fresh.model) != fresh_values);
  CHECK(load_checkpoint(good_path, *fresh.model, fresh.opt.get(), &fresh.drop_gen).step == 1);
  CHECK(values(*fresh.model) == saved);
}

TEST_CASE("checkpoint: another architecture is an error listing the mismatched names") {
  TempDir tmp("arch");
  const std::string path = tmp.file("ckpt.safetensors");
  Run run(1, 7);
  run.step(0);
  save_checkpoint(path, *run.model, *run.opt, 1, run.drop_gen);

  // Linear(4,6) - GELU - Linear(6,3): 0.* mis-shaped, 2.* missing, 3.* unexpected
  Generator g(5);
  nn::Sequential other{std::make_shared<nn::Linear>(4, 6, true, DType::f32, &g), std::make_shared<nn::GELU>(),
                       std::make_shared<nn::Linear>(6, 3, true, DType::f32, &g)};
  optim::AdamW opt(other.parameters(), {});
  const auto before = values(other);
  const size_t opt_entries = opt.state_dict().size();
  AG_CHECK_ERROR(load_checkpoint(path, other, &opt, nullptr), "load_checkpoint", path.c_str(), "load_state_dict",
                 "2 missing (2.weight, 2.bias)", "2 unexpected (3.weight, 3.bias)", "2 mismatched (0.weight: ",
                 "0.bias: ");
  CHECK(values(other) == before);
  CHECK(opt.state_dict().size() == opt_entries);  // hyper-parameters only: no state was loaded
}
