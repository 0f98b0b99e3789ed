// dist_check: the program tests/dist/test_dist.cpp starts under mpirun (and alone) to check data
// parallelism end to end. Not part of the doctest binary: each rank is its own process.
//
//   dist_check train OUT [--steps K] [--batch B] [--bucket-bytes N] [--load FILE] [--save FILE]
//                        [--device cpu|cuda]
//       Trains a small MLP classifier on a fixed synthetic data set with AdamW for K steps. Each
//       step the global batch (world x B samples, drawn the same way on every rank) is split into
//       the ranks' slices. Every rank starts from weights seeded by its rank, so the broadcast from
//       rank 0 is what makes them agree. Rank 0 writes OUT: the loss of each step, then every
//       parameter value, one number a line, in full precision. Exits 3 when the ranks' parameters
//       differ after training, 4 when no bucket started its all-reduce during backward (no overlap).
//       --save/--load: a checkpoint (model + optimizer) written by rank 0 / read by every rank.
//       --device cuda: the model on this rank's GPU (dist::rank_gpu()): broadcast and all-reduce by NCCL.
//   dist_check die      rank 1 exits abruptly (exit code 7) in the middle of training
//   dist_check hang     rank 1 stops answering (sleeps) in the middle of training
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>

#include "attograd.h"
#include "core/parallel.h"
#include "data/loader.h"
#include "dist/dist.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "training/checkpoint.h"

using namespace ag;

namespace {

struct Model : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2, fc3;
  explicit Model(Generator* gen) {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(8, 64, true, DType::f32, gen));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(64, 64, true, DType::f32, gen));
    fc3 = register_module("fc3", std::make_shared<nn::Linear>(64, 4, true, DType::f32, gen));
  }
  Tensor forward(const Tensor& x) { return fc3->forward(relu(fc2->forward(relu(fc1->forward(x))))); }
};

int usage() {
  std::fprintf(stderr, "usage: dist_check train OUT [--steps K] [--batch B] [--bucket-bytes N] "
                       "[--load FILE] [--save FILE] [--device cpu|cuda] | die | hang\n");
  return 2;
}

int run(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string mode = argv[1];
  std::string out, load, save, device = "cpu";
  int64_t steps = 6, batch = 16;
  size_t bucket_bytes = 4096;  // small: several buckets for this model
  int arg = 2;
  if (mode == "train") {
    if (argc < 3) return usage();
    out = argv[2];
    arg = 3;
  } else if (mode != "die" && mode != "hang") {
    return usage();
  }
  for (; arg + 1 < argc; arg += 2) {
    const std::string k = argv[arg], v = argv[arg + 1];
    if (k == "--steps") steps = std::stoll(v);
    else if (k == "--batch") batch = std::stoll(v);
    else if (k == "--bucket-bytes") bucket_bytes = std::stoull(v);
    else if (k == "--load") load = v;
    else if (k == "--save") save = v;
    else if (k == "--device" && (v == "cpu" || v == "cuda")) device = v;
    else return usage();
  }
  if (arg != argc) return usage();

  dist::init();
  const int rank = dist::rank(), world = dist::world_size();
  set_num_threads(1);

  Generator init_gen(100 + rank);  // different weights on each rank until the broadcast
  Model model(&init_gen);
  const Device dev = device == "cuda" ? dist::rank_gpu() : Device::cpu();
  model.to(dev);
  dist::broadcast(model.parameters());
  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.01});
  int64_t start = 0;
  if (!load.empty()) {
    start = training::load_checkpoint(load, model, &opt, nullptr).step;
  }
  dist::GradReducer reducer(model.parameters(), bucket_bytes);

  // A fixed data set: 4 classes, label = argmax of a fixed linear map of x.
  Generator data_gen(7);
  const int64_t n_data = 4096;
  Tensor X = randn({n_data, 8}, DType::f32, &data_gen);
  Tensor W = randn({8, 4}, DType::f32, &data_gen);
  Tensor Y = argmax(matmul(X, W), 1);

  std::vector<double> losses;
  for (int64_t step = start; step < start + steps; ++step) {
    if (mode == "die" && step == 2 && rank == 1) std::_Exit(7);
    if (mode == "hang" && step == 2 && rank == 1) std::this_thread::sleep_for(std::chrono::hours(1));
    // The global batch of this step, the same on every rank, and this rank's slice of it.
    Generator batch_gen(1000 + step);
    Tensor idx = randint(0, n_data, {batch * world}, &batch_gen);
    data::Range mine = data::shard(batch * world, dist::rank(), dist::world_size());
    Tensor my_idx = idx.narrow(0, mine.begin, mine.size());
    Tensor loss =
        cross_entropy(model.forward(index_select(X, 0, my_idx).to(dev)), index_select(Y, 0, my_idx).to(dev));
    opt.zero_grad();
    loss.backward();
    reducer.finish();
    opt.step();
    std::vector<double> l{loss.item<double>()};
    dist::all_reduce_sum(l);  // the mean over the ranks: the global batch's loss
    losses.push_back(l[0] / world);
    if (world > 1 && mode == "train" && reducer.buckets_started_early() == 0) {
      std::fprintf(stderr, "dist_check: no bucket started during backward (of %lld)\n",
                   (long long)reducer.num_buckets());
      return 4;
    }
  }

  // Every rank must hold the same parameters: compare a hash of their bytes.
  std::vector<Tensor> params;  // on the host
  for (const Tensor& p : model.parameters()) params.push_back(p.detach().to(Device::cpu()));
  uint64_t h = 1469598103934665603ull;
  for (const Tensor& p : params) {
    const auto* b = static_cast<const unsigned char*>(p.raw_data());
    for (size_t i = 0; i < p.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  for (int64_t x : dist::all_gather(int64_t(h)))
    if (x != int64_t(h)) {
      std::fprintf(stderr, "dist_check: rank %d: parameters differ across ranks\n", rank);
      return 3;
    }
  if (!save.empty() && dist::is_main()) training::save_checkpoint(save, model, opt, start + steps, Generator(0));
  if (dist::is_main()) {
    std::FILE* f = std::fopen(out.c_str(), "w");
    if (!f) return 1;
    std::fprintf(f, "world %d buckets %lld\n", world, (long long)reducer.num_buckets());
    for (double l : losses) std::fprintf(f, "loss %.9g\n", l);
    for (const Tensor& p : params)
      for (float v : p.to_vector<float>()) std::fprintf(f, "%.9g\n", v);
    std::fclose(f);
  }
  dist::barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    if (dist::world_size() > 1) dist::abort(fmt::format("dist_check: rank {}: {}", dist::rank(), e.what()));
    std::fprintf(stderr, "dist_check: %s\n", e.what());
    return 1;
  }
}
