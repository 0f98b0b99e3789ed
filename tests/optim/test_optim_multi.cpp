// Multi-tensor optimizer kernels (core/kernels/optim.h): one call over a list of tensors must give
// each tensor exactly what a call over that tensor alone gives (the same bits), whatever the list,
// the mix of dtypes, the step counts of its tensors and the number of threads.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "core/parallel.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::optim;

namespace {

// 37 parameters: sizes from 1 to past a few parallel chunks (the largest 70001 elements), f32 and
// f64 mixed, so one step makes two multi-tensor calls (one per dtype) cut across the threads at
// places that fall inside tensors.
std::vector<Tensor> make_params(uint64_t seed) {
  std::vector<Tensor> ps;
  Generator g(seed);
  for (int i = 0; i < 37; ++i) {
    const int64_t n = i == 5 ? 70001 : i == 20 ? 33000 : 1 + (i * 37) % 300;
    const DType dt = i % 3 == 2 ? DType::f64 : DType::f32;
    ps.push_back(randn({n}, dt, &g).detach().set_requires_grad(true));
  }
  return ps;
}

// gradients of step t: deterministic in (seed, t, i); parameter i gets none when (i + t) % 7 == 0,
// so parameters reach different step counts and one call mixes them
void set_grads(std::vector<Tensor>& ps, int t) {
  for (size_t i = 0; i < ps.size(); ++i) {
    if ((i + size_t(t)) % 7 == 0) {
      ps[i].set_grad(Tensor());
      continue;
    }
    Generator g(1000 + 100 * uint64_t(t) + i);
    ps[i].set_grad(randn(ps[i].shape(), ps[i].dtype(), &g));
  }
}

std::vector<Tensor> clones(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const Tensor& p : ps) out.push_back(p.detach().clone().set_requires_grad(true));
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

using MakeOpt = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

// four steps of one optimizer over all the parameters vs one optimizer per parameter
void check_multi_equals_single(const MakeOpt& make) {
  std::vector<Tensor> all = make_params(7), single = clones(all);
  std::unique_ptr<Optimizer> joint = make(all);
  std::vector<std::unique_ptr<Optimizer>> alone;
  for (const Tensor& p : single) alone.push_back(make({p}));
  for (int t = 0; t < 4; ++t) {
    set_grads(all, t);
    set_grads(single, t);
    joint->step();
    for (auto& o : alone) o->step();
  }
  for (size_t i = 0; i < all.size(); ++i) {
    INFO("parameter ", i, " of ", all.size(), ", numel ", all[i].numel());
    CHECK(same_bits(all[i], single[i]));
  }
  // and the state: the step counts differ per parameter, the moments match bit for bit
  const StateDict a = joint->state_dict();
  size_t matched = 0, expected = 0;
  for (size_t i = 0; i < single.size(); ++i)
    for (const auto& [name, t] : alone[i]->state_dict()) {
      if (name.rfind("state.0.", 0) != 0) continue;
      ++expected;
      const std::string joint_name = "state." + std::to_string(i) + name.substr(7);
      for (const auto& [n2, t2] : a)
        if (n2 == joint_name) {
          INFO(joint_name);
          CHECK(same_bits(t.contiguous(), t2.contiguous()));
          ++matched;
        }
    }
  CHECK(matched == expected);
}

}  // namespace

TEST_CASE("multi-tensor SGD equals one step per parameter, bit for bit") {
  check_multi_equals_single([](std::vector<Tensor> p) -> std::unique_ptr<Optimizer> {
    return std::make_unique<SGD>(std::move(p), SGD::Options{0.05, 0.9, 0.01, 0.0, true});
  });
  check_multi_equals_single([](std::vector<Tensor> p) -> std::unique_ptr<Optimizer> {
    return std::make_unique<SGD>(std::move(p), SGD::Options{0.1, 0.8, 0.0, 0.3, false});
  });
  check_multi_equals_single([](std::vector<Tensor> p) -> std::unique_ptr<Optimizer> {
    return std::make_unique<SGD>(std::move(p), SGD::Options{0.1});
  });
}

TEST_CASE("multi-tensor Adam and AdamW equal one step per parameter, bit for bit") {
  check_multi_equals_single([](std::vector<Tensor> p) -> std::unique_ptr<Optimizer> {
    return std::make_unique<Adam>(std::move(p), Adam::Options{1e-2, 0.9, 0.999, 1e-8, 0.01});
  });
  check_multi_equals_single([](std::vector<Tensor> p) -> std::unique_ptr<Optimizer> {
    return std::make_unique<AdamW>(std::move(p), AdamW::Options{3e-3, 0.8, 0.95, 1e-6, 0.1});
  });
}

