// The demo: a small MLP learns to separate three interleaved spirals (a classic toy problem that
// no linear model can solve), with attograd's tensors, tape and SGD. It prints the falling loss
// and the accuracy on held-out points drawn from the same spirals.
//
//   x (B, 2) -> Linear(2, H) -> tanh -> Linear(H, H) -> tanh -> Linear(H, K) -> logits (B, K)
//   (Linear as PyTorch's nn.Linear: y = x W^T + b, W of shape (out, in))
//   loss = cross_entropy(logits, label)
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <numeric>

#include "apps/common/run.h"
#include "attograd.h"
#include "nn/init.h"
#include "optim/sgd.h"

using namespace ag;

namespace {

// K spirals of n points each. Point i of class k: radius r = i/n, angle t = 4r + 2 pi k / K plus
// Gaussian noise; position (r sin t, r cos t).
struct Dataset {
  Tensor x;  // (K n, 2) f32
  Tensor y;  // (K n) i64
};
Dataset make_spirals(int64_t n, int64_t classes, double noise, uint64_t seed) {
  Generator gen(seed);
  std::vector<float> noise_v = randn({classes * n}, DType::f32, &gen, 0.0, noise).to_vector<float>();
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (int64_t k = 0; k < classes; ++k) {
    for (int64_t i = 0; i < n; ++i) {
      double r = double(i) / double(n);
      double t = 4.0 * r + 2.0 * M_PI * double(k) / double(classes) + noise_v[size_t(k * n + i)];
      xs.push_back(float(r * std::sin(t)));
      xs.push_back(float(r * std::cos(t)));
      ys.push_back(k);
    }
  }
  return {from_vector(xs, {classes * n, 2}), from_vector(ys, {classes * n})};
}

// y = x W^T + b with nn.Linear's default init: W (out, in) kaiming-uniform, which is
// U(-1/sqrt(in), 1/sqrt(in)), and b ~ U(-1/sqrt(in), 1/sqrt(in)). W^T is a view that matmul hands
// to BLAS as a transpose flag.
struct Dense {
  Tensor w, b;  // (out, in), (out)
  Dense(int64_t in, int64_t out, Generator& gen) {
    w = nn::init::kaiming_uniform({out, in}, std::sqrt(5.0), DType::f32, &gen).set_requires_grad(true);
    double bound = 1.0 / std::sqrt(double(in));
    b = nn::init::uniform({out}, -bound, bound, DType::f32, &gen).set_requires_grad(true);
  }
  Tensor forward(const Tensor& x) const { return add(matmul(x, w.mT()), b); }
};

struct MLP {
  Dense l1, l2, l3;
  MLP(int64_t hidden, int64_t classes, Generator& gen)
      : l1(2, hidden, gen), l2(hidden, hidden, gen), l3(hidden, classes, gen) {}
  Tensor forward(const Tensor& x) const { return l3.forward(tanh(l2.forward(tanh(l1.forward(x))))); }
  std::vector<Tensor> parameters() const { return {l1.w, l1.b, l2.w, l2.b, l3.w, l3.b}; }
};

double accuracy(const MLP& model, const Dataset& d) {
  NoGradGuard no_grad;
  Tensor pred = argmax(model.forward(d.x), 1);
  return mean(eq(pred, d.y).to(DType::f32)).item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attograd demo: an MLP learns to classify three interleaved spirals"};
  int64_t points = 1000, hidden = 64, batch = 100, epochs = 60, classes = 3;
  double lr = 0.1, momentum = 0.9, noise = 0.2;
  uint64_t seed = 0;
  int threads = 0;
  app.add_option("--points", points, "training points per class")->check(CLI::PositiveNumber);
  app.add_option("--classes", classes, "number of spirals")->check(CLI::Range(2, 16));
  app.add_option("--hidden", hidden, "hidden width")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "mini-batch size")->check(CLI::PositiveNumber);
  app.add_option("--epochs", epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "SGD learning rate")->check(CLI::PositiveNumber);
  app.add_option("--momentum", momentum, "SGD momentum")->check(CLI::Range(0.0, 0.999));
  app.add_option("--noise", noise, "angular noise of the spirals (radians)")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", seed, "random seed (data, init, shuffling)");
  app.add_option("--threads", threads, "threads (default: OMP_NUM_THREADS or all cores)");
  if (const int rc = apps::parse_command_line(app, argc, argv, "spirals"); rc >= 0) return rc;
  if (threads > 0) set_num_threads(threads);

  try {
    Dataset train = make_spirals(points, classes, noise, seed + 1);
    Dataset test = make_spirals(points / 4, classes, noise, seed + 2);
    Generator gen(seed);
    MLP model(hidden, classes, gen);
    optim::SGD opt(model.parameters(), {.lr = lr, .momentum = momentum});
    const int64_t n = train.x.size(0), steps_per_epoch = (n + batch - 1) / batch;
    fmt::print("spirals: {} classes x {} points, MLP 2-{}-{}-{}, SGD lr {} momentum {}, {} threads\n", classes,
               points, hidden, hidden, classes, lr, momentum, num_threads());

    auto t0 = std::chrono::steady_clock::now();
    for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
      double total = 0;
      // a fresh random order each epoch: sort random keys
      std::vector<float> keys = rand({n}, DType::f32, &gen).to_vector<float>();
      std::vector<int64_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), int64_t(0));
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keys[size_t(a)] < keys[size_t(b)]; });
      Tensor idx_all = from_vector(order, {n});
      for (int64_t s = 0; s < steps_per_epoch; ++s) {
        int64_t b0 = s * batch, len = std::min(batch, n - b0);
        Tensor idx = idx_all.narrow(0, b0, len).contiguous();
        Tensor xb = index_select(train.x, 0, idx), yb = index_select(train.y, 0, idx);
        Tensor loss = cross_entropy(model.forward(xb), yb);
        opt.zero_grad();
        loss.backward();
        opt.step();
        total += loss.item<double>() * double(len);
      }
      if (epoch == 1 || epoch % std::max<int64_t>(1, epochs / 12) == 0 || epoch == epochs)
        fmt::print("epoch {:>4}  loss {:.4f}  train acc {:5.1f}%\n", epoch, total / double(n),
                   100 * accuracy(model, train));
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("test accuracy {:.1f}% on {} held-out points ({:.2f} s)\n", 100 * accuracy(model, test),
               test.x.size(0), secs);
  } catch (const Error& e) {
    apps::print_error("spirals", e.what());
    return 1;
  }
  return 0;
}
