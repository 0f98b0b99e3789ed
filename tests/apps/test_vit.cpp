// The ViT app's pieces (apps/vit/lib.h) on tiny models and synthetic IDX files: its config
// through a checkpoint's metadata, the class token's attention grid, evaluation, a short run whose
// loss falls, and a resumed run equal to an uninterrupted one.
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "apps/common/run.h"
#include "tests/apps/usage_error.h"
#include "apps/vit/lib.h"
#include "optim/adam.h"
#include "tests/helpers.h"
#include "training/checkpoint.h"

using namespace ag;
using namespace ag::apps;
using namespace ag::test;

namespace {

// An IDX file of u8 (data/idx.h): 0 0 0x08 ndims, then each dim as a big-endian u32, then data.
std::string idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::string s = {0, 0, 8, char(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) s += char((d >> shift) & 0xFF);
  return s + std::string(data.begin(), data.end());
}

// A learnable 8x8 task in Fashion-MNIST's file layout: image i has class c = i % 4 and pixels of
// brightness 30 + 60 c plus pseudo-random noise in [0, 32). Every patch shows the class (so even a
// uniform attention keeps it), and flips and small shifts (the augmentation) do not change it.
void write_synthetic_fashion(const TempDir& dir, uint32_t n_train, uint32_t n_test) {
  auto write = [&](const std::string& prefix, uint32_t n, uint32_t salt) {
    std::vector<uint8_t> images(size_t(n) * 64), labels(n);
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t c = i % 4;
      labels[i] = uint8_t(c);
      for (uint32_t y = 0; y < 8; ++y)
        for (uint32_t x = 0; x < 8; ++x) {
          const uint32_t noise = (i * 131 + y * 17 + x * 7 + salt) * 2654435761u >> 27;  // 0..31
          images[size_t(i) * 64 + y * 8 + x] = uint8_t(30 + 60 * c + noise);
        }
    }
    write_bytes(dir.file(prefix + "-images-idx3-ubyte"), idx_bytes({n, 8, 8}, images));
    write_bytes(dir.file(prefix + "-labels-idx1-ubyte"), idx_bytes({n}, labels));
  };
  write("train", n_train, 1);
  write("t10k", n_test, 2);
}

VitRunConfig tiny_config() {
  VitRunConfig c;
  c.model.patch = 4;  // 8x8 images: a 2x2 grid, 5 tokens
  c.model.d_model = 16, c.model.n_heads = 2, c.model.n_layers = 1, c.model.mlp_hidden = 32;
  return c;
}

// The training loop of apps/vit/main.cpp (same calls, same order) for `steps` of a run of `total`
// steps in `dir`, resuming from its checkpoint when `resume`; returns the losses it computed.
// `prefetch` > 0 makes the batches on the loader's background thread.
std::vector<double> run_steps(const std::string& data_dir, const std::string& dir, int64_t steps, int64_t total,
                              bool resume, int prefetch = 2) {
  RunOptions o;
  o.steps = total, o.batch = 16, o.lr = 3e-2, o.out_dir = dir, o.resume = resume, o.quiet = true;
  o.eval_every = 1000, o.checkpoint_every = 1000;
  apply_run_options(o, "vit");
  VitRunConfig cfg = tiny_config();
  cfg.augment = {.pad = 1, .flip = true};  // the augmentation draws must resume too
  const VitData data = load_vit_data("fashion-mnist", data_dir);
  fit_model_to_data(cfg.model, data.splits.train);
  Generator gen(o.seed);
  ViT model(cfg.model, &gen);
  optim::AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  const auto schedule = make_schedule(o);
  Run run("vit", o, model, opt, gen, vit_config_to_json(cfg));
  int64_t step = run.resume();
  auto loader = make_train_loader(data.splits.train, data.norm, cfg.augment, o.batch, o.seed, step, prefetch);
  std::vector<double> losses;
  for (; step < steps; ++step) {
    schedule->set_lr(opt, step);
    const data::Batch batch = loader->next_step();
    losses.push_back(forward_backward(model, opt, batch, cfg.label_smoothing));
    run.optimizer_step(step + 1, losses.back());
    run.step_done(step + 1, losses.back(), o.batch);
  }
  run.save(step);
  return losses;
}

}  // namespace

