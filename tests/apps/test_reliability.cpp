// The apps as a user runs them: the real vit, textclf and gpt binaries (ATTOGRAD_APP_DIR) spawned
// on tiny synthetic data, checked from outside the process (docs/reliability.md):
//
//   SIGINT / SIGTERM    the step finishes, a checkpoint is saved, exit 0 with the command that
//                       resumes; --resume then finishes the run
//   resume equivalence  --steps N straight == --steps N --stop-at k, then --resume: the final
//                       checkpoints are equal tensor by tensor, bit for bit, and so are the
//                       metrics.jsonl lines (train loss included), with dropout on
//   flat RSS            2000 steps: "rss_mb" of metrics.jsonl stays within 1 MiB after warm-up
//   SIGKILL             after a save, before or during the evaluation of its step: --resume
//                       evaluates that step first and ends where a straight run ends, bit for bit
//   missing data        exit 2 with one line naming the Debian package to install
//   --deterministic     1 and 2 threads end in the same checkpoint, bit for bit
//   --eval-only         the saved model evaluates to the numbers the run reported at its end
//
// Each spawned run is a tiny model (d_model 16, 2 heads, 1 layer) taking well under 2 s.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include <fmt/ranges.h>

#include "apps/common/run.h"
#include "core/serialize.h"
#include "tests/apps/tiny_apps.h"
#include "tests/helpers.h"
#include "tests/spawn.h"

using namespace ag;
using namespace ag::test;
using ag::apps::CheckpointInfo;
using ag::apps::read_checkpoint_info;
namespace fs = std::filesystem;

