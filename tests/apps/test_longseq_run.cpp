// The longseq binary as a user runs it, on tiny synthetic Fashion-MNIST (8x8 images: 64 pixel
// tokens, 4 classes by brightness; tests/apps/tiny_apps.h): every attention method trains through
// main's own loop and its checkpoint evaluates to the run's test result; the validation split
// follows validation_size; --resume refuses other schedule options, and --eval-only and --resume
// refuse another app's checkpoint, each a usage error (exit 2).
#include <cmath>
#include <filesystem>

#include "apps/common/run.h"
#include "tests/apps/tiny_apps.h"
#include "tests/helpers.h"
#include "tests/spawn.h"

using namespace ag;
using namespace ag::test;
using namespace ag::apps;

namespace {

// longseq on the pixels of apps.tmp/fashion (256 training and 64 test images), in run directory
// `out`, at a tiny size: one block of width 16, 2 heads. Every step logs its training loss;
// evaluations every `eval_every` steps. Then `more` arguments.
std::vector<std::string> longseq_command(const Apps& apps, const std::string& out, int64_t steps, int64_t eval_every,
                                         std::vector<std::string> more = {}) {
  std::vector<std::string> a = {std::string(ATTOGRAD_APP_DIR) + "/longseq",
                                "--task", "pixels", "--data-dir", apps.tmp.file("fashion"),
                                "--steps", std::to_string(steps), "--eval-every", std::to_string(eval_every),
                                "--log-every", "1", "--patience", "0", "--batch", "16", "--lr", "3e-3",
                                "--d-model", "16", "--heads", "2", "--layers", "1", "--mlp", "32",
                                "--peak-gflops", "10", "--threads", "1", "--quiet", "--out", apps.tmp.file(out)};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// "test accuracy 97.50%  test loss 0.1234" in --eval-only's output: the two numbers
std::pair<double, double> eval_only_result(const std::string& text) {
  const size_t at = text.find("test accuracy ");
  REQUIRE(at != std::string::npos);
  const size_t loss_at = text.find("test loss ", at);
  REQUIRE(loss_at != std::string::npos);
  return {std::strtod(text.c_str() + at + 14, nullptr) / 100, std::strtod(text.c_str() + loss_at + 10, nullptr)};
}

}  // namespace

TEST_CASE("longseq: every attention method trains through the app, and its checkpoint evaluates to its result") {
  Apps apps("longseq_methods");
  // window +-4 of 64 tokens, sparse blocks of 8 (8 x 8 blocks: a band of +-1 and 1 global), linformer
  // k 16 of 64 and compressed stride 4: each a real restriction at T 64; axial on the 8 x 8 grid
  const std::vector<std::vector<std::string>> methods = {{"full"},
                                                         {"window", "--window", "4"},
                                                         {"sparse", "--block", "8"},
                                                         {"linformer", "--k", "16"},
                                                         {"compressed", "--stride", "4"},
                                                         {"axial"}};
  for (const std::vector<std::string>& m : methods) {
    const std::string method = m[0], out = "run-" + method;
    INFO("--attention " << method);
    std::vector<std::string> more = {"--attention", method};
    more.insert(more.end(), m.begin() + 1, m.end());
    // one evaluation, at the last step: the best model by validation is the last one, which
    // checkpoint.safetensors holds too
    const Child run = run_app(longseq_command(apps, out, 20, 20, more), apps.logs(), out);
    // --val-size -1: 10% of the 256 training images, 25 (validation_size)
    CHECK(run.output().find("(231 train / 25 validation / 64 test sequences, up to 64 tokens, 10 classes), " +
                            method + " attention") != std::string::npos);
    const std::vector<nlohmann::json> train = read_metrics(apps.tmp.file(out) + "/metrics.jsonl", "train");
    REQUIRE(train.size() == 20);
    std::vector<double> losses;
    for (const nlohmann::json& j : train) {
      REQUIRE(j.at("train_loss").is_number());  // a NaN or an infinity is written as null
      losses.push_back(j.at("train_loss").get<double>());
      CHECK(std::isfinite(losses.back()));
    }
    // A fresh model's logits are near 0 (the head's weights ~ N(0, 0.02) over 16 unit-variance
    // features: a spread of about 0.08), so the first loss is near ln 10 = 2.303 (the dataset
    // has Fashion-MNIST's 10 class names, 4 of them used); then it falls.
    CHECK(std::abs(losses[0] - std::log(10.0)) < 0.25);
    const auto mean = [&](size_t from) { return (losses[from] + losses[from + 1] + losses[from + 2]) / 3; };
    CHECK(mean(17) < mean(0));
    const nlohmann::json report = nlohmann::json::parse(read_bytes(apps.tmp.file(out) + "/report.json"));
    INFO(report.dump());
    CHECK(report.at("best_step") == 20);
    // 64 test images, 16 per class: chance is 0.25 with a spread of 0.054; 0.5 is far above it
    CHECK(report.at("accuracy").get<double>() > 0.5);

    // --eval-only on the checkpoint: the model and data the checkpoint names, the same test split,
    // the same result (the loss printed to 4 decimals)
    std::vector<std::string> eval = {std::string(ATTOGRAD_APP_DIR) + "/longseq", "--eval-only", "--data-dir",
                                     apps.tmp.file("fashion"), "--threads", "1", "--out", apps.tmp.file(out)};
    const Child ev = run_app(eval, apps.logs(), out + "-eval");
    const auto [accuracy, loss] = eval_only_result(ev.out());
    CHECK(accuracy == doctest::Approx(report.at("accuracy").get<double>()).epsilon(1e-9));
    CHECK(std::abs(loss - report.at("test_loss").get<double>()) <= 0.5e-4 + 1e-9);
    CHECK(ev.out().find("(" + method + " attention) on pixels") != std::string::npos);
  }
}

TEST_CASE("longseq: --val-size 0 validates on nothing and tests the last model, --val-size 256 is refused") {
  Apps apps("longseq_val_size");
  const Child run = run_app(longseq_command(apps, "none", 4, 2, {"--val-size", "0"}), apps.logs(), "none");
  CHECK(run.output().find("(256 train / 0 validation / 64 test sequences") != std::string::npos);
  const nlohmann::json report = nlohmann::json::parse(read_bytes(apps.tmp.file("none") + "/report.json"));
  CHECK_FALSE(report.contains("best_step"));  // no validation: no best model
  CHECK(report.at("config").at("task").at("val_size") == 0);
  CHECK(std::filesystem::exists(apps.tmp.file("none") + "/attention.svg"));  // from the test images
  const Child all = run_app(longseq_command(apps, "all", 4, 2, {"--val-size", "256"}), apps.logs(), "all", kExitUsage);
  CHECK(all.err().find("--val-size 256: leaves no training sample (the training set has 256)") != std::string::npos);
}

TEST_CASE("longseq: --resume with other schedule options is a usage error naming the option") {
  Apps apps("longseq_reschedule");
  const std::vector<std::string> cmd = longseq_command(apps, "run", 4, 2);
  run_app(cmd, apps.logs(), "train");
  const std::string ckpt = apps.checkpoint("run"), before = read_bytes(ckpt);
  struct Change {
    std::string option, value, saved;  // saved: longseq's default, or the value in cmd
  };
  for (const Change& ch : {Change{"--steps", "8", "4"}, Change{"--lr", "0.0123", "0.003"},
                           Change{"--min-lr", "1e-06", "0"}, Change{"--warmup", "0.5", "0.05"},
                           Change{"--schedule", "constant", "cosine"}}) {
    INFO(ch.option << " " << ch.value);
    const Child c = run_app(with_option(with_option(cmd, ch.option, ch.value), "--resume"), apps.logs(),
                            "resume" + ch.option, kExitUsage);
    CHECK(c.err().find("longseq: --resume: ") != std::string::npos);
    CHECK(c.err().find("a run with " + ch.option + " " + ch.saved + " (") != std::string::npos);
    CHECK(c.err().find("this run asks for " + ch.option + " " + ch.value) != std::string::npos);
    CHECK(read_bytes(ckpt) == before);
  }
}

TEST_CASE("longseq: another app's checkpoint is refused by --eval-only and --resume, naming the app that wrote it") {
  Apps apps("longseq_foreign");
  run_app(apps.command("vit", "theirs", 2, 2, 1, {}, 0.0), apps.logs(), "vit");
  const std::string theirs = apps.checkpoint("theirs"), before = read_bytes(theirs);
  const std::vector<std::string> eval =
      with_option(with_option(longseq_command(apps, "mine", 2, 2), "--eval-only"), "--checkpoint", theirs);
  const std::vector<std::string> resume = with_option(longseq_command(apps, "theirs", 2, 2), "--resume");
  for (const auto& [mode, cmd] : {std::pair{"--eval-only", eval}, std::pair{"--resume", resume}}) {
    INFO(mode);
    const Child c = run_app(cmd, apps.logs(), std::string("refused") + mode, kExitUsage);
    CHECK(c.err().find("is a checkpoint of vit, not of longseq") != std::string::npos);
    CHECK(read_bytes(theirs) == before);
  }
}
