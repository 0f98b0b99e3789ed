// Data parallelism (dist/dist.h). The process-level checks run tests/dist/dist_check.cpp under
// `mpirun -np 2 --oversubscribe` (and alone) and compare what rank 0 wrote:
//   equivalence   2 ranks with batch B each == 1 rank with batch 2B, losses and parameters
//   checkpoints   a 2-rank run's checkpoint resumes in a 1-rank run and the other way round
//   failure       a rank that dies or hangs makes the job exit with an error, not hang
//   on GPUs       the equivalence with each rank on its own GPU (NCCL), where 2 GPUs are visible
// They are reported as skipped in a build without MPI (the GPU cases also without NCCL or GPUs).
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/loader.h"
#include "dist/dist.h"
#include "tests/dist/mpi_job.h"
#include "tests/helpers.h"
#include "tests/spawn.h"

using namespace ag;
using namespace ag::test;
namespace fs = std::filesystem;

namespace {

// What dist_check wrote: the world size, the global loss of each step, every parameter value.
struct Result {
  int world = 0;
  std::vector<double> losses, params;
};
Result read_result(const std::string& path) {
  std::ifstream f(path);
  REQUIRE_MESSAGE(f.good(), "dist_check wrote no ", path);
  Result r;
  std::string word;
  int64_t buckets = 0;
  f >> word >> r.world >> word >> buckets;
  std::string line;
  std::getline(f, line);
  while (std::getline(f, line)) {
    std::istringstream in(line);
    if (line.rfind("loss ", 0) == 0) {
      in >> word;
      double v;
      in >> v;
      r.losses.push_back(v);
    } else {
      double v;
      in >> v;
      r.params.push_back(v);
    }
  }
  return r;
}

// dist_check with `args`: alone, or inside Job::mpirun.
std::vector<std::string> dist_check(std::vector<std::string> args) {
  args.insert(args.begin(), ATTOGRAD_APP_DIR "/dist_check");
  return args;
}

}  // namespace

TEST_CASE("dist: data::shard splits a global batch into contiguous ranges that differ by at most one") {
  CHECK(data::shard(16, 0, 2).begin == 0);
  CHECK(data::shard(16, 0, 2).end == 8);
  CHECK(data::shard(16, 1, 2).begin == 8);
  CHECK(data::shard(16, 1, 2).end == 16);
  // 10 over 4 ranks: 3 3 2 2
  std::vector<int64_t> sizes;
  int64_t next = 0;
  for (int r = 0; r < 4; ++r) {
    data::Range g = data::shard(10, r, 4);
    CHECK(g.begin == next);
    next = g.end;
    sizes.push_back(g.size());
  }
  CHECK(next == 10);
  CHECK(sizes == std::vector<int64_t>{3, 3, 2, 2});
  CHECK_THROWS_WITH_AS(data::shard(10, 2, 2), doctest::Contains("shard: part 2 of 2"), Error);
}

TEST_CASE("dist: without mpirun this process is a job of one and every collective is a no-op") {
  dist::init();
  CHECK(dist::rank() == 0);
  CHECK(dist::world_size() == 1);
  CHECK(dist::is_main());
  Tensor w = full({3}, 2.0).set_requires_grad(true);
  dist::broadcast({w});
  CHECK(w.to_vector<float>() == std::vector<float>{2, 2, 2});
  std::vector<double> v{1.5, -2};
  dist::all_reduce_sum(v);
  CHECK(v == std::vector<double>{1.5, -2});
  CHECK(dist::all_gather(42) == std::vector<int64_t>{42});
  dist::GradReducer reducer({w});
  sum(mul(w, w)).backward();
  reducer.finish();  // one rank: the gradient is left as backward made it
  CHECK(w.grad().to_vector<float>() == std::vector<float>{4, 4, 4});
  CHECK(reducer.num_buckets() == 1);
}

TEST_CASE("dist: a job of one takes CUDA parameters, and the reducer leaves their gradients as they are") {
  if (skip_without_gpu()) return;
  dist::init();
  REQUIRE(dist::world_size() == 1);
  CHECK(dist::rank_gpu() == Device::cuda(0));  // local rank 0
  Tensor w = full({3}, 2.0, DType::f32, Device::cuda()).set_requires_grad(true);
  dist::broadcast({w});
  dist::GradReducer reducer({w});
  sum(mul(w, w)).backward();
  reducer.finish();
  CHECK(w.grad().device() == Device::cuda());
  CHECK(w.grad().to_vector<float>() == std::vector<float>{4, 4, 4});
  // one device per reducer: the CPU's parameters or the GPU's, not both
  Tensor c = zeros({2}).set_requires_grad(true);
  CHECK_THROWS_WITH_AS(dist::GradReducer({w, c}), doctest::Contains("parameter 1 is on cpu but parameter 0 on cuda:0"),
                       Error);
}