namespace {

// ---- SIGINT / SIGTERM ---------------------------------------------------------------------------

// Starts a run of `steps` steps, waits until it has logged two evaluations (every 20 steps: with the
// training lines, 4 lines of metrics.jsonl), sends
// `sig`, and checks what a user is promised: exit 0 after the step in progress, a checkpoint at the
// step reached, the interruption in report.json, the command that resumes. Then runs that command
// (--resume) and checks that it finishes the run from there.
void interrupt_and_resume(const std::string& app, int sig, int64_t steps) {
  Apps apps("sig_" + app);
  const std::vector<std::string> cmd = apps.command(app, "run", steps, 20, 1);
  const std::string metrics = apps.tmp.file("run") + "/metrics.jsonl";
  Child c = spawn_app(cmd, apps.logs(), "first");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (count_lines(metrics) < 4 && std::chrono::steady_clock::now() < deadline && ::waitpid(c.pid, nullptr, WNOHANG) == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(::kill(c.pid, sig) == 0);
  const int rc = wait_exit(c);
  const std::string output = c.output();
  INFO(app << " output:\n" << output);
  REQUIRE(rc == 0);
  // the signal arrived before the end (if the run outran it, `steps` is too small for this machine)
  REQUIRE(output.find("stop requested") != std::string::npos);

  const CheckpointInfo info = read_checkpoint_info(apps.checkpoint("run"));
  CHECK(info.step >= 40);  // at least the two logged steps, trained and saved
  CHECK(info.step < steps);
  CHECK(load_safetensors(apps.checkpoint("run")).size() > 0);
  const auto report = nlohmann::json::parse(read_bytes(apps.tmp.file("run") + "/report.json"));
  CHECK(report.at("interrupted") == true);
  CHECK(report.at("steps") == info.step);
  // how to go on: the same command line with --resume
  CHECK(output.find(fmt::format("stopped after step {} of {}", info.step, steps)) != std::string::npos);
  CHECK(output.find(sig == SIGINT ? "Ctrl-C" : "SIGTERM") != std::string::npos);
  CHECK(output.find(cmd[0]) != std::string::npos);
  CHECK(output.find("--resume") != std::string::npos);

  // the printed command is the one that resumes: run it as printed (split at spaces: the
  // temporary paths here need no quoting)
  const std::string marker = "To continue:\n  ";
  const size_t at = output.find(marker);
  REQUIRE(at != std::string::npos);
  const std::string printed = output.substr(at + marker.size(), output.find('\n', at + marker.size()) - at - marker.size());
  REQUIRE(printed.find('\'') == std::string::npos);
  std::vector<std::string> again;
  for (size_t b = 0, e; b < printed.size(); b = e + 1) {
    e = std::min(printed.find(' ', b), printed.size());
    again.push_back(printed.substr(b, e - b));
  }
  std::vector<std::string> expected = cmd;
  expected.push_back("--resume");
  CHECK(again == expected);
  Child r = run_app(again, apps.logs(), "resumed");
  INFO("resumed output:\n" << r.output());
  CHECK(r.output().find(fmt::format("resumed from {} at step {}", apps.checkpoint("run"), info.step)) !=
        std::string::npos);
  CHECK(read_checkpoint_info(apps.checkpoint("run")).step == steps);
  const auto final_report = nlohmann::json::parse(read_bytes(apps.tmp.file("run") + "/report.json"));
  CHECK(final_report.at("interrupted") == false);
  CHECK(final_report.at("steps") == steps - info.step);
  for (const char* kind : {"train", "eval"}) {
    INFO(kind << " lines");
    const std::vector<nlohmann::json> lines = read_metrics(metrics, kind);
    REQUIRE(!lines.empty());
    CHECK(lines.back().at("step") == steps);
    for (size_t i = 1; i < lines.size(); ++i) CHECK(lines[i].at("step") > lines[i - 1].at("step"));  // no step twice
  }
}

// ---- resume equivalence -------------------------------------------------------------------------

// Run A: N steps straight. Run B: --stop-at k, then --resume in the same run directory, same
// threads. k = 25 is not a multiple of the logging interval 10, so the line at step 30 averages
// training losses from both processes of B (the partial sum travels in the checkpoint).
void resume_equivalence(const std::string& app) {
  constexpr int64_t N = 60, k = 25, every = 10;
  Apps apps("resume_" + app);
  run_app(apps.command(app, "straight", N, every, 2), apps.logs(), "straight");
  Child stopped = run_app(apps.command(app, "split", N, every, 2, {"--stop-at", std::to_string(k)}), apps.logs(),
                          "stopped");
  CHECK(read_checkpoint_info(apps.checkpoint("split")).step == k);
  CHECK(stopped.output().find(fmt::format("stopped after step {} of {} (--stop-at {})", k, N, k)) != std::string::npos);
  CHECK(stopped.output().find("--resume") != std::string::npos);
  Child resumed = run_app(apps.command(app, "split", N, every, 2, {"--resume"}), apps.logs(), "resumed");
  // it did resume (a run that ignored --resume and trained N steps afresh would match A too)
  CHECK(resumed.output().find(fmt::format("resumed from {} at step {}", apps.checkpoint("split"), k)) !=
        std::string::npos);
  CHECK(nlohmann::json::parse(read_bytes(apps.tmp.file("split") + "/report.json")).at("steps") == N - k);

  check_checkpoints(apps.checkpoint("straight"), apps.checkpoint("split"));
  std::vector<nlohmann::json> a = read_metrics(apps.tmp.file("straight") + "/metrics.jsonl"),
                              b = read_metrics(apps.tmp.file("split") + "/metrics.jsonl");
  REQUIRE(a.size() == size_t(2 * N / every));  // a training line and an evaluation line every `every` steps
  REQUIRE(b.size() == a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    for (auto* line : {&a[i], &b[i]})  // wall clock, throughput and memory
      for (const char* name : {"time", "rss_mb", "samples_per_s", "tokens_per_s"}) line->erase(name);
    INFO("metrics line " << i);
    CHECK((a[i].contains("train_loss") || a[i].contains("skipped_steps")));
    CHECK(a[i].dump() == b[i].dump());  // doubles printed with every digit: equal text is equal bits
  }
}

// ---- a kill after a save ----------------------------------------------------------------------

// The lines of a metrics.jsonl of `kind` ("train" or "eval"), each step once (a step logged again
// after a resume: its last line), without the wall-clock, throughput and memory fields. A line a
// killed process left half written is skipped, as Run::resume skips it.
std::vector<nlohmann::json> metrics_by_step(const std::string& path, const std::string& kind) {
  std::map<int64_t, nlohmann::json> by_step;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    if (j.contains("lr") != (kind == "train")) continue;
    for (const char* name : {"time", "rss_mb", "samples_per_s", "tokens_per_s"}) j.erase(name);
    by_step[j.at("step").get<int64_t>()] = j;
  }
  std::vector<nlohmann::json> lines;
  for (auto& [step, j] : by_step) lines.push_back(std::move(j));
  return lines;
}

// The apps save a step before they evaluate it. Run B is killed by SIGKILL (no handler runs) as soon
// as its first checkpoint exists: in the steps after that save, or in the evaluation itself. Its
// checkpoint says the evaluation of its step is pending; --resume evaluates that step first, then
// trains on, and ends where a straight run A ends: the same checkpoint and best.safetensors, bit for
// bit, and the same training and evaluation lines (a step logged twice, before the kill and after
// the resume, with the same numbers).
void kill_and_resume(const std::string& app) {
  constexpr int64_t N = 400, every = 20;
  Apps apps("kill_" + app);
  run_app(apps.command(app, "straight", N, every, 1), apps.logs(), "straight");
  const std::vector<std::string> cmd = apps.command(app, "killed", N, every, 1);
  const std::string ckpt = apps.checkpoint("killed");
  Child c = spawn_app(cmd, apps.logs(), "first");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(ckpt) && std::chrono::steady_clock::now() < deadline && ::waitpid(c.pid, nullptr, WNOHANG) == 0)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  REQUIRE(::kill(c.pid, SIGKILL) == 0);
  REQUIRE(wait_exit(c) == 128 + SIGKILL);  // killed, not finished (else N is too small for this machine)
  const CheckpointInfo info = read_checkpoint_info(ckpt);
  INFO(app << " killed with its checkpoint at step " << info.step);
  REQUIRE(info.step < N);
  CHECK(info.step % every == 0);
  CHECK(info.extra.at("run.eval_pending") == "1");

