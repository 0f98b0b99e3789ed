// Optimizers, gradient clipping and LR schedules (optim/). Reference values are from PyTorch 1.13,
// printed by tools/make_optim_reference.py (float32; the same literals for params and grads).
#include <cmath>
#include <numbers>

#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "optim/sgd.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::optim;
using ag::test::check_close;

namespace {

// The run of tools/make_optim_reference.py: a (4) and b (2), 3 steps, b without grad at step 2.
struct RefRun {
  std::vector<double> a1, a3, b3;
};
template <class Opt, class Options>
RefRun run_reference(Options options) {
  Tensor a = tensor({0.5f, -1.25f, 2.0f, 0.125f}).set_requires_grad(true);
  Tensor b = tensor({-0.75f, 1.5f}).set_requires_grad(true);
  Opt opt({a, b}, options);
  const std::vector<std::vector<float>> ga = {{0.1f, -0.2f, 0.3f, -0.4f}, {0.25f, 0.5f, -0.125f, 1.0f},
                                              {-0.3f, 0.05f, 0.2f, -0.6f}};
  const std::vector<std::vector<float>> gb = {{0.6f, -0.35f}, {}, {-0.2f, 0.45f}};
  RefRun r;
  for (int t = 0; t < 3; ++t) {
    a.set_grad(from_vector(ga[t]));
    b.set_grad(gb[t].empty() ? Tensor() : from_vector(gb[t]));
    opt.step();
    if (t == 0) r.a1 = a.to_vector<double>();
  }
  r.a3 = a.to_vector<double>();
  r.b3 = b.to_vector<double>();
  return r;
}
void check_run(const RefRun& r, const std::vector<double>& a1, const std::vector<double>& a3,
               const std::vector<double>& b3) {
  check_close(r.a1, a1, 0, 1e-6);
  check_close(r.a3, a3, 0, 1e-6);
  check_close(r.b3, b3, 0, 1e-6);
}

}  // namespace

// ---- SGD -------------------------------------------------------------------------------------
TEST_CASE("SGD: momentum with dampening matches PyTorch") {
  // by hand for a[0]: b1 = g1 = 0.1, p = 0.5 - 0.1 * 0.1 = 0.49
  check_run(run_reference<SGD>(SGD::Options{.lr = 0.1, .momentum = 0.9, .dampening = 0.1}),
            {0.49000001, -1.23000002, 1.97000003, 0.165000007}, {0.457150012, -1.28579998, 1.92207503, 0.116400018},
            {-0.846000016, 1.52600002});
}

TEST_CASE("SGD: nesterov with weight decay matches PyTorch") {
  // by hand for a[0]: g = 0.1 + 0.1 * 0.5 = 0.15, b = 0.15, g + 0.8 b = 0.27, p = 0.5 - 0.05 * 0.27 = 0.4865
  check_run(
      run_reference<SGD>(SGD::Options{.lr = 0.05, .momentum = 0.8, .weight_decay = 0.1, .nesterov = true}),
      {0.486499995, -1.22074997, 1.95500004, 0.159875005}, {0.464331299, -1.24143755, 1.88220525, 0.111517005},
      {-0.788874805, 1.47023797});
}

TEST_CASE("SGD: plain step and options") {
  Tensor p = tensor({1.0f, -2.0f}).set_requires_grad(true);
  SGD opt({p}, {.lr = 0.5});
  p.set_grad(tensor({0.2f, 0.4f}));
  opt.step();
  check_close(p, {0.9, -2.2});  // p - 0.5 g
  opt.set_lr(0.25);
  CHECK(opt.options().lr == 0.25);
  CHECK(opt.lr() == 0.25);
  CHECK(opt.state_dict().size() == 5);  // no momentum buffer without momentum: only hyper-parameters
  opt.zero_grad();
  CHECK(!p.grad().defined());
  opt.step();  // no gradient: skipped
  check_close(p, {0.9, -2.2});
}