TEST_CASE("dist: GradReducer refuses parameters it cannot reduce") {
  Tensor no_grad = zeros({2});
  CHECK_THROWS_WITH_AS(dist::GradReducer({no_grad}), doctest::Contains("parameter 0 does not require grad"), Error);
  Tensor w = zeros({2}).set_requires_grad(true);
  CHECK_THROWS_WITH_AS(dist::GradReducer({w, w}), doctest::Contains("parameter 1 is listed twice"), Error);
  CHECK_THROWS_WITH_AS(dist::GradReducer({w}, 0), doctest::Contains("bucket size must be > 0"), Error);
}

namespace {
// 6 steps of dist_check on 1 rank with batch 16 and on 2 ranks with batch 8 each (`extra`: options
// of both runs). The same global batches; only the order of float additions differs (two half-batch
// means averaged vs one mean; on GPUs cuBLAS may also tile the half batch differently), so float
// tolerance, not bits. dist_check itself exits 3 when the ranks' parameters differ in a bit, and 4
// when no bucket started its all-reduce during backward.
void check_two_ranks_train_as_one(const std::string& name, const std::vector<std::string>& extra) {
  Job job(name);
  auto args = [&](const std::string& out, const std::string& batch) {
    std::vector<std::string> a{"train", job.path(out), "--steps", "6", "--batch", batch};
    a.insert(a.end(), extra.begin(), extra.end());
    return dist_check(a);
  };
  job.run(args("one.txt", "16"), "one");
  job.run(job.mpirun(2, args("two.txt", "8")), "two");
  Result one = read_result(job.path("one.txt")), two = read_result(job.path("two.txt"));
  CHECK(one.world == 1);
  CHECK(two.world == 2);
  check_close(two.losses, one.losses, 1e-6, 1e-5, "losses");
  check_close(two.params, one.params, 1e-6, 1e-4, "parameters");
  // and the training did something: the loss went down over the 6 steps
  CHECK(one.losses.back() < one.losses.front());
}
}  // namespace

TEST_CASE("dist: 2 ranks with batch B each train as 1 rank with batch 2B") {
  if (skip_without_mpi()) return;
  check_two_ranks_train_as_one("eq", {});
}

TEST_CASE("dist: 2 ranks on 2 GPUs (NCCL) with batch B each train as 1 GPU with batch 2B") {
  if (skip_without_nccl_gpus(2)) return;
  check_two_ranks_train_as_one("gpu_eq", {"--device", "cuda"});
}

TEST_CASE("dist: a 2-rank checkpoint resumes in 1 rank and a 1-rank checkpoint in 2 ranks") {
  if (skip_without_mpi()) return;
  Job job("ckpt");
  job.run(dist_check({"train", job.path("straight.txt"), "--steps", "6", "--batch", "16"}), "straight");
  // 3 steps on 2 ranks, then 3 on 1 rank with the same global batch
  job.run(job.mpirun(2, dist_check({"train", job.path("a1.txt"), "--steps", "3", "--batch", "8", "--save", job.path("a.ckpt")})),
          "a1");
  job.run(dist_check({"train", job.path("a2.txt"), "--steps", "3", "--batch", "16", "--load", job.path("a.ckpt")}),
          "a2");
  // and the other way
  job.run(dist_check({"train", job.path("b1.txt"), "--steps", "3", "--batch", "16", "--save", job.path("b.ckpt")}),
          "b1");
  job.run(job.mpirun(2, dist_check({"train", job.path("b2.txt"), "--steps", "3", "--batch", "8", "--load", job.path("b.ckpt")})),
          "b2");
  Result straight = read_result(job.path("straight.txt"));
  for (const char* f : {"a2.txt", "b2.txt"}) {
    Result resumed = read_result(job.path(f));
    check_close(resumed.params, straight.params, 1e-6, 1e-4, f);
    std::vector<double> tail(straight.losses.begin() + 3, straight.losses.end());
    check_close(resumed.losses, tail, 1e-6, 1e-5, f);
  }
}

TEST_CASE("dist: a rank that dies makes the others exit with an error") {
  if (skip_without_mpi()) return;
  Job job("die");
  Child c = spawn_app(job.mpirun(2, dist_check({"die"})), job.dir.dir.string(), "die", job.env);
  const int rc = wait_exit(c, 120);
  INFO("output:\n" << c.output());
  CHECK(rc != -1);  // not hung (wait_exit gives -1 after its deadline)
  CHECK(rc != 0);
}

TEST_CASE("dist: a rank that hangs makes the others stop at the timeout with a message") {
  if (skip_without_mpi()) return;
  Job job("hang");
  job.env.push_back("ATTOGRAD_DIST_TIMEOUT=2");
  Child c = spawn_app(job.mpirun(2, dist_check({"hang"})), job.dir.dir.string(), "hang", job.env);
  const int rc = wait_exit(c, 120);
  INFO("output:\n" << c.output());
  CHECK(rc != -1);
  CHECK(rc != 0);
  CHECK(c.output().find("rank 0 of 2 waited") != std::string::npos);
  CHECK(c.output().find("ATTOGRAD_DIST_TIMEOUT=2") != std::string::npos);
}