  Child r = run_app(with_option(cmd, "--resume"), apps.logs(), "resumed");
  INFO("resumed output:\n" << r.output());
  CHECK(r.output().find(fmt::format("resumed from {} at step {}, evaluating that step first", ckpt, info.step)) !=
        std::string::npos);
  CHECK(r.output().find(fmt::format("step {}/{}:", info.step, N)) != std::string::npos);  // that evaluation's line
  check_checkpoints(apps.checkpoint("straight"), ckpt);
  check_checkpoints(apps.tmp.file("straight") + "/best.safetensors", apps.tmp.file("killed") + "/best.safetensors");
  CHECK_FALSE(read_checkpoint_info(ckpt).extra.count("run.eval_pending"));  // the last save came after the evaluation
  for (const char* kind : {"train", "eval"}) {
    INFO(kind << " lines");
    const std::vector<nlohmann::json> a = metrics_by_step(apps.tmp.file("straight") + "/metrics.jsonl", kind),
                                      b = metrics_by_step(apps.tmp.file("killed") + "/metrics.jsonl", kind);
    REQUIRE(a.size() == size_t(N / every));
    REQUIRE(b.size() == a.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].dump() == b[i].dump());  // equal text: equal bits
  }
}

// ---- flat RSS -----------------------------------------------------------------------------------

