// The apps trained data-parallel: the real vit, textclf, gpt and imagetext binaries at the tiny size of
// tests/apps/tiny_apps.h under `mpirun -np 2 --oversubscribe`, against the same app alone:
//
//   equivalence   2 ranks with --batch B == 1 process with --batch 2B, 6 steps: the final
//                 checkpoints (parameters and AdamW moments, read with the safetensors loader) and
//                 every logged loss (train and evaluation, each step) agree to float tolerance
//   resume        2 ranks stop at step 2, 1 process resumes to step 4, 2 ranks resume to step 6:
//                 the same checkpoint as the straight 1-process run
//   one output    the 2-rank job prints its header once (rank 0), naming the global batch, and
//                 trained on as many samples as the one process (each rank on its half)
//   one stop      SIGTERM to rank 1 alone: both ranks stop after the same step, rank 0 saves,
//                 reports the stop and how to resume, and the job exits 0
//   GPU options   --device cuda:N under mpirun is refused (each rank takes its local rank's GPU),
//                 --device cuda without NCCL names ATTOGRAD_NCCL, and with fewer GPUs than ranks
//                 says each rank needs one (usage errors, before any data is read)
//
// Dropout is 0: each rank draws its dropout masks from the same stream, so with dropout the two
// runs differ (docs/distributed.md). vit's crop and flip augmentation stays on: its draws follow the
// image's place in the global batch, so they agree. Reported as skipped in a build without MPI.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/common/run.h"
#include "core/serialize.h"
#include "tests/apps/tiny_apps.h"
#include "tests/dist/mpi_job.h"
#include "tests/helpers.h"
#include "tests/spawn.h"

using namespace ag;
using namespace ag::test;

namespace {

// The cases above for one app; `B` is the per-rank batch.
void trains_as_one_process(const std::string& app, int64_t B) {
  Apps apps("apps_" + app);  // the data (Job has its own folder for the mpirun sessions)
  Job job(app);
  constexpr int64_t N = 6;
  auto cmd = [&](const std::string& out, int64_t batch, std::vector<std::string> more = {}) {
    return apps.command(app, out, N, 1, 1, std::move(more), 0.0, batch);
  };
  job.run(cmd("one", 2 * B), "one");
  const Child two = job.run(Job::mpirun(2, cmd("two", B)), "two");

  // one header, from rank 0, with the global batch
  const std::string err = two.err();
  INFO("2-rank output:\n" << two.output());
  CHECK(err.find(fmt::format("x 2 ranks (global batch {} = 2 x --batch {})", 2 * B, B)) != std::string::npos);
  CHECK(err.find("parameters,") == err.rfind("parameters,"));

  // The same global batches; only the order of float additions differs (two half-batch means
  // averaged vs one mean), so float tolerance, not bits.
  check_checkpoints(apps.checkpoint("two"), apps.checkpoint("one"), 1e-5, 1e-4);
  check_close_losses(apps.tmp.file("two") + "/metrics.jsonl", apps.tmp.file("one") + "/metrics.jsonl", 1e-6, 1e-5);
  // the ranks split the work: the job trained on as many samples as the one process, not twice as many
  auto report = [&](const std::string& out) { return nlohmann::json::parse(read_bytes(apps.tmp.file(out) + "/report.json")); };
  CHECK(report("two").at("samples") == report("one").at("samples"));
  CHECK(report("two").at("samples").get<double>() == double(N * 2 * B));
  if (app == "textclf") {
    // the per-text predictions come back from both ranks' halves of the test set: test_errors.tsv
    // lists exactly the errors of the confusion matrix (a text no rank evaluated would be refused)
    const nlohmann::json cm = report("two").at("confusion").at("counts");
    int64_t wrong = 0;
    for (size_t r = 0; r < cm.size(); ++r)
      for (size_t c = 0; c < cm[r].size(); ++c) wrong += r == c ? 0 : cm[r][c].get<int64_t>();
    std::istringstream tsv(read_bytes(apps.tmp.file("two") + "/test_errors.tsv"));
    int64_t rows = 0;
    for (std::string line; std::getline(tsv, line);) rows += 1;
    CHECK(rows == 1 + wrong);  // the header, then one row per error (the baseline is off)
  }
  // and the training did something (or the comparison would be empty of meaning)
  const std::vector<nlohmann::json> m = read_metrics(apps.tmp.file("one") + "/metrics.jsonl", "train");
  CHECK(m.back().at("train_loss").get<double>() < m.front().at("train_loss").get<double>());

  // 2 ranks -> 1 process -> 2 ranks, in one run directory, the global batch 2B throughout
  job.run(Job::mpirun(2, cmd("hop", B, {"--stop-at", "2"})), "hop1");
  const Child mid = job.run(cmd("hop", 2 * B, {"--stop-at", "4", "--resume"}), "hop2");
  CHECK(mid.output().find(fmt::format("resumed from {} at step 2", apps.checkpoint("hop"))) != std::string::npos);
  const Child last = job.run(Job::mpirun(2, cmd("hop", B, {"--resume"})), "hop3");
  CHECK(last.output().find(fmt::format("resumed from {} at step 4", apps.checkpoint("hop"))) != std::string::npos);
  check_checkpoints(apps.checkpoint("hop"), apps.checkpoint("one"), 1e-5, 1e-4);
  check_close_losses(apps.tmp.file("hop") + "/metrics.jsonl", apps.tmp.file("one") + "/metrics.jsonl", 1e-6, 1e-5);
}

// The pid of rank `rank` of the job mpirun `launcher` started (its child whose environment has
// OMPI_COMM_WORLD_RANK=rank), or -1 while there is none.
pid_t rank_pid(pid_t launcher, int rank) {
  const std::string want = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line) || line.rfind(')') == std::string::npos) continue;
    // pid (comm) state ppid ...: the comm may hold spaces, so read after its closing parenthesis
    std::istringstream rest(line.substr(line.rfind(')') + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != launcher) continue;
    std::ifstream env(entry.path() / "environ", std::ios::binary);
    for (std::string var; std::getline(env, var, '\0');)
      if (var == want) return pid_t(std::stoi(name));
  }
  return -1;
}

}  // namespace

