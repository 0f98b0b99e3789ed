// bench_gpu: the GPU kernels of cuda/attention.cu and cuda/matmul.cu through the public ops, on
// cuda:0, f32: fused scaled_dot_product_attention forward, and forward + backward, at
// T = 256, 1024, 4096 (causal and not), and matmul / linear on cuBLAS. scripts/gpu-check.sh runs it
// beside PyTorch's F.scaled_dot_product_attention and torch.matmul on the same shapes and prints
// the ratios.
//
//   bench_gpu [--batch 4] [--heads 8] [--d 64] [--T 256,1024,4096] [--reps 10] [--json]
//
// Timing: each repetition ends by copying one element of the last result to the host, which waits
// for the device's stream (every kernel runs on that one stream), so a repetition's wall time is
// the device time of its kernels plus one small copy (~10 us, negligible against these sizes).
// FLOPs counted as usual for attention: 4 B H Tq Tk d for the forward (QK^T and PV), 2.5 times
// that for the backward (5 products); halved with the causal mask. Ours recomputes S and dP in
// both backward passes, so the work it does is larger than the count.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "attograd.h"
#include "bench/bench_util.h"
#include "cuda/memory.h"

using namespace ag;

namespace {

// Waits for everything queued on t's device: copies one element of t back.
void wait_for(const Tensor& t) {
  Tensor e = t;
  while (e.ndim() > 0) e = e.select(0, 0);
  (void)e.cpu();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attograd: fused attention and matmul on the GPU"};
  int64_t B = 4, H = 8, D = 64;
  std::vector<int64_t> Ts{256, 1024, 4096};
  int reps = 10;
  bool json = false;
  app.add_option("--batch", B, "batch")->check(CLI::PositiveNumber);
  app.add_option("--heads", H, "heads")->check(CLI::PositiveNumber);
  app.add_option("--d", D, "head size")->check(CLI::PositiveNumber);
  app.add_option("--T", Ts, "sequence lengths")->delimiter(',');
  app.add_option("--reps", reps, "timed repetitions (median reported)")->check(CLI::PositiveNumber);
  app.add_flag("--json", json, "one JSON object per line instead of the table");
  CLI11_PARSE(app, argc, argv);
  if (!cuda::available()) {
    fmt::print("[skipped: no CUDA device]\n");
    return 0;
  }
  const Device dev = Device::cuda(0);
  Generator gen(0);
  auto on_gpu = [&](const Shape& s, bool grad) {
    Tensor t = randn(s, DType::f32, &gen).to(dev).detach();
    if (grad) t.set_requires_grad(true);
    return t;
  };
  if (!json)
    fmt::print("{:<34} {:>10} {:>10} {:>9} {:>9}\n", "attention (B, H, T, d), f32", "fwd ms", "fwd+bwd ms",
               "fwd TF/s", "f+b TF/s");
  for (int64_t T : Ts) {
    const int r = T >= 4096 ? std::max(3, reps / 2) : reps;  // the long ones: fewer repetitions
    for (bool causal : {false, true}) {
      Tensor q = on_gpu({B, H, T, D}, true), k = on_gpu({B, H, T, D}, true), v = on_gpu({B, H, T, D}, true);
      Tensor g = on_gpu({B, H, T, D}, false);
      SdpaOptions o;
      o.causal = causal;
      const double fwd = bench::median_seconds(
          [&] {
            NoGradGuard ng;
            wait_for(scaled_dot_product_attention(q, k, v, o).out);
          },
          r, 2);
      const double both = bench::median_seconds(
          [&] {
            q.set_grad(Tensor()), k.set_grad(Tensor()), v.set_grad(Tensor());
            scaled_dot_product_attention(q, k, v, o).out.backward(g);
            wait_for(v.grad());
          },
          r, 2);
      const double flops = 4.0 * double(B * H) * double(T) * double(T) * double(D) * (causal ? 0.5 : 1.0);
      if (json)
        fmt::print("{{\"op\": \"attention\", \"B\": {}, \"H\": {}, \"T\": {}, \"d\": {}, \"causal\": {}, "
                   "\"fwd_ms\": {:.4f}, \"fwd_bwd_ms\": {:.4f}}}\n",
                   B, H, T, D, causal ? "true" : "false", fwd * 1e3, both * 1e3);
      else
        fmt::print("{:<34} {:>10.3f} {:>10.3f} {:>9.2f} {:>9.2f}\n",
                   fmt::format("({}, {}, {}, {}){}", B, H, T, D, causal ? " causal" : ""), fwd * 1e3, both * 1e3,
                   flops / fwd * 1e-12, 3.5 * flops / both * 1e-12);
    }
  }
  // cuBLAS through matmul and linear: one large square product, a batched one, a Linear layer
  if (!json) fmt::print("\n{:<34} {:>10} {:>9}\n", "matmul, f32", "ms", "TF/s");
  struct Mm {
    const char* name;
    Shape a, b;
    bool linear;
  };
  for (const Mm& m : {Mm{"matmul 4096^3", {4096, 4096}, {4096, 4096}, false},
                      Mm{"matmul (32, 512, 64) @ (32, 64, 512)", {32, 512, 64}, {32, 64, 512}, false},
                      Mm{"linear (8192, 1024) -> 4096, bias", {8192, 1024}, {4096, 1024}, true}}) {
    Tensor a = on_gpu(m.a, false), b = on_gpu(m.b, false), bias = on_gpu({m.b[0]}, false);
    const double s = bench::median_seconds(
        [&] { wait_for(m.linear ? linear(a, b, bias) : matmul(a, b)); }, reps, 2);
    const int n = int(m.a.size());
    const double M = double(m.a[n - 2]), K = double(m.a[n - 1]), N = double(m.linear ? m.b[0] : m.b[n - 1]),
                 P = n == 3 ? double(m.a[0]) : 1.0;
    const double flops = 2.0 * P * M * N * K;
    if (json)
      fmt::print("{{\"op\": \"matmul\", \"name\": \"{}\", \"ms\": {:.4f}}}\n", m.name, s * 1e3);
    else
      fmt::print("{:<34} {:>10.3f} {:>9.2f}\n", m.name, s * 1e3, flops / s * 1e-12);
  }
  return 0;
}