// 2000 steps, logging every 20 (100 metrics lines); after the first 400 steps (warm-up: the
// allocator's caches and the lazily touched pages fill), max - min of "rss_mb" must stay within
// 1 MiB. A leak of 1 KB per step would add 1600 x 1 KB = 1.56 MiB over the checked 1600 steps
// and fail; what a run without a leak adds (the growing curves and metrics history) stays far
// below the bound.
void flat_rss(const std::string& app) {
  Apps apps("rss_" + app);
  run_app(apps.command(app, "run", 2000, 20, 1), apps.logs(), "run");
  const std::vector<nlohmann::json> lines = read_metrics(apps.tmp.file("run") + "/metrics.jsonl", "eval");
  REQUIRE(lines.size() == 100);
  double lo = 1e300, hi = 0;
  for (const auto& j : lines) {
    REQUIRE(j.contains("rss_mb"));
    REQUIRE(j.at("rss_mb").is_number());
    if (j.at("step").get<int64_t>() <= 400) continue;
    lo = std::min(lo, j.at("rss_mb").get<double>()), hi = std::max(hi, j.at("rss_mb").get<double>());
  }
  MESSAGE(app, ": RSS after warm-up between ", lo, " and ", hi, " MiB over steps 420..2000");
  CHECK(lo > 1.0);  // a real reading, not a zero from a failed /proc read
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer freed memory waits in its quarantine (256 MB) before reuse, so RSS
  // climbs by design; in that build leaks are LeakSanitizer's to find (make test-sanitize).
  MESSAGE("AddressSanitizer build: the flat-RSS bound is checked in the normal build only");
#else
  CHECK(hi - lo <= 1.0);
#endif
}

// ---- determinism across thread counts --------------------------------------------------------

// --deterministic: the same run at 1 and at 2 threads ends in the same checkpoint, bit for bit
// (parameters, AdamW moments, RNG state), and logs the same training losses.
void deterministic_threads(const std::string& app) {
  constexpr int64_t N = 30, every = 10;
  Apps apps("det_" + app);
  run_app(apps.command(app, "one", N, every, 1, {"--deterministic"}), apps.logs(), "one");
  run_app(apps.command(app, "two", N, every, 2, {"--deterministic"}), apps.logs(), "two");
  check_checkpoints(apps.checkpoint("one"), apps.checkpoint("two"));
  std::vector<nlohmann::json> a = read_metrics(apps.tmp.file("one") + "/metrics.jsonl", "train"),
                              b = read_metrics(apps.tmp.file("two") + "/metrics.jsonl", "train");
  REQUIRE(a.size() == size_t(N / every));
  REQUIRE(b.size() == a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("metrics line " << i);
    CHECK(a[i].at("train_loss").dump() == b[i].at("train_loss").dump());
  }
}

// ---- --eval-only --------------------------------------------------------------------------------

// The number after `label` in `text` ("test accuracy 93.75%" -> 93.75), NaN when absent.
double number_after(const std::string& text, const std::string& label) {
  const size_t at = text.find(label);
  if (at == std::string::npos) return std::nan("");
  return std::strtod(text.c_str() + at + label.size(), nullptr);
}

// A finished run's checkpoint evaluated with --eval-only (the same command plus --eval-only
// --checkpoint FILE) gives the numbers the run reported at its end: the model, its configuration
// and its tokenizer all came back from the file.
void eval_only_matches_run(const std::string& app) {
  Apps apps("evalonly_" + app);
  run_app(apps.command(app, "run", 40, 20, 2), apps.logs(), "train");
  const auto report = nlohmann::json::parse(read_bytes(apps.tmp.file("run") + "/report.json"));
  Child e = run_app(apps.command(app, "run", 40, 20, 2, {"--eval-only", "--checkpoint", apps.checkpoint("run")}),
                    apps.logs(), "eval");
  const std::string out = e.out();
  INFO("--eval-only output:\n" << out);
  CHECK(out.find(apps.checkpoint("run")) != std::string::npos);
  if (app != "vit") {  // the vocabulary is also next to the model, the same as in the checkpoint
    const std::string saved = read_bytes(apps.tmp.file("run") + "/tokenizer.json");
    CHECK(nlohmann::json::parse(saved) ==
          nlohmann::json::parse(read_checkpoint_info(apps.checkpoint("run")).extra.at("tokenizer")));
  }
  if (app == "gpt") {
    CHECK(number_after(out, "validation loss ") == doctest::Approx(report.at("val_loss").get<double>()).epsilon(1e-3));
  } else {
    CHECK(number_after(out, "test accuracy ") == doctest::Approx(100 * report.at("accuracy").get<double>()).epsilon(1e-4));
    CHECK(number_after(out, app == "vit" ? "test loss " : "loss ") ==
          doctest::Approx(report.at("test_loss").get<double>()).epsilon(1e-3));
  }
}

