// --precision bf16 and fp16 in the apps (autograd/autocast.h): the real binaries at the tiny size
// of tests/apps/tiny_apps.h, run once in fp32 and once in 16-bit autocast from the same seed.
//
//   the loss curves agree to 2e-3 relative (textclf in bf16: 4e-3): bf16 operands carry a relative
//   rounding error of at most 2^-8 per element (fp16: 2^-11), the sums are f32, and these 30 steps
//   stay near the fp32 curve. textclf's curve falls fastest and amplifies most (its two bf16
//   paths, emulated and AVX512-BF16's, differ by f32 rounding only and still drift apart), hence
//   its wider bound. A loss that drifted further would mean the autocast reached an op it should
//   not (the loss, the optimizer)
//   the first two points agree to 1e-4 relative: one or two steps leave little to amplify
//   the curves are NOT bit-equal: a flag that changed nothing would fail
//   the report and its JSON name the precision (fp16: and the loss scale), and the checkpoint is
//   an ordinary f32 one that an fp32 --eval-only reads
//   fp16: --stop-at then --resume ends bit for bit where a straight run does (the loss scale and
//   its growth count travel in the checkpoint)
//   --export-bf16: the tested model's weights rounded to bf16 (half the bytes), which --eval-only
//   reads and --resume cannot
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/kernels/pointwise.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "tests/apps/tiny_apps.h"
#include "training/checkpoint.h"
#include "tests/helpers.h"
#include "tests/spawn.h"

using namespace ag;
using namespace ag::test;

namespace {

constexpr int64_t kSteps = 30, kEvery = 5;

// Every loss of a metrics.jsonl file, line by line.
std::vector<double> losses(const std::string& path) {
  std::vector<double> out;
  for (const nlohmann::json& line : read_metrics(path))
    for (const auto& [name, value] : line.items())
      if (name.ends_with("_loss")) out.push_back(value.get<double>());
  return out;
}

void follows_fp32(const std::string& app, const std::string& precision, double rtol = 2e-3) {
  Apps apps("precision_" + app + "_" + precision);
  run_app(apps.command(app, "fp32", kSteps, kEvery, 1), apps.logs(), "fp32");
  const Child low = run_app(apps.command(app, "low", kSteps, kEvery, 1, {"--precision", precision}), apps.logs(), "low");
  const std::string a = apps.tmp.file("fp32") + "/metrics.jsonl", b = apps.tmp.file("low") + "/metrics.jsonl";
  REQUIRE(read_metrics(a, "eval").size() == size_t(kSteps / kEvery));
  REQUIRE(read_metrics(a, "train").size() == size_t(kSteps / kEvery));
  check_close_losses(b, a, 1e-6, rtol);
  const std::vector<double> la = losses(a), lb = losses(b);
  REQUIRE(la.size() == lb.size());
  for (size_t i = 0; i < 2 && i < la.size(); ++i) CHECK(std::abs(lb[i] - la[i]) <= 1e-4 * std::abs(la[i]));
  int differ = 0;
  for (size_t i = 0; i < la.size(); ++i) differ += la[i] != lb[i];
  CHECK(differ > int(la.size()) / 2);  // the operands really were rounded

  CHECK(low.output().find(precision + " autocast") != std::string::npos);  // the header and the report say so
  std::ifstream in(apps.tmp.file("low") + "/report.json");
  const nlohmann::json report = nlohmann::json::parse(in);
  CHECK(report.at("precision") == precision);
  CHECK(report.at("device") == "cpu");
  if (precision == "fp16") {  // 2^16, never overflowed in 30 steps of these small losses
    CHECK(report.at("loss_scale") == 65536.0);
    CHECK(report.at("loss_scale_skips") == 0);
  } else {
    CHECK_FALSE(report.contains("loss_scale"));
  }

  // the 16-bit run's checkpoint holds f32 weights: an fp32 evaluation reads it
  std::vector<std::string> eval = apps.command(app, "low", kSteps, kEvery, 1);
  eval.insert(eval.end(), {"--eval-only", "--checkpoint", apps.checkpoint("low")});
  run_app(eval, apps.logs(), "eval");
}

}  // namespace

TEST_CASE("precision: gpt --precision bf16 follows the fp32 loss curve, not bit for bit") { follows_fp32("gpt", "bf16"); }
TEST_CASE("precision: vit --precision bf16 follows the fp32 loss curve, not bit for bit") { follows_fp32("vit", "bf16"); }
TEST_CASE("precision: textclf --precision bf16 follows the fp32 loss curve, not bit for bit") {
  follows_fp32("textclf", "bf16", 4e-3);
}
TEST_CASE("precision: gpt --precision fp16 follows the fp32 loss curve with a loss scale") { follows_fp32("gpt", "fp16"); }
TEST_CASE("precision: vit --precision fp16 follows the fp32 loss curve with a loss scale") { follows_fp32("vit", "fp16"); }
TEST_CASE("precision: textclf --precision fp16 follows the fp32 loss curve with a loss scale") {
  follows_fp32("textclf", "fp16");
}