TEST_CASE("vit: config round trip through a checkpoint's metadata") {
  VitRunConfig c = tiny_config();
  c.dataset = "cifar10";
  c.model.image_size = 32, c.model.channels = 3, c.model.classes = 10, c.model.dropout = 0.25;
  c.label_smoothing = 0.05;
  c.augment = {.pad = 2, .flip = true};
  const nlohmann::json j = vit_config_to_json(c);

  TempDir dir("vit_config");
  ViT model(c.model);
  optim::AdamW opt(model.parameters(), {});
  Generator gen(3);
  training::save_checkpoint(dir.file("c.safetensors"), model, opt, 7, gen, {{"config", j.dump()}});
  const CheckpointInfo info = read_checkpoint_info(dir.file("c.safetensors"));
  CHECK(info.step == 7);
  CHECK(info.config == j);
  const VitRunConfig back = vit_config_from_json(info.config);
  CHECK(vit_config_to_json(back) == j);  // every field, including the ones set above
  CHECK(back.dataset == "cifar10");
  CHECK(back.model.patch == 4);
  CHECK(back.model.image_size == 32);
  CHECK(back.model.dropout == 0.25);
  CHECK(back.augment.pad == 2);
  CHECK(back.augment.flip);
  // the model it describes takes the checkpoint's weights
  ViT again(back.model);
  training::load_checkpoint(dir.file("c.safetensors"), again, nullptr, nullptr);
  CHECK(max(abs(again.head->weight - model.head->weight)).item<float>() == 0.0f);

  nlohmann::json missing = j;
  missing.erase("patch");
  AG_CHECK_ERROR(vit_config_from_json(missing), "vit", "'patch'");
  nlohmann::json mistyped = j;
  mistyped["n_heads"] = "four";
  AG_CHECK_ERROR(vit_config_from_json(mistyped), "vit", "'n_heads'", "\"four\"");
  // numbers that are not integers of the field's type are refused before any conversion
  mistyped = j;
  mistyped["patch"] = 1.2892e22;
  AG_CHECK_ERROR(vit_config_from_json(mistyped), "vit", "'patch'", "integer");
  mistyped = j;
  mistyped["crop_pad"] = int64_t(1) << 40;
  AG_CHECK_ERROR(vit_config_from_json(mistyped), "vit", "'crop_pad'", "1099511627776");
  mistyped = j;
  mistyped["d_model"] = std::numeric_limits<uint64_t>::max();
  AG_CHECK_ERROR(vit_config_from_json(mistyped), "vit", "'d_model'", "18446744073709551615");
}

TEST_CASE("vit: class token attention averages the heads over the patch grid") {
  // B = 1, H = 2, grid 2x2 so T = 5. Row 0 of head 0 is (0.2, 0.1, 0.2, 0.3, 0.2) and of head 1
  // (0.0, 0.4, 0.2, 0.1, 0.3); columns 1..4 averaged: (0.25, 0.2, 0.2, 0.25). Other rows are 9s and
  // must not leak in.
  std::vector<double> w(2 * 5 * 5, 9.0);
  const double row0[2][5] = {{0.2, 0.1, 0.2, 0.3, 0.2}, {0.0, 0.4, 0.2, 0.1, 0.3}};
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 5; ++j) w[size_t(h * 25 + j)] = row0[h][j];
  const auto grids = class_token_attention(from_vector(w, {1, 2, 5, 5}), 2, 2);
  REQUIRE(grids.size() == 1);
  check_close(grids[0], {0.25, 0.2, 0.2, 0.25}, 1e-12);
  // a transposed (non-contiguous) view of the same weights: row 0 becomes column 0
  const auto from_view = class_token_attention(from_vector(w, {1, 2, 5, 5}).transpose(2, 3).contiguous().transpose(2, 3), 2, 2);
  check_close(from_view[0], {0.25, 0.2, 0.2, 0.25}, 1e-12);
  AG_CHECK_ERROR(class_token_attention(from_vector(w, {1, 2, 5, 5}), 3, 3), "vit", "3x3", "[1,2,5,5]");
  AG_CHECK_ERROR(class_token_attention(from_vector(w, {2, 5, 5}), 2, 2), "vit", "[2,5,5]");
}