// --eval-only builds the model and its data from the checkpoint: an option of theirs given with
// another value than the checkpoint's is refused (exit 2, one line naming both values), not
// silently ignored. `name value`: a changed option (gpt's --pos rope: a choice the checkpoint
// leaves out at its default).
void eval_only_refuses_other_model(const std::string& app, const std::string& name, const std::string& value,
                                   const std::string& saved) {
  Apps apps("evalonly_refuse_" + app);
  run_app(apps.command(app, "run", 4, 4, 1), apps.logs(), "train");
  const std::vector<std::string> eval =
      apps.command(app, "run", 4, 4, 1, {"--eval-only", "--checkpoint", apps.checkpoint("run")});
  Child e = run_app(with_option(eval, name, value), apps.logs(), "eval", ag::apps::kExitUsage);
  CHECK(e.out().empty());
  CHECK(e.err() == fmt::format("{}: {} {}: --eval-only evaluates the model as '{}' saved it, with {} {}; drop the "
                               "option, or train a model with it ({} --help lists every option)\n",
                               app, name, value, apps.checkpoint("run"), name, saved, app));
}

}  // namespace

TEST_CASE("reliability: vit: --deterministic gives the same checkpoint at 1 and 2 threads") {
  deterministic_threads("vit");
}
TEST_CASE("reliability: gpt: --deterministic gives the same checkpoint at 1 and 2 threads") {
  deterministic_threads("gpt");
}
TEST_CASE("reliability: textclf: --deterministic gives the same checkpoint at 1 and 2 threads") {
  deterministic_threads("textclf");
}

TEST_CASE("reliability: vit: --eval-only on the checkpoint reports the run's final test accuracy and loss") {
  eval_only_matches_run("vit");
}
TEST_CASE("reliability: gpt: --eval-only on the checkpoint reports the run's final validation loss") {
  eval_only_matches_run("gpt");
}
TEST_CASE("reliability: textclf: --eval-only on the checkpoint reports the run's final test accuracy and loss") {
  eval_only_matches_run("textclf");
}

TEST_CASE("reliability: vit: --eval-only refuses a model option that differs from the checkpoint's") {
  eval_only_refuses_other_model("vit", "--d-model", "32", "16");
}
TEST_CASE("reliability: gpt: --eval-only refuses a model option that differs from the checkpoint's") {
  eval_only_refuses_other_model("gpt", "--pos", "rope", "learned");
}
TEST_CASE("reliability: textclf: --eval-only refuses a model option that differs from the checkpoint's") {
  eval_only_refuses_other_model("textclf", "--ngrams", "3-5", "2-6");
}

TEST_CASE("reliability: vit: SIGINT saves after the step, exits 0 with the resume command, then --resume finishes") {
  interrupt_and_resume("vit", SIGINT, 3000);
}
TEST_CASE("reliability: gpt: SIGTERM saves after the step, exits 0 with the resume command, then --resume finishes") {
  interrupt_and_resume("gpt", SIGTERM, 2000);
}
TEST_CASE("reliability: textclf: SIGINT saves after the step, exits 0 with the resume command, then --resume finishes") {
  interrupt_and_resume("textclf", SIGINT, 2000);
}

TEST_CASE("reliability: vit: --stop-at then --resume equals a straight run, bit for bit") {
  resume_equivalence("vit");
}
TEST_CASE("reliability: gpt: --stop-at then --resume equals a straight run, bit for bit") {
  resume_equivalence("gpt");
}
TEST_CASE("reliability: textclf: --stop-at then --resume equals a straight run, bit for bit") {
  resume_equivalence("textclf");
}

// ---- --resume with other settings -----------------------------------------------------------------