TEST_CASE("SGD: bad hyper-parameters") {
  Tensor p = zeros({2}).set_requires_grad(true);
  AG_CHECK_ERROR(SGD({p}, {.lr = -0.1}), "SGD", "learning rate", "-0.1");
  AG_CHECK_ERROR(SGD({p}, {.lr = 0.1, .momentum = -0.5}), "SGD", "momentum", "-0.5");
  AG_CHECK_ERROR(SGD({p}, {.lr = 0.1, .weight_decay = -1}), "SGD", "weight_decay");
  AG_CHECK_ERROR(SGD({p}, {.lr = 0.1, .nesterov = true}), "SGD", "nesterov", "momentum 0");
  AG_CHECK_ERROR(SGD({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}), "SGD", "nesterov",
                 "dampening 0.1");
  SGD opt({p}, {.lr = 0.1});
  AG_CHECK_ERROR(opt.set_lr(-1), "SGD", "learning rate", "-1");
  AG_CHECK_ERROR(SGD({zeros({2})}, {}), "SGD", "parameter 0", "requires grad");
  AG_CHECK_ERROR(SGD({p, p}, {}), "SGD", "parameter 1", "same tensor as parameter 0");
}

// ---- Adam / AdamW ----------------------------------------------------------------------------
TEST_CASE("Adam: L2 weight decay matches PyTorch") {
  // at step 1, m_hat = g and v_hat = g^2, so p moves by lr * g / (|g| + eps) ~ -lr sign(g):
  // a[0]: g = 0.1 + 0.1 * 0.5 = 0.15 > 0, p = 0.5 - 0.01 = 0.49
  check_run(run_reference<Adam>(Adam::Options{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6,
                                              .weight_decay = 0.1}),
            {0.490000069, -1.24000001, 1.99000001, 0.134999976}, {0.478831261, -1.24209607, 1.97391653, 0.130092829},
            {-0.761921465, 1.50458515});
}

TEST_CASE("AdamW: decoupled weight decay matches PyTorch") {
  // a[0] at step 1: p = 0.5 * (1 - 0.02 * 0.05) - 0.02 * sign(0.1) = 0.4795
  check_run(run_reference<AdamW>(AdamW::Options{.lr = 0.02, .weight_decay = 0.05}),
            {0.479499996, -1.22874999, 1.97800004, 0.144875005}, {0.459575951, -1.24311841, 1.95633733, 0.135998771},
            {-0.776485085, 1.51345646});
}