TEST_CASE("vit: attention overlay of a tiny model") {
  TempDir dir("vit_overlay");
  write_synthetic_fashion(dir, 32, 8);
  const VitData data = load_vit_data("fashion-mnist", dir.dir.string());
  VitRunConfig c = tiny_config();
  fit_model_to_data(c.model, data.splits.train);
  CHECK(c.model.image_size == 8);
  CHECK(c.model.classes == 10);
  Generator gen(5);
  ViT model(c.model, &gen);

  // the grids the overlay draws: the last block's class-token row, each a distribution over the
  // patches minus what the class token keeps for itself
  model.eval();
  model.need_weights = true;
  const data::Batch b = data::make_batch(data.splits.test, std::vector<int64_t>{0, 1, 2}, data.norm);
  {
    NoGradGuard no_grad;
    model.forward(b.images);
  }
  const Tensor& weights = (*model.blocks)[0].attn_weights;
  REQUIRE(weights.shape() == Shape{3, 2, 5, 5});
  const auto grids = class_token_attention(weights, 2, 2);
  REQUIRE(grids.size() == 3);
  const std::vector<float> w = weights.contiguous().to_vector<float>();
  for (size_t i = 0; i < 3; ++i) {
    const double self = 0.5 * (w[i * 50 + 0] + w[i * 50 + 25]);  // [i, h, 0, 0] averaged over h
    CHECK(std::accumulate(grids[i].begin(), grids[i].end(), 0.0) + self == doctest::Approx(1.0).epsilon(1e-5));
  }
  model.need_weights = false;
  model.train();

  const std::vector<int64_t> idx = {0, 1, 2};
  const std::string svg = attention_overlay_svg(model, data.splits.test, data.norm, idx, 2);
  CHECK(model.is_training());        // mode restored
  CHECK(!model.need_weights);
  CHECK(!(*model.blocks)[0].attn_weights.defined());  // the weights were freed
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = svg.find(what); at != std::string::npos; at = svg.find(what, at + 1)) ++n;
    return n;
  };
  CHECK(count("<?xml") == 1);
  CHECK(count("<svg") == 4);                   // the grid and one per image
  CHECK(count("class=\"patch\"") == 3 * 4);    // 2x2 patches per image
  CHECK(count("class=\"pixel\"") == 3 * 2 * 64);  // each image twice: alone and under the grid
  CHECK(svg.find("T-shirt/top") != std::string::npos);  // test image 0 is class 0
  CHECK(svg.find("Trouser") != std::string::npos);
  AG_CHECK_ERROR(attention_overlay_svg(model, data.splits.test, data.norm, {}, 2), "vit", "needs images");
}

TEST_CASE("vit: evaluation counts every test image once") {
  TempDir dir("vit_eval");
  write_synthetic_fashion(dir, 32, 22);
  const VitData data = load_vit_data("fashion-mnist", dir.dir.string());
  VitRunConfig c = tiny_config();
  fit_model_to_data(c.model, data.splits.train);
  ViT model(c.model);
  const EvalResult all = evaluate(model, data.splits.test, data.norm, 5);  // 5 + 5 + 5 + 5 + 2
  REQUIRE(all.confusion);
  CHECK(all.samples == 22);
  CHECK(all.confusion->total() == 22);
  // row sums are the true class counts: 22 images, classes i % 4 -> 6, 6, 5, 5
  for (int t = 0; t < 4; ++t) {
    int64_t row = 0;
    for (int p = 0; p < 10; ++p) row += all.confusion->at(t, p);
    CHECK(row == (t < 2 ? 6 : 5));
  }
  CHECK(all.accuracy == doctest::Approx(double(all.confusion->correct()) / 22));
  // an untrained model: the loss is about log(10) (logits near zero)
  CHECK(all.loss == doctest::Approx(std::log(10.0)).epsilon(0.05));
  // batching does not change the result; a limit takes the first images
  const EvalResult one_batch = evaluate(model, data.splits.test, data.norm, 100);
  CHECK(one_batch.loss == doctest::Approx(all.loss).epsilon(1e-6));
  CHECK(one_batch.confusion->counts == all.confusion->counts);
  CHECK(evaluate(model, data.splits.test, data.norm, 4, 9).samples == 9);
  CHECK(model.is_training());
  AG_CHECK_ERROR(evaluate(model, data.splits.test, data.norm, 0), "vit", "batch", "0");
}