TEST_CASE("multi-tensor AdamW: the same bits on 1, 2 and 3 threads") {
  const int threads = num_threads();
  std::vector<std::vector<Tensor>> results;
  for (int nt : {1, 2, 3}) {
    set_num_threads(nt);
    std::vector<Tensor> ps = make_params(11);
    AdamW opt(ps, {1e-2, 0.9, 0.99, 1e-8, 0.05});
    for (int t = 0; t < 3; ++t) {
      set_grads(ps, t);
      clip_grad_norm(ps, 5.0);
      opt.step();
    }
    results.push_back(ps);
  }
  set_num_threads(threads);
  for (size_t i = 0; i < results[0].size(); ++i) {
    INFO("parameter ", i);
    CHECK(same_bits(results[0][i], results[1][i]));
    CHECK(same_bits(results[0][i], results[2][i]));
  }
}

TEST_CASE("multi-tensor clip_grad_norm: equals the norm of the concatenated gradients in f64") {
  const double inf = std::numeric_limits<double>::infinity();
  for (double p : {2.0, 1.0, 3.0, inf}) {
    INFO("norm_type ", p);
    std::vector<Tensor> ps = make_params(3);
    set_grads(ps, 1);
    double acc = 0;
    std::vector<std::vector<double>> before;
    for (const Tensor& q : ps) {
      before.push_back(q.grad().defined() ? q.grad().to_vector<double>() : std::vector<double>{});
      for (double v : before.back()) acc = std::isinf(p) ? std::max(acc, std::abs(v)) : acc + std::pow(std::abs(v), p);
    }
    const double ref = std::isinf(p) ? acc : std::pow(acc, 1.0 / p);
    const double max_norm = 0.25 * ref;
    const double norm = clip_grad_norm(ps, max_norm, p);
    CHECK(norm == doctest::Approx(ref).epsilon(1e-12));
    // every gradient scaled by the same coefficient, cast to its dtype as Tensor::mul_ casts it
    const double coef = max_norm / (norm + 1e-6);
    for (size_t i = 0; i < ps.size(); ++i) {
      if (before[i].empty()) {
        CHECK_FALSE(ps[i].grad().defined());
        continue;
      }
      const std::vector<double> got = ps[i].grad().to_vector<double>();
      for (size_t j = 0; j < got.size(); j += 97) {
        const double want = ps[i].dtype() == DType::f32 ? double(float(before[i][j]) * float(coef)) : before[i][j] * coef;
        REQUIRE(got[j] == want);
      }
    }
  }
}

TEST_CASE("multi-tensor clip_grad_norm: a NaN or inf in one tensor of many") {
  std::vector<Tensor> ps = make_params(5);
  set_grads(ps, 2);
  Tensor g = ps[20].grad();
  REQUIRE((g.defined() && g.dtype() == DType::f64));
  std::vector<double> v = g.to_vector<double>();
  v[32999] = std::numeric_limits<double>::infinity();
  ps[20].set_grad(from_vector(v));
  AG_CHECK_ERROR(clip_grad_norm(ps, 1.0, 2.0, true), "clip_grad_norm", "inf");  // nothing scaled
  CHECK(std::isinf(clip_grad_norm(ps, 1e30)));  // scaled by 1e30 / inf = 0: the inf becomes NaN, as in PyTorch
  CHECK(std::isnan(ps[20].grad().to_vector<double>()[32999]));
  v[32999] = std::numeric_limits<double>::quiet_NaN();
  ps[20].set_grad(from_vector(v));
  CHECK(std::isnan(clip_grad_norm(ps, 1e30)));
  CHECK(std::isnan(clip_grad_norm(ps, 1e30, std::numeric_limits<double>::infinity())));
}

TEST_CASE("multi-tensor clip_grad_value and GradScaler::unscale over mixed dtypes") {
  std::vector<Tensor> ps = make_params(9);
  set_grads(ps, 0);
  std::vector<std::vector<double>> before;
  for (const Tensor& q : ps) before.push_back(q.grad().defined() ? q.grad().to_vector<double>() : std::vector<double>{});
  clip_grad_value(ps, 0.5);
  for (size_t i = 0; i < ps.size(); ++i) {
    if (before[i].empty()) continue;
    const std::vector<double> got = ps[i].grad().to_vector<double>();
    for (size_t j = 0; j < got.size(); ++j) REQUIRE(got[j] == std::min(0.5, std::max(-0.5, before[i][j])));
  }
  GradScaler scaler({.init_scale = 1024.0});
  std::vector<std::vector<double>> clipped;
  for (const Tensor& q : ps) clipped.push_back(q.grad().defined() ? q.grad().to_vector<double>() : std::vector<double>{});
  scaler.unscale(ps);
  for (size_t i = 0; i < ps.size(); ++i) {
    if (clipped[i].empty()) continue;
    const std::vector<double> got = ps[i].grad().to_vector<double>();
    for (size_t j = 0; j < got.size(); ++j) REQUIRE(got[j] == clipped[i][j] / 1024.0);  // a power of two: exact
  }
  AG_CHECK_ERROR(scale_grads(ps, std::numeric_limits<double>::infinity()), "scale_grads", "finite", "inf");
}