TEST_CASE("Adam: f64 equals the textbook bias-corrected form over 20 steps") {
  // PyTorch's denom = sqrt(v) / sqrt(1 - beta2^t) + eps is sqrt(v_hat) + eps, and
  // lr / (1 - beta1^t) * m is lr * m_hat: the same update as Kingma & Ba's m_hat / (sqrt(v_hat) + eps).
  const double lr = 0.03, b1 = 0.9, b2 = 0.99, eps = 1e-3, wd = 0.02;
  for (bool decoupled : {false, true}) {
    Tensor p = tensor<double>({0.3, -0.7, 1.1}).set_requires_grad(true);
    std::unique_ptr<Optimizer> opt;
    if (decoupled)
      opt = std::make_unique<AdamW>(std::vector{p}, AdamW::Options{lr, b1, b2, eps, wd});
    else
      opt = std::make_unique<Adam>(std::vector{p}, Adam::Options{lr, b1, b2, eps, wd});
    std::vector<double> x = {0.3, -0.7, 1.1}, m(3, 0), v(3, 0);
    for (int t = 1; t <= 20; ++t) {
      std::vector<double> g(3);
      for (int i = 0; i < 3; ++i) g[i] = std::sin(1.7 * t + i) + 0.5 * x[i];  // depends on p, like a loss would
      p.set_grad(from_vector(g));
      opt->step();
      for (int i = 0; i < 3; ++i) {
        if (decoupled) x[i] *= 1 - lr * wd;
        const double gi = decoupled ? g[i] : g[i] + wd * x[i];
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        const double m_hat = m[i] / (1 - std::pow(b1, t)), v_hat = v[i] / (1 - std::pow(b2, t));
        x[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
      }
    }
    check_close(p, x, 0, 1e-12);
  }
}

TEST_CASE("Adam: bad hyper-parameters") {
  Tensor p = zeros({2}).set_requires_grad(true);
  AG_CHECK_ERROR(Adam({p}, {.lr = -1e-3}), "Adam", "learning rate", "-0.001");
  AG_CHECK_ERROR(Adam({p}, {.beta1 = 1.0}), "Adam", "beta1", "[0, 1)", "got 1");
  AG_CHECK_ERROR(Adam({p}, {.beta2 = -0.1}), "Adam", "beta2", "-0.1");
  AG_CHECK_ERROR(Adam({p}, {.eps = -1}), "Adam", "eps");
  AG_CHECK_ERROR(AdamW({p}, {.weight_decay = -0.01}), "AdamW", "weight_decay", "-0.01");
  AG_CHECK_ERROR(AdamW({p}, {.beta1 = 1.5}), "AdamW", "beta1", "1.5");
}

// ---- state_dict ------------------------------------------------------------------------------
namespace {
// Deterministic gradients that depend on the parameters, as a loss's would.
void fake_backward(const std::vector<Tensor>& params, int t) {
  for (size_t k = 0; k < params.size(); ++k) {
    std::vector<float> p = params[k].to_vector<float>(), g(p.size());
    for (size_t i = 0; i < p.size(); ++i) g[i] = std::cos(0.9f * float(t) + float(i + 3 * k)) + 0.3f * p[i];
    Tensor(params[k]).set_grad(from_vector(g, params[k].shape()));
  }
}
std::vector<Tensor> make_params() {
  return {tensor({0.1f, -0.2f, 0.3f, -0.4f, 0.5f, -0.6f}, {2, 3}).set_requires_grad(true),
          tensor({1.0f, -1.0f, 0.25f}).set_requires_grad(true)};
}
std::vector<Tensor> copy_params(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const Tensor& p : ps) out.push_back(p.detach().clone().set_requires_grad(true));
  return out;
}

// Runs n steps uninterrupted, and k steps + state_dict into a fresh optimizer + n - k steps;
// the parameters must be bit-identical. The LR follows a schedule, so lr is saved state too.
template <class Opt, class Options>
void check_resume(Options options, int k, int n) {
  WarmupCosineLR sched(options.lr, options.lr / 10, 2, n);
  std::vector<Tensor> ref = make_params();
  Opt ref_opt(ref, options);
  for (int t = 0; t < n; ++t) {
    fake_backward(ref, t);
    sched.set_lr(ref_opt, t);
    ref_opt.step();
  }
  std::vector<Tensor> first = make_params();
  Opt first_opt(first, options);
  for (int t = 0; t < k; ++t) {
    fake_backward(first, t);
    sched.set_lr(first_opt, t);
    first_opt.step();
  }
  StateDict saved = first_opt.state_dict();
  std::vector<Tensor> resumed = copy_params(first);
  Opt resumed_opt(resumed, Options{});  // default hyper-parameters: load_state_dict restores them
  resumed_opt.load_state_dict(saved);
  CHECK(resumed_opt.lr() == first_opt.lr());
  for (int t = 0; t < k; ++t) {  // the old optimizer's later steps must not leak into the copy
    fake_backward(first, 100 + t);
    first_opt.step();
  }
  for (int t = k; t < n; ++t) {
    fake_backward(resumed, t);
    sched.set_lr(resumed_opt, t);
    resumed_opt.step();
  }
  for (size_t i = 0; i < ref.size(); ++i) CHECK(resumed[i].to_vector<float>() == ref[i].to_vector<float>());
}
}  // namespace