TEST_CASE("precision: gpt --precision fp16 resumes bit for bit, the loss scale included") {
  Apps apps("precision_resume");
  // a growth interval shorter than the run is not an option; the scale and its count of finite
  // steps must come back all the same, or the resumed run's next growth would fall elsewhere
  const std::vector<std::string> fp16 = {"--precision", "fp16"};
  run_app(apps.command("gpt", "straight", 12, 4, 1, fp16), apps.logs(), "straight");
  std::vector<std::string> first = fp16, second = fp16;
  first.insert(first.end(), {"--stop-at", "5"});
  second.push_back("--resume");
  run_app(apps.command("gpt", "split", 12, 4, 1, first), apps.logs(), "first");
  std::map<std::string, std::string> meta;
  load_safetensors_map(apps.checkpoint("split"), &meta);
  CHECK(meta.at("extra.run.loss_scale") == "65536");
  CHECK(meta.at("extra.run.loss_scale_tracker") == "5");
  run_app(apps.command("gpt", "split", 12, 4, 1, second), apps.logs(), "second");
  check_checkpoints(apps.checkpoint("split"), apps.checkpoint("straight"));
}

TEST_CASE("precision: --export-bf16 writes the tested model in bf16, which --eval-only reads and --resume refuses") {
  Apps apps("precision_export");
  const std::string exported = apps.tmp.file("model.bf16.safetensors");
  run_app(apps.command("gpt", "run", 20, 5, 1, {"--export-bf16", exported}), apps.logs(), "export");
  // the best model by validation, each f32 weight rounded to bf16, stored as BF16
  std::map<std::string, std::string> meta;
  const auto best = load_safetensors_map(apps.tmp.file("run") + "/best.safetensors");
  const auto got = load_safetensors_map(exported, &meta);
  CHECK(meta.at("contents") == "model");
  std::ifstream in(apps.tmp.file("run") + "/report.json");
  const nlohmann::json report = nlohmann::json::parse(in);
  CHECK(meta.at("step") == std::to_string(report.at("best_step").get<int64_t>()));
  int64_t model_tensors = 0, bad = 0, f32_bytes = 0;
  for (const auto& [name, t] : best) {
    if (name.rfind("model.", 0) != 0) {
      CHECK(got.count(name) == 0);  // no optimizer state
      continue;
    }
    ++model_tensors;
    REQUIRE(got.count(name) == 1);
    if (t.dtype() != DType::f32) continue;
    f32_bytes += t.nbytes();
    const std::vector<float> a = t.to_vector<float>(), b = got.at(name).to_vector<float>();
    for (size_t i = 0; i < a.size(); ++i) bad += pw::float_bits(b[i]) != pw::float_bits(pw::round_bf16(a[i]));
  }
  CHECK(model_tensors > 5);
  CHECK(bad == 0);
  CHECK(got.size() == size_t(model_tensors));
  const auto size = std::filesystem::file_size(exported);
  CHECK(size < size_t(f32_bytes) / 2 + 8192);  // half the weights' bytes, and a header
  // --eval-only reads it; --export-bf16 with --eval-only is refused
  std::vector<std::string> eval = apps.command("gpt", "run", 20, 5, 1);
  eval.insert(eval.end(), {"--eval-only", "--checkpoint", exported});
  const Child ok = run_app(eval, apps.logs(), "eval");
  CHECK(ok.output().find("validation loss") != std::string::npos);
  eval.insert(eval.end(), {"--export-bf16", apps.tmp.file("again.safetensors")});
  const Child refused = run_app(eval, apps.logs(), "refused", 2);
  CHECK(refused.output().find("--export-bf16") != std::string::npos);
  CHECK(refused.output().find("--eval-only") != std::string::npos);
  // a file in a folder that is not there is refused before training, not after it
  const Child nowhere = run_app(apps.command("gpt", "run2", 20, 5, 1, {"--export-bf16", apps.tmp.file("no/such.st")}),
                                apps.logs(), "nowhere", 2);
  CHECK(nowhere.output().find("expected a file in an existing folder") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(apps.tmp.file("run2")));
  // a training run cannot continue from it: the file has no optimizer state
  nn::Linear lin(2, 3);
  optim::AdamW opt(lin.parameters(), {});
  training::save_model(apps.tmp.file("lin.safetensors"), lin, 7, Generator(1), {}, FloatStorage::bf16);
  AG_CHECK_ERROR(training::load_checkpoint(apps.tmp.file("lin.safetensors"), lin, &opt, nullptr), "lin.safetensors",
                 "without optimizer state", "cannot resume");
  CHECK(training::load_checkpoint(apps.tmp.file("lin.safetensors"), lin, nullptr, nullptr).step == 7);
}