TEST_CASE("vit: datasets that are not there, or not known") {
  TempDir dir("vit_nodata");
  CHECK_THROWS_AS(load_vit_data("fashion-mnist", dir.dir.string()), data::DatasetNotFound);
  try {
    load_vit_data("fashion-mnist", dir.file("absent"));
  } catch (const data::DatasetNotFound& e) {
    CHECK(std::string(e.what()).find("dataset-fashion-mnist") != std::string::npos);  // the package to install
  }
  CHECK_THROWS_AS(load_vit_data("cifar10", dir.dir.string()), data::DatasetNotFound);
  AG_CHECK_ERROR(load_vit_data("imagenet", dir.dir.string()), "vit", "'imagenet'", "fashion-mnist");
  write_synthetic_fashion(dir, 8, 4);
  const VitData data = load_vit_data("fashion-mnist", dir.dir.string());
  AG_CHECK_ERROR(make_train_loader(data.splits.train, data.norm, {}, 9, 1, 0), "vit", "batch 9", "[1, 8]");
}

TEST_CASE("vit: a tiny run on synthetic IDX files learns") {
  TempDir dir("vit_learns");
  write_synthetic_fashion(dir, 256, 64);
  const std::vector<double> losses = run_steps(dir.dir.string(), dir.file("run"), 60, 60, false);
  REQUIRE(losses.size() == 60);
  const double first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[57] + losses[58] + losses[59]) / 3;
  INFO("first ", first, " last ", last);
  CHECK(first > 2.0);         // ~log(10) at the start
  CHECK(last < 0.6 * first);  // brightness is easy to learn
  // the checkpoint it left evaluates to far better than chance (4 classes in use)
  const CheckpointInfo info = read_checkpoint_info(dir.file("run/checkpoint.safetensors"));
  CHECK(info.step == 60);
  const VitRunConfig cfg = vit_config_from_json(info.config);
  ViT model(cfg.model);
  training::load_checkpoint(dir.file("run/checkpoint.safetensors"), model, nullptr, nullptr);
  const VitData data = load_vit_data(cfg.dataset, dir.dir.string());
  CHECK(evaluate(model, data.splits.test, data.norm, 32).accuracy > 0.6);
}

TEST_CASE("vit: a resumed run equals an uninterrupted one") {
  TempDir dir("vit_resume");
  write_synthetic_fashion(dir, 64, 8);  // 4 batches of 16 per epoch: the runs cross epochs
  const std::string data_dir = dir.dir.string();
  // the uninterrupted run makes its batches on the loader thread, the resumed one inline: same batches
  const std::vector<double> straight = run_steps(data_dir, dir.file("a"), 10, 10, false);
  std::vector<double> resumed = run_steps(data_dir, dir.file("b"), 5, 10, false, /*prefetch=*/0);
  const std::vector<double> rest = run_steps(data_dir, dir.file("b"), 10, 10, true, /*prefetch=*/0);
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  REQUIRE(resumed.size() == straight.size());
  for (size_t i = 0; i < straight.size(); ++i) CHECK_MESSAGE(resumed[i] == straight[i], "step ", i);  // bitwise
}

TEST_CASE("vit: the command line is checked before any data is read") {
  VitRunConfig ok;  // the defaults: 28x28 fashion-mnist, patch 7, d 64, 4 heads
  CHECK_NOTHROW(validate_vit_config(ok));
  VitRunConfig c = ok;
  c.model.n_heads = 3;  // 64 = 3 * 21 + 1
  check_usage_error([&] { validate_vit_config(c); }, {"vit:", "--heads 3", "--d-model 64"});
  c = ok, c.model.patch = 5;  // 28 = 5 * 5 + 3
  check_usage_error([&] { validate_vit_config(c); }, {"--patch 5", "28x28", "fashion-mnist"});
  c = ok, c.dataset = "cifar10", c.model.patch = 7;  // 32 = 7 * 4 + 4, while 28 = 7 * 4
  check_usage_error([&] { validate_vit_config(c); }, {"--patch 7", "32x32", "cifar10"});
  c.model.patch = 8;  // 32 = 8 * 4
  CHECK_NOTHROW(validate_vit_config(c));
  c = ok, c.model.patch = 0;  // zero or negative sizes (CLI11 refuses them first; code may not)
  check_usage_error([&] { validate_vit_config(c); }, {"--patch 0"});
  c = ok, c.model.d_model = -64;
  check_usage_error([&] { validate_vit_config(c); }, {"--d-model -64"});
  c = ok, c.model.n_layers = 0;
  check_usage_error([&] { validate_vit_config(c); }, {"--layers 0"});
  c = ok, c.model.mlp_hidden = 0;
  check_usage_error([&] { validate_vit_config(c); }, {"--mlp 0"});
  c = ok, c.augment.pad = 28;
  check_usage_error([&] { validate_vit_config(c); }, {"--crop-pad 28"});
  c = ok, c.label_smoothing = 1;
  check_usage_error([&] { validate_vit_config(c); }, {"--label-smoothing 1"});
  CHECK(vit_image_size("mnist") == 28);
  CHECK(vit_image_size("cifar10") == 32);
}