TEST_CASE("Adam: state_dict names and values") {
  std::vector<Tensor> ps = make_params();
  Adam opt(ps, {.lr = 0.01, .beta1 = 0.8});
  fake_backward(ps, 0);
  ps[1].set_grad(Tensor());  // parameter 1 never updated: no state
  opt.step();
  fake_backward(ps, 1);
  opt.step();
  StateDict d = opt.state_dict();
  std::vector<std::string> names;
  for (const auto& [name, t] : d) names.push_back(name);
  CHECK(names == std::vector<std::string>{"state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq",
                                          "state.1.step", "state.1.exp_avg", "state.1.exp_avg_sq",
                                          "param_groups.0.lr", "param_groups.0.betas.0", "param_groups.0.betas.1",
                                          "param_groups.0.eps", "param_groups.0.weight_decay"});
  CHECK(d[0].second.ndim() == 0);
  CHECK(d[0].second.item<int64_t>() == 2);  // per-parameter step counts
  CHECK(d[3].second.item<int64_t>() == 1);
  CHECK(d[1].second.shape() == Shape{2, 3});
  CHECK(d[7].second.ndim() == 0);
  CHECK(d[7].second.item<double>() == 0.8);
}

TEST_CASE("Adam: resuming from state_dict is bit-identical") {
  check_resume<Adam>(Adam::Options{.lr = 0.05, .beta1 = 0.85, .weight_decay = 0.01}, 3, 7);
  check_resume<AdamW>(AdamW::Options{.lr = 0.05, .weight_decay = 0.1}, 4, 7);
}

TEST_CASE("SGD: resuming from state_dict is bit-identical") {
  check_resume<SGD>(SGD::Options{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}, 3, 7);
  check_resume<SGD>(SGD::Options{.lr = 0.1, .momentum = 0.5, .dampening = 0.2}, 1, 5);
}

TEST_CASE("Adam: load_state_dict errors") {
  std::vector<Tensor> ps = make_params();
  Adam opt(ps, {});
  fake_backward(ps, 0);
  opt.step();
  const StateDict good = opt.state_dict();
  auto without = [&](const std::string& name) {
    StateDict d;
    for (const auto& e : good)
      if (e.first != name) d.push_back(e);
    return d;
  };
  auto replaced = [&](const std::string& name, Tensor t) {
    StateDict d = good;
    for (auto& e : d)
      if (e.first == name) e.second = t;
    return d;
  };
  Adam fresh(make_params(), {});
  AG_CHECK_ERROR(fresh.load_state_dict(replaced("state.0.exp_avg", zeros({3, 2}))), "Adam", "state.0.exp_avg",
                 "[3,2]", "[2,3]");
  AG_CHECK_ERROR(fresh.load_state_dict(replaced("state.1.exp_avg_sq", zeros({3}, DType::f64))), "Adam",
                 "state.1.exp_avg_sq", "f64");
  AG_CHECK_ERROR(fresh.load_state_dict(replaced("state.0.step", zeros({1}))), "Adam", "state.0.step", "0-dim");
  AG_CHECK_ERROR(fresh.load_state_dict(replaced("state.0.step", scalar_tensor(-1))), "Adam", "state.0.step",
                 "-1");
  AG_CHECK_ERROR(fresh.load_state_dict(without("state.1.exp_avg")), "Adam", "parameter 1", "state.1.exp_avg",
                 "missing");
  AG_CHECK_ERROR(fresh.load_state_dict(without("param_groups.0.eps")), "Adam", "missing", "param_groups.0.eps");
  AG_CHECK_ERROR(fresh.load_state_dict(replaced("param_groups.0.betas.1", scalar_tensor(1.0, DType::f64))), "Adam",
                 "beta2", "got 1");
  StateDict extra = good;
  extra.emplace_back("state.2.exp_avg", zeros({3}));
  AG_CHECK_ERROR(fresh.load_state_dict(extra), "Adam", "unknown name", "state.2.exp_avg", "2 parameters");
  StateDict twice = good;
  twice.push_back(good[0]);
  AG_CHECK_ERROR(fresh.load_state_dict(twice), "Adam", "state.0.step", "twice");
  SGD sgd(make_params(), {.lr = 0.1, .momentum = 0.9});
  AG_CHECK_ERROR(sgd.load_state_dict(good), "SGD", "unknown name", "state.0.step");
  // a failed load changes nothing: fresh still has no state and its defaults
  CHECK(fresh.state_dict().size() == 5);
  CHECK(fresh.lr() == 1e-3);
  fresh.load_state_dict(good);  // and a good one loads
  CHECK(fresh.state_dict().size() == good.size());
}

