// --precision bf16 in the apps (autograd/autocast.h): the real binaries at the tiny size of
// tests/apps/tiny_apps.h, run once in fp32 and once in bf16 from the same seed.
//
//   the loss curves agree to 2e-3 relative: bf16 operands carry a relative rounding error of at
//   most 2^-8 per element, the sums are f32, and these 30 steps stay on the fp32 curve (measured:
//   about 4e-5 relative for gpt); a loss that drifted further would mean the autocast reached an
//   op it should not (a norm, the loss, the optimizer)
//   the curves are NOT bit-equal: a flag that changed nothing would fail
//   the report and its JSON name the precision, and the bf16 checkpoint is an ordinary f32 one
//   that an fp32 --eval-only reads
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/apps/tiny_apps.h"
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

void bf16_follows_fp32(const std::string& app) {
  Apps apps("precision_" + app);
  run_app(apps.command(app, "fp32", kSteps, kEvery, 1), apps.logs(), "fp32");
  const Child bf16 = run_app(apps.command(app, "bf16", kSteps, kEvery, 1, {"--precision", "bf16"}), apps.logs(), "bf16");
  const std::string a = apps.tmp.file("fp32") + "/metrics.jsonl", b = apps.tmp.file("bf16") + "/metrics.jsonl";
  REQUIRE(read_metrics(a).size() == size_t(kSteps / kEvery));
  check_close_losses(b, a, 1e-6, 2e-3);
  const std::vector<double> la = losses(a), lb = losses(b);
  REQUIRE(la.size() == lb.size());
  int differ = 0;
  for (size_t i = 0; i < la.size(); ++i) differ += la[i] != lb[i];
  CHECK(differ > int(la.size()) / 2);  // the operands really were rounded

  CHECK(bf16.output().find("bf16 autocast") != std::string::npos);  // the header and the report say so
  std::ifstream in(apps.tmp.file("bf16") + "/report.json");
  const nlohmann::json report = nlohmann::json::parse(in);
  CHECK(report.at("precision") == "bf16");
  CHECK(report.at("device") == "cpu");

  // the bf16 run's checkpoint holds f32 weights: an fp32 evaluation reads it
  std::vector<std::string> eval = apps.command(app, "bf16", kSteps, kEvery, 1);
  eval.insert(eval.end(), {"--eval-only", "--checkpoint", apps.checkpoint("bf16")});
  run_app(eval, apps.logs(), "eval");
}

}  // namespace

TEST_CASE("precision: gpt --precision bf16 follows the fp32 loss curve, not bit for bit") { bf16_follows_fp32("gpt"); }
TEST_CASE("precision: vit --precision bf16 follows the fp32 loss curve, not bit for bit") { bf16_follows_fp32("vit"); }
TEST_CASE("precision: textclf --precision bf16 follows the fp32 loss curve, not bit for bit") {
  bf16_follows_fp32("textclf");
}