// A checkpoint resumes only under the settings it was trained with: --resume with another batch
// (the global batch fixes which samples each step sees) is a usage error (exit 2) naming the
// config, and leaves the checkpoint as it was.
void resume_refuses_other_batch(const std::string& app) {
  Apps apps("rebatch_" + app);
  run_app(apps.command(app, "run", 4, 2, 1, {}, 0.0, 4), apps.logs(), "train");
  const std::string before = read_bytes(apps.checkpoint("run"));
  Child c = run_app(apps.command(app, "run", 4, 2, 1, {"--resume"}, 0.0, 8), apps.logs(), "resume", 2);
  INFO(app << " output:\n" << c.output());
  CHECK(c.err().find("--resume") != std::string::npos);
  CHECK(c.err().find("was trained with the config") != std::string::npos);
  CHECK(c.err().find("\"batch\":4") != std::string::npos);
  CHECK(c.err().find("\"batch\":8") != std::string::npos);
  CHECK(read_bytes(apps.checkpoint("run")) == before);
}

// The learning rate is a function of the step and the schedule options: --resume with another
// --steps, --lr, --min-lr, --warmup or --schedule would bend the schedule halfway. Each is a usage
// error (exit 2) naming the option with the checkpoint's value and the asked one, and the
// checkpoint stays as it was.
void resume_refuses_other_schedule(const std::string& app) {
  Apps apps("reschedule_" + app);
  const std::vector<std::string> cmd = apps.command(app, "run", 4, 2, 1, {}, 0.0);
  run_app(cmd, apps.logs(), "train");
  const std::string before = read_bytes(apps.checkpoint("run"));
  struct Change {
    std::string option, value, saved;  // saved: "" where the app's default is not spelled here
  };
  for (const Change& ch : {Change{"--steps", "8", "4"}, Change{"--lr", "0.0123", ""}, Change{"--min-lr", "1e-06", app == "gpt" ? "0.0001" : "0"},
                           Change{"--warmup", "0.5", ""}, Change{"--schedule", "constant", "cosine"}}) {
    INFO(app << " " << ch.option << " " << ch.value);
    Child c = run_app(with_option(with_option(cmd, ch.option, ch.value), "--resume"), apps.logs(),
                      "resume" + ch.option, 2);
    INFO("output:\n" << c.output());
    CHECK(c.err().find(app + ": --resume: ") != std::string::npos);
    CHECK(c.err().find("this run asks for " + ch.option + " " + ch.value) != std::string::npos);
    if (!ch.saved.empty())
      CHECK(c.err().find("a run with " + ch.option + " " + ch.saved + " ") != std::string::npos);
    CHECK(read_bytes(apps.checkpoint("run")) == before);
  }
}

// A checkpoint names the app that wrote it: another app refuses it (exit 2) naming both, before
// it reads the config whose entries it would not find.
void refuses_checkpoint_of(const std::string& app, const std::string& writer) {
  Apps apps("foreign_" + app);
  run_app(apps.command(writer, "theirs", 2, 2, 1, {}, 0.0), apps.logs(), "writer");
  for (const std::string mode : {"--eval-only", "--resume"}) {
    INFO(app << " " << mode << " on a checkpoint of " << writer);
    std::vector<std::string> cmd = apps.command(app, "mine", 2, 2, 1, {}, 0.0);
    if (mode == "--eval-only")
      cmd = with_option(with_option(cmd, "--eval-only"), "--checkpoint", apps.checkpoint("theirs"));
    else  // the other app's run directory
      cmd = with_option(with_option(cmd, "--out", apps.tmp.file("theirs")), "--resume");
    Child c = run_app(cmd, apps.logs(), "refused" + mode, 2);
    INFO("output:\n" << c.output());
    CHECK(c.err().find(fmt::format("is a checkpoint of {}, not of {}", writer, app)) != std::string::npos);
  }
}

TEST_CASE("reliability: vit: SIGKILL after a save: --resume evaluates the saved step first and ends as a straight run") {
  kill_and_resume("vit");
}
TEST_CASE("reliability: gpt: SIGKILL after a save: --resume evaluates the saved step first and ends as a straight run") {
  kill_and_resume("gpt");
}
TEST_CASE("reliability: textclf: SIGKILL after a save: --resume evaluates the saved step first and ends as a straight run") {
  kill_and_resume("textclf");
}