// ---- clipping --------------------------------------------------------------------------------
namespace {
// grads (3, -4) and (1, 2, -2), a third parameter without grad: the fixture of the script
std::vector<Tensor> clip_params() {
  std::vector<Tensor> ps = {zeros({2}).set_requires_grad(true), zeros({3}).set_requires_grad(true),
                            zeros({1}).set_requires_grad(true)};
  ps[0].set_grad(tensor({3.0f, -4.0f}));
  ps[1].set_grad(tensor({1.0f, 2.0f, -2.0f}));
  return ps;
}
std::vector<double> all_grads(const std::vector<Tensor>& ps) {
  std::vector<double> g = ps[0].grad().to_vector<double>(), g1 = ps[1].grad().to_vector<double>();
  g.insert(g.end(), g1.begin(), g1.end());
  return g;
}
}  // namespace

TEST_CASE("clip_grad_norm: matches torch.nn.utils.clip_grad_norm_") {
  // 2-norm: sqrt(9 + 16 + 1 + 4 + 4) = sqrt(34) = 5.83095; 1-norm 12; inf-norm 4
  struct Case {
    double norm_type, max_norm, norm;
    std::vector<double> grads;
  };
  const std::vector<Case> cases = {
      {2.0, 1.0, 5.83095169, {0.51449573, -0.685994267, 0.171498567, 0.342997134, -0.342997134}},
      {1.0, 5.0, 12, {1.24999988, -1.66666651, 0.416666627, 0.833333254, -0.833333254}},
      {INFINITY, 2.5, 4, {1.87499964, -2.49999952, 0.624999881, 1.24999976, -1.24999976}},
      {2.0, 100.0, 5.83095169, {3, -4, 1, 2, -2}},  // under max_norm: unchanged
  };
  for (const Case& c : cases) {
    CAPTURE(c.norm_type);
    std::vector<Tensor> ps = clip_params();
    const double norm = clip_grad_norm(ps, c.max_norm, c.norm_type);
    CHECK(norm == doctest::Approx(c.norm).epsilon(1e-7));
    check_close(all_grads(ps), c.grads, 0, 1e-6);
    CHECK(!ps[2].grad().defined());  // skipped
  }
  CHECK(clip_grad_norm({zeros({2}).set_requires_grad(true)}, 1.0) == 0.0);  // no gradients at all
}

TEST_CASE("clip_grad_norm: non-finite norms") {
  std::vector<Tensor> ps = clip_params();
  ps[1].set_grad(tensor({1.0f, NAN, 2.0f}));
  AG_CHECK_ERROR(clip_grad_norm(ps, 1.0, 2.0, true), "clip_grad_norm", "norm of order 2", "nan");
  CHECK(ps[0].grad().to_vector<float>() == std::vector<float>{3, -4});  // unchanged on error
  CHECK(std::isnan(clip_grad_norm(ps, 1.0)));  // without the flag: NaN, and grads scaled by NaN as PyTorch
  CHECK(std::isnan(ps[0].grad().to_vector<float>()[0]));
  ps = clip_params();
  ps[0].set_grad(tensor({INFINITY, 1.0f}));
  AG_CHECK_ERROR(clip_grad_norm(ps, 1.0, INFINITY, true), "clip_grad_norm", "norm of order inf", "inf");
  AG_CHECK_ERROR(clip_grad_norm(ps, -1.0), "clip_grad_norm", "max_norm", "-1");
  AG_CHECK_ERROR(clip_grad_norm(ps, 1.0, 0.0), "clip_grad_norm", "norm_type", "0");
}