TEST_CASE("dist apps: vit on 2 ranks with batch B trains as 1 process with 2B, and resumes across world sizes") {
  if (skip_without_mpi()) return;
  trains_as_one_process("vit", 8);
}
TEST_CASE("dist apps: textclf on 2 ranks with batch B trains as 1 process with 2B, and resumes across world sizes") {
  if (skip_without_mpi()) return;
  trains_as_one_process("textclf", 8);
}
TEST_CASE("dist apps: gpt on 2 ranks with batch B trains as 1 process with 2B, and resumes across world sizes") {
  if (skip_without_mpi()) return;
  trains_as_one_process("gpt", 4);
}
TEST_CASE("dist apps: imagetext on 2 ranks with batch B trains as 1 process with 2B, and resumes across world sizes") {
  if (skip_without_mpi()) return;
  trains_as_one_process("imagetext", 8);
}

TEST_CASE("dist apps: SIGTERM to one rank stops both after the same step, rank 0 saves and tells how to resume") {
  if (skip_without_mpi()) return;
  Apps apps("apps_stop");
  Job job("stop");
  constexpr int64_t steps = 2000;
  const std::string metrics = apps.tmp.file("run") + "/metrics.jsonl";
  Child c = spawn_app(Job::mpirun(2, apps.command("gpt", "run", steps, 20, 1, {}, 0.0, 4)), apps.logs(), "job", job.env);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (count_lines(metrics) < 4 && std::chrono::steady_clock::now() < deadline && ::waitpid(c.pid, nullptr, WNOHANG) == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const pid_t rank1 = rank_pid(c.pid, 1);
  REQUIRE(rank1 > 0);
  REQUIRE(::kill(rank1, SIGTERM) == 0);
  const int rc = wait_exit(c);
  INFO("output:\n" << c.output());
  REQUIRE(rc == 0);
  const int64_t step = apps::read_checkpoint_info(apps.checkpoint("run")).step;
  CHECK(step >= 40);
  CHECK(step < steps);
  const auto report = nlohmann::json::parse(read_bytes(apps.tmp.file("run") + "/report.json"));
  CHECK(report.at("interrupted") == true);
  CHECK(report.at("steps") == step);
  // rank 0 did not see the signal itself: the stop, and its cause, came through reduce_step
  CHECK(c.output().find(fmt::format("stopped after step {} of {} (SIGTERM)", step, steps)) != std::string::npos);
  CHECK(c.output().find("mpirun -np 2 " + std::string(ATTOGRAD_APP_DIR) + "/gpt") != std::string::npos);
}

TEST_CASE("dist apps: under mpirun --device cuda:N is refused, and --device cuda needs NCCL and a GPU per rank") {
  if (skip_without_mpi()) return;
  if (!ATTOGRAD_WITH_CUDA) {
    MESSAGE("[skipped: no CUDA backend in this build (--device cuda is refused before mpirun matters)]");
    return;
  }
  Job job("gpu_options");
  // a usage error on both ranks (exit 2), printed by rank 0, before any data is read
  auto refused = [&](const std::string& device, const std::string& expected) {
    Child c = spawn_app(Job::mpirun(2, {std::string(ATTOGRAD_APP_DIR) + "/gpt", "--steps", "1", "--quiet", "--out",
                                        job.path("run"), "--device", device}),
                        job.dir.dir.string(), "device_" + device, job.env);
    const int rc = wait_exit(c, 120);
    const std::string output = c.output();
    INFO("--device " << device << ", output:\n" << output);
    CHECK(rc != -1);
    CHECK(rc != 0);
    CHECK(output.find(expected) != std::string::npos);
    CHECK(output.find("gpt --help lists every option") != std::string::npos);
  };
  refused("cuda:1",
          "--device cuda:1: under mpirun (2 ranks) use --device cuda, each rank takes the GPU of its local rank");
  if (!dist::nccl_available())
    refused("cuda", "this build has no NCCL, which data-parallel training on GPUs needs (configure with "
                    "-DATTOGRAD_NCCL=ON");
  else if (cuda::device_count() < 2)
    refused("cuda", "--device cuda: 2 ranks on this host, but ");
  // (with NCCL and 2 GPUs --device cuda trains: tests/dist/test_dist.cpp's GPU equivalence)
}