TEST_CASE("reliability: vit: --resume with another --batch is refused, the checkpoint untouched") {
  resume_refuses_other_batch("vit");
}
TEST_CASE("reliability: gpt: --resume with another --batch is refused, the checkpoint untouched") {
  resume_refuses_other_batch("gpt");
}
TEST_CASE("reliability: textclf: --resume with another --batch is refused, the checkpoint untouched") {
  resume_refuses_other_batch("textclf");
}

TEST_CASE("reliability: vit: --resume with other schedule options is a usage error naming the option") {
  resume_refuses_other_schedule("vit");
}
TEST_CASE("reliability: gpt: --resume with other schedule options is a usage error naming the option") {
  resume_refuses_other_schedule("gpt");
}
TEST_CASE("reliability: textclf: --resume with other schedule options is a usage error naming the option") {
  resume_refuses_other_schedule("textclf");
}
TEST_CASE("reliability: imagetext: --resume with other schedule options is a usage error naming the option") {
  resume_refuses_other_schedule("imagetext");
}

TEST_CASE("reliability: another app's checkpoint is refused, naming the app that wrote it") {
  refuses_checkpoint_of("vit", "gpt");
  refuses_checkpoint_of("gpt", "textclf");
  refuses_checkpoint_of("textclf", "imagetext");
  refuses_checkpoint_of("imagetext", "vit");
}

TEST_CASE("reliability: vit: RSS stays flat over 2000 steps") { flat_rss("vit"); }
TEST_CASE("reliability: gpt: RSS stays flat over 2000 steps") { flat_rss("gpt"); }
TEST_CASE("reliability: textclf: RSS stays flat over 2000 steps") { flat_rss("textclf"); }

TEST_CASE("reliability: every app exits 2 naming the Debian package when its data is missing") {
  TempDir tmp("missing_data");
  const std::string empty = tmp.file("empty");
  fs::create_directories(empty);
  const std::string dir = ATTOGRAD_APP_DIR;
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> expected;  // fragments of the message
  };
  std::vector<Case> cases = {
      {{dir + "/vit", "--data-dir", empty}, {"vit:", "fashion-mnist", "dataset-fashion-mnist", "apt"}},
            // no Debian package holds these two: the hint is where to download them
      {{dir + "/vit", "--dataset", "mnist", "--data-dir", empty}, {"vit:", "mnist", "not found", "download"}},
      {{dir + "/vit", "--dataset", "cifar10", "--patch", "4", "--data-dir", empty}, {"vit:", "cifar10", "test_batch.bin", "download"}},
      {{dir + "/textclf", "--data-dir", empty}, {"textclf:", "fortunes", "apt-get install"}},
      {{dir + "/gpt", "--dataset", "fortunes", "--data-dir", empty}, {"gpt:", "fortunes", "apt-get install fortunes"}},
  };
  // gpt's Bible is found through /usr/bin/bible when bible-kjv is installed, whatever --data-dir
  if (!fs::exists("/usr/bin/bible"))
    cases.push_back({{dir + "/gpt", "--data-dir", empty}, {"gpt:", "bible-kjv", "apt-get install bible-kjv"}});
  int n = 0;
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"--out", tmp.file("run")});
    Child child = run_app(args, tmp.dir.string(), "app" + std::to_string(n++), apps::kExitNoData);
    const std::string err = child.err();
    INFO("stderr: " << err);
    CHECK(child.out().empty());
    // one line: the error with its hint (textclf puts the apt-get line on a second, indented one)
    const auto lines = std::count(err.begin(), err.end(), '\n');
    CHECK(lines >= 1);
    CHECK(lines <= (c.args[0].ends_with("textclf") ? 2 : 1));
    for (const auto& frag : c.expected) CHECK(err.find(frag) != std::string::npos);
    CHECK_FALSE(fs::exists(tmp.file("run")));  // refused before any work: no run directory
  }
}