TEST_CASE("clip_grad_norm: large gradients, any thread count") {
  // 100000 elements, several norm blocks: the result equals a plain double sum and does not
  // change with the number of threads.
  const int64_t n = 100000;
  std::vector<float> g(n);
  double ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    g[i] = float(std::sin(0.001 * double(i)));
    ref += double(g[i]) * double(g[i]);
  }
  ref = std::sqrt(ref);
  const int threads = num_threads();
  std::vector<double> norms;
  for (int nt : {1, 2, 3}) {
    set_num_threads(nt);
    Tensor p = zeros({n}).set_requires_grad(true);
    p.set_grad(from_vector(g));
    norms.push_back(clip_grad_norm({p}, 1e9));
  }
  set_num_threads(threads);
  CHECK(norms[0] == doctest::Approx(ref).epsilon(1e-12));
  CHECK(norms[0] == norms[1]);
  CHECK(norms[0] == norms[2]);
}

TEST_CASE("clip_grad_value: clamps in place") {
  std::vector<Tensor> ps = clip_params();
  Tensor handle = ps[0].grad();
  ps[1].set_grad(tensor({1.0f, NAN, -2.0f}));
  clip_grad_value(ps, 2.5);
  CHECK(handle.to_vector<float>() == std::vector<float>{2.5f, -2.5f});  // in place
  std::vector<float> g1 = ps[1].grad().to_vector<float>();
  CHECK(g1[0] == 1.0f);
  CHECK(std::isnan(g1[1]));
  CHECK(g1[2] == -2.0f);
  AG_CHECK_ERROR(clip_grad_value(ps, -1), "clip_grad_value", "clip_value", "-1");
}

// ---- schedules -------------------------------------------------------------------------------
TEST_CASE("WarmupCosineLR: hand-computed values") {
  WarmupCosineLR s(1.0, 0.1, 4, 12);
  // warmup: step / 4
  CHECK(s.lr_at(0) == 0.0);
  CHECK(s.lr_at(1) == 0.25);
  CHECK(s.lr_at(3) == 0.75);
  // step 4: progress 0, cos 0 = 1: base. step 8: progress 1/2, cos(pi/2) = 0: (base + min) / 2 = 0.55
  CHECK(s.lr_at(4) == doctest::Approx(1.0).epsilon(1e-15));
  CHECK(s.lr_at(8) == doctest::Approx(0.55).epsilon(1e-15));
  // step 6: progress 1/4, 0.1 + 0.9 * 0.5 * (1 + cos(pi/4)) = 0.1 + 0.45 * (1 + 0.70710678) = 0.868198052
  CHECK(s.lr_at(6) == doctest::Approx(0.86819805153394639).epsilon(1e-14));
  // at and after total_steps: min_lr
  CHECK(s.lr_at(12) == doctest::Approx(0.1).epsilon(1e-15));
  CHECK(s.lr_at(100) == doctest::Approx(0.1).epsilon(1e-15));
  Tensor p = zeros({1}).set_requires_grad(true);
  SGD opt({p}, {.lr = 5});
  s.set_lr(opt, 2);
  CHECK(opt.lr() == 0.5);
  AG_CHECK_ERROR(s.lr_at(-1), "WarmupCosineLR", "step", "-1");
  AG_CHECK_ERROR(WarmupCosineLR(1.0, 0.1, 10, 10), "WarmupCosineLR", "total_steps (10)", "warmup_steps (10)");
  AG_CHECK_ERROR(WarmupCosineLR(1.0, 2.0, 1, 10), "WarmupCosineLR", "min_lr", "2");
  AG_CHECK_ERROR(WarmupCosineLR(-1.0, 0.0, 1, 10), "WarmupCosineLR", "base_lr", "-1");
}

