// The optimizer step over a transformer's parameter list, multi-tensor against per-tensor, in one
// run: AdamW over all the parameters in one optimizer (one multi-tensor kernel call per device and
// dtype: core/kernels/optim.h) beside one AdamW per parameter (one kernel call per tensor, the
// cost that kernels taking lists avoid), and clip_grad_norm over all of them. The parameter
// list is a GPT's (apps/gpt): token and position embeddings, per layer two layer norms, the fused
// qkv and output projections and the two MLP matrices with their biases, a final layer norm and the
// head: 12 tensors per layer. Small models have many small tensors, so the per-tensor cost (an
// OpenMP fork on the CPU, a kernel launch on the GPU) is what the step costs.
//
//   bench_optim [--device cpu|cuda] [--d-model 128] [--layers 4] [--vocab 73] [--context 128]
//               [--reps 50] [--json]
#include <CLI/CLI.hpp>

#include <memory>

#include "apps/common/run.h"
#include "attograd.h"
#include "bench/bench_util.h"
#include "optim/adam.h"
#include "optim/clip.h"

using namespace ag;

int main(int argc, char** argv) {
  CLI::App app{"attograd: AdamW over a GPT's parameters, multi-tensor vs one call per tensor"};
  std::string device = "cpu";
  int64_t d = 128, layers = 4, vocab = 73, context = 128;
  int reps = 50;
  bool json = false;
  app.add_option("--device", device, "cpu or cuda[:N]")->capture_default_str();
  app.add_option("--d-model", d, "model width")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--layers", layers, "transformer blocks")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--vocab", vocab, "vocabulary size")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--context", context, "positions")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed repetitions (median reported)")->capture_default_str()->check(
      CLI::PositiveNumber);
  app.add_flag("--json", json, "one line of JSON instead of the table");
  if (const int rc = ag::apps::parse_command_line(app, argc, argv, "bench_optim"); rc >= 0) return rc;
  const std::optional<Device> dev = bench::parse_device("bench_optim", device);
  if (!dev) return 2;

  std::vector<Shape> shapes = {{vocab, d}, {context, d}};
  for (int64_t l = 0; l < layers; ++l)
    for (const Shape& s : std::vector<Shape>{{d}, {d}, {3 * d, d}, {3 * d}, {d, d}, {d}, {d}, {d}, {4 * d, d},
                                             {4 * d}, {d, 4 * d}, {d}})
      shapes.push_back(s);
  shapes.push_back({d}), shapes.push_back({d}), shapes.push_back({vocab, d});
  int64_t numel = 0;
  std::vector<Tensor> params;
  Generator gen(1);
  for (const Shape& s : shapes) {
    params.push_back(mul(randn(s, DType::f32, &gen), 0.02).detach().to(*dev).set_requires_grad(true));
    params.back().set_grad(randn(s, DType::f32, &gen).to(*dev));
    numel += params.back().numel();
  }
  auto sync = [&] {
    if (dev->is_cuda()) cuda::synchronize(dev->index);
  };
  const optim::AdamW::Options o{3e-4, 0.9, 0.95, 1e-8, 0.1};
  optim::AdamW joint(params, o);
  std::vector<std::unique_ptr<optim::AdamW>> alone;
  for (const Tensor& p : params) alone.push_back(std::make_unique<optim::AdamW>(std::vector<Tensor>{p}, o));

  const double t_multi = bench::median_seconds([&] { joint.step(), sync(); }, reps);
  const double t_single = bench::median_seconds([&] {
    for (auto& a : alone) a->step();
    sync();
  }, reps);
  const double t_clip = bench::median_seconds([&] { optim::clip_grad_norm(params, 1e30); }, reps);

  if (json) {
    fmt::print("{{\"device\": \"{}\", \"tensors\": {}, \"numel\": {}, \"adamw_multi_ms\": {:.4f}, "
               "\"adamw_per_tensor_ms\": {:.4f}, \"ratio\": {:.3f}, \"clip_grad_norm_ms\": {:.4f}}}\n",
               dev->str(), params.size(), numel, 1e3 * t_multi, 1e3 * t_single, t_single / t_multi, 1e3 * t_clip);
    return 0;
  }
  fmt::print("AdamW step over a GPT's parameters on {} ({} threads): {} tensors, {} elements\n", dev->str(),
             num_threads(), params.size(), numel);
  fmt::print("  multi-tensor (one optimizer)    {:8.3f} ms\n", 1e3 * t_multi);
  fmt::print("  per tensor (one per parameter)  {:8.3f} ms   per-tensor / multi = {:.2f}x\n", 1e3 * t_single,
             t_single / t_multi);
  fmt::print("  clip_grad_norm (all, no clip)   {:8.3f} ms\n", 1e3 * t_clip);
  return 0;
}