TEST_CASE("vit: a small training set gets a validation split, data-size defaults said in one line each, and the best model tested") {
  TempDir dir("vit_small");
  write_synthetic_fashion(dir, 256, 64);
  auto run = [&](const std::string& name, const std::string& more) {
    const std::string out = dir.file(name), log = dir.file(name + ".txt");
    const std::string cmd = std::string("'") + ATTOGRAD_APP_DIR + "/vit' --patch 4 --d-model 16 --heads 2 --layers 1 " +
                            "--mlp 32 --threads 1 --quiet --out '" + out + "' --data-dir '" + dir.dir.string() + "' " +
                            more + " > '" + log + "' 2>&1";
    const int status = std::system(cmd.c_str());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    return read_bytes(log);
  };
  // 256 training images, 10% (25) held out: 231 to train on, a small set
  const std::string text = run("auto", "--batch 32");
  INFO(text);
  CHECK(text.find("(231 train / 25 validation / 64 test images of 1x8x8)") != std::string::npos);
  // 100 epochs of 231 images at batch 32 = ceil(23100 / 32) = 722 steps instead of the default 6000
  CHECK(text.find("vit: --steps 722: 100 epochs of 231 training images (< 20000: a small set) at batch 32") !=
        std::string::npos);
  CHECK(text.find("vit: --crop-pad 2: 231 training images") != std::string::npos);
  CHECK(text.find("vit: --dropout 0.1: 231 training images") != std::string::npos);
  CHECK(text.find("vit: --patience 5: 231 training images") != std::string::npos);
  CHECK(text.find("testing the best model by validation: step ") != std::string::npos);
  const auto report = nlohmann::json::parse(read_bytes(dir.file("auto/report.json")));
  const int64_t best = report.at("best_step").get<int64_t>();
  CHECK(best > 0);
  CHECK(read_checkpoint_info(dir.file("auto/best.safetensors")).step == best);
  const nlohmann::json cfg = report.at("config");
  CHECK(cfg.at("val_size") == 25);
  CHECK(cfg.at("crop_pad") == 2);
  CHECK(cfg.at("dropout") == 0.1);
  // during training the validation split is evaluated, never the test set
  std::ifstream metrics(dir.file("auto/metrics.jsonl"));
  int evals = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    CHECK_FALSE(j.contains("test_accuracy"));
    evals += j.contains("val_accuracy");
  }
  CHECK(evals >= 1);
  // any explicit flag wins, and is not announced
  const std::string given = run("given", "--batch 32 --steps 20 --crop-pad 0 --dropout 0 --patience 0 --val-size 50");
  CHECK(given.find("(206 train / 50 validation / 64 test images") != std::string::npos);
  for (const char* flag : {"vit: --steps", "vit: --crop-pad", "vit: --dropout", "vit: --patience"})
    CHECK_MESSAGE(given.find(flag) == std::string::npos, flag);
  const nlohmann::json given_cfg = nlohmann::json::parse(read_bytes(dir.file("given/report.json"))).at("config");
  CHECK(given_cfg.at("crop_pad") == 0);
  CHECK(given_cfg.at("dropout") == 0.0);
  // --val-size 0: nothing to select by; the last model is tested
  const std::string none = run("none", "--batch 32 --steps 10 --val-size 0");
  CHECK(none.find("testing the model of step 10 (no best.safetensors") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.file("none/best.safetensors")));
}

TEST_CASE("vit: the binary exits 2 with one line for --heads 3, before any work") {
  TempDir dir("vit_cli");
  const std::string out = dir.file("run"), err = dir.file("stderr.txt");
  // --data-dir points at nothing: the usage error must come before the data is looked for
  const std::string cmd = std::string("'") + ATTOGRAD_APP_DIR + "/vit' --heads 3 --out '" + out + "' --data-dir '" +
                          dir.file("no-data") + "' > /dev/null 2> '" + err + "'";
  const int status = std::system(cmd.c_str());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == kExitUsage);
  const std::string text = read_bytes(err);
  INFO("stderr: " << text);
  CHECK(text == "vit: --heads 3 does not divide --d-model 64 (each head gets d-model/heads) (vit --help lists every "
                "option)\n");
  CHECK_FALSE(std::filesystem::exists(out));  // no run directory: nothing started
}