TEST_CASE("StepLR and ConstantLR: hand-computed values") {
  StepLR s(0.1, 3, 0.5);  // 0.1 for steps 0-2, 0.05 for 3-5, 0.025 for 6-8
  CHECK(s.lr_at(0) == 0.1);
  CHECK(s.lr_at(2) == 0.1);
  CHECK(s.lr_at(3) == 0.05);
  CHECK(s.lr_at(8) == 0.025);
  CHECK(s.lr_at(9) == doctest::Approx(0.0125).epsilon(1e-15));
  ConstantLR c(0.3);
  CHECK(c.lr_at(0) == 0.3);
  CHECK(c.lr_at(1000) == 0.3);
  Tensor p = zeros({1}).set_requires_grad(true);
  Adam opt({p}, {});
  s.set_lr(opt, 4);
  CHECK(opt.lr() == 0.05);
  AG_CHECK_ERROR(StepLR(0.1, 0), "StepLR", "step_size", "0");
  AG_CHECK_ERROR(StepLR(0.1, 2, -0.5), "StepLR", "gamma", "-0.5");
  AG_CHECK_ERROR(ConstantLR(-2), "ConstantLR", "base_lr", "-2");
}

// Every in-place writer goes through mark_modified (core/tensor.h), the bump the tape's stale-tensor
// check relies on (autograd/tape.h): a writer that skipped it would let backward use a value that
// changed under it, silently. Each write below must move its storage's version forward.
TEST_CASE("mark_modified: every in-place writer bumps the storage version the tape checks") {
  auto version = [](const Tensor& t) { return t.impl().storage->version; };
  auto bumps = [&](const char* what, const Tensor& t, const auto& write) {
    INFO(what);
    const uint64_t before = version(t);
    write();
    CHECK(version(t) > before);
  };
  Tensor a = tensor({1, 2, 3});
  bumps("fill_", a, [&] { a.fill_(1); });
  bumps("zero_", a, [&] { a.zero_(); });
  bumps("copy_", a, [&] { a.copy_(tensor({4, 5, 6})); });
  bumps("add_", a, [&] { a.add_(tensor({1, 1, 1}), 2); });
  bumps("mul_", a, [&] { a.mul_(3); });
  bumps("a write through a view", a, [&] { a.narrow(0, 1, 1).fill_(7); });

  auto param_with_grad = [] {
    Tensor p = tensor({1, -2, 3}).set_requires_grad(true);
    p.set_grad(tensor({0.5f, -1.f, 2.f}));
    return p;
  };
  Tensor p = param_with_grad();
  SGD sgd({p}, {.lr = 0.1, .momentum = 0.9});
  bumps("SGD::step", p, [&] { sgd.step(); });
  Tensor q = param_with_grad();
  AdamW adamw({q}, {.lr = 0.1});
  bumps("AdamW::step", q, [&] { adamw.step(); });
  Tensor r = param_with_grad();
  Adam adam({r}, {.lr = 0.1});
  bumps("Adam::step", r, [&] { adam.step(); });
  Tensor s = param_with_grad();
  bumps("clip_grad_norm (the gradient)", s.grad(), [&] { clip_grad_norm({s}, 0.1); });
  bumps("clip_grad_value (the gradient)", s.grad(), [&] { clip_grad_value({s}, 0.1); });

  // and the tape sees it: a graph that saved p refuses to run backward after the step
  Tensor w = param_with_grad();
  Tensor L = sum(mul(w, w));
  SGD step_w({w}, {.lr = 0.1});
  {
    NoGradGuard guard;
    step_w.step();
  }
  AG_CHECK_ERROR(L.backward(), "backward", "input 0 of 'mul'", "modified by an in-place op");
}
