// MoE: parameter and buffer names and shapes, PyTorch values, the sparse dispatch against the dense
// mixture it stands for (values and gradients), gradcheck of the input and every parameter through
// the output and the load-balancing loss, the load buffer (counted in training, saved, not
// trained), dropout in training only, bad arguments and input, a regression it learns with every
// expert in use, and the layer as the feed-forward of a TransformerBlock.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "attograd.h"
#include "autograd/testing.h"
#include "moe.h"
#include "nn/transformer.h"
#include "optim/adam.h"

using namespace ag;
using ext::MoE;
using ext::MoEOptions;

namespace {

// v_k = 0.5 sin(1.3 k + phase), k the row-major index: inputs and weights anyone can rebuild.
Tensor vals(const Shape& shape, double phase) {
  std::vector<double> v(size_t(shape.numel()));
  for (size_t k = 0; k < v.size(); ++k) v[k] = 0.5 * std::sin(1.3 * double(k) + phase);
  return from_vector(v, shape);
}

std::vector<std::string> names_of(const nn::NamedTensors& ts) {
  std::vector<std::string> n;
  for (const auto& [name, t] : ts) n.push_back(name);
  return n;
}

double total(const Tensor& t) {
  double s = 0;
  for (const double v : t.to_vector<double>()) s += v;
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void check_close(const Tensor& a, const Tensor& b, double tol) {
  const std::vector<double> u = a.to_vector<double>(), v = b.to_vector<double>();
  REQUIRE(u.size() == v.size());
  for (size_t i = 0; i < u.size(); ++i) CHECK(u[i] == doctest::Approx(v[i]).epsilon(tol));
}

// The mixture the layer computes, written densely: every expert on every token, weighted by p,
// where p comes from a top-k mask built by sorting each token's logits (not the layer's routing).
Tensor dense_mixture(MoE& moe, const Tensor& x) {
  const int64_t N = x.numel() / moe.dim, E = moe.num_experts;
  const Tensor tokens = reshape(x, {N, moe.dim});
  const Tensor logits = linear(tokens, moe.router);
  std::vector<double> l = logits.to_vector<double>(), keep(size_t(N * E));
  for (int64_t t = 0; t < N; ++t) {
    std::vector<double> row(l.begin() + t * E, l.begin() + (t + 1) * E);
    std::sort(row.begin(), row.end(), std::greater<>());
    for (int64_t e = 0; e < E; ++e) keep[size_t(t * E + e)] = l[size_t(t * E + e)] >= row[size_t(moe.top_k - 1)];
  }
  const Tensor mask = from_vector(keep, {N, E});
  const Tensor p = moe.renormalize ? softmax(masked_fill(logits, eq(mask, 0.0), -INFINITY), -1)
                                   : softmax(logits, -1) * mask;
  Tensor y = zeros({N, moe.dim}, DType::f64);
  for (int64_t e = 0; e < E; ++e) y = y + narrow(p, 1, e, 1) * moe.experts->operator[](size_t(e)).forward(tokens);
  return reshape(y, x.shape());
}

}  // namespace

TEST_CASE("MoE: parameter and buffer names and shapes, experts as a ModuleList of SwiGLU") {
  MoE moe(8, 16, 4);
  CHECK(names_of(moe.named_parameters()) ==
        std::vector<std::string>{"router",
                                 "experts.0.w1.weight", "experts.0.w2.weight", "experts.0.w3.weight",
                                 "experts.1.w1.weight", "experts.1.w2.weight", "experts.1.w3.weight",
                                 "experts.2.w1.weight", "experts.2.w2.weight", "experts.2.w3.weight",
                                 "experts.3.w1.weight", "experts.3.w2.weight", "experts.3.w3.weight"});
  CHECK(moe.router.shape() == Shape{4, 8});
  CHECK(moe.experts->operator[](3).w2->weight.shape() == Shape{8, 16});
  CHECK(moe.num_parameters() == 4 * 8 + 4 * 3 * 8 * 16);
  CHECK(names_of(moe.named_buffers()) == std::vector<std::string>{"load"});
  CHECK(moe.load.dtype() == DType::f64);
  CHECK(moe.top_k == 2);
  CHECK(moe(zeros({2, 5, 8})).shape() == Shape{2, 5, 8});
  CHECK(moe.aux_loss.shape() == Shape{});
}

TEST_CASE("MoE: PyTorch values, top-2 renormalized and top-1 unrenormalized, with the load-balancing loss") {
  // dim 3, hidden 2, 3 experts, 4 tokens, f64: x = vals((4,3),0), router = vals((3,3),5), expert e:
  // w1 = vals((2,3),10e+1), w2 = vals((3,2),10e+3), w3 = vals((2,3),10e+2). PyTorch, with torch.topk
  // and the formula of moe.h (tools/make_moe_reference.py); token t goes to experts {2,0}, {0,1},
  // {1,2}, {0,2} with top-2, and to 2, 0, 1, 0 with top-1:
  const std::vector<double> want_top2 = {
      -0.01610984728581363, 0.015287484231200535, -0.010089499324228066,
      0.0012725811919482228, -0.0039499820655018152, 0.0054968092239268702,
      0.0041160302477192302, 0.00084221053895190429, -0.0055593917253126072,
      -0.025480737693569372, 0.0077074946511637666, 0.012271806727102305};
  const double want_aux2 = 1.0124406842736753;
  const std::vector<double> want_top1 = {
      -0.0095334446919515883, 0.008898231794875984, -0.0057161448078468131,
      0.0023843215482862285, -0.0041887166450828737, 0.0047942068201554137,
      0.0017737930780612646, 0.0033224568966111158, -0.0074677449745795864,
      -0.016858163126675294, 0.006001233202291816, 0.0065733846518989626};
  const double want_aux1 = 1.0182200014336791;
  for (const bool top2 : {true, false}) {
    MoE moe(3, 2, 3, {.top_k = top2 ? 2 : 1, .renormalize = top2, .dtype = DType::f64});
    nn::NamedTensors dict = {{"router", vals({3, 3}, 5)}, {"load", zeros({3}, DType::f64)}};
    for (int e = 0; e < 3; ++e) {
      const std::string pre = "experts." + std::to_string(e) + ".";
      dict.push_back({pre + "w1.weight", vals({2, 3}, 10 * e + 1)});
      dict.push_back({pre + "w2.weight", vals({3, 2}, 10 * e + 3)});
      dict.push_back({pre + "w3.weight", vals({2, 3}, 10 * e + 2)});
    }
    moe.load_state_dict(dict);
    const std::vector<double> y = moe(vals({4, 3}, 0)).to_vector<double>();
    const std::vector<double>& want = top2 ? want_top2 : want_top1;
    REQUIRE(y.size() == want.size());
    for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(want[i]).epsilon(1e-12));
    CHECK(moe.aux_loss.item<double>() == doctest::Approx(top2 ? want_aux2 : want_aux1).epsilon(1e-12));
  }
}

TEST_CASE("MoE: the sparse dispatch equals the dense mixture, values and gradients, for every k") {
  for (const int64_t k : {1, 2, 3, 5}) {
    for (const bool renormalize : {true, false}) {
      INFO("top_k " << k << ", renormalize " << renormalize);
      Generator gen(uint64_t(20 + k));
      MoE moe(6, 8, 5, {.top_k = k, .renormalize = renormalize, .dtype = DType::f64, .generator = &gen});
      Tensor x = randn({2, 7, 6}, DType::f64, &gen).set_requires_grad(true);
      Tensor r = randn({2, 7, 6}, DType::f64, &gen);
      sum(moe(x) * r).backward();
      const Tensor dx = x.grad(), drouter = moe.router.grad(), dw2 = moe.experts->operator[](1).w2->weight.grad();
      moe.zero_grad();
      Tensor x2 = x.detach().set_requires_grad(true);
      const Tensor want = dense_mixture(moe, x2);
      check_close(moe(x.detach()), want, 1e-12);
      sum(want * r).backward();
      check_close(dx, x2.grad(), 1e-10);
      check_close(dw2, moe.experts->operator[](1).w2->weight.grad(), 1e-10);
      check_close(drouter, moe.router.grad(), 1e-10);
      const std::vector<double> g = drouter.to_vector<double>();
      const bool router_learns = std::any_of(g.begin(), g.end(), [](double v) { return v != 0; });
      CHECK(router_learns == !(k == 1 && renormalize));  // top-1 renormalized: p = 1, no gradient
    }
  }
}

TEST_CASE("MoE: an expert no token chooses runs on nothing and gets no gradient") {
  Generator gen(4);
  MoE moe(4, 6, 3, {.top_k = 2, .dtype = DType::f64, .generator = &gen});
  // expert 2's logit is -100 |x| below the others': every token picks experts 0 and 1
  moe.router = from_vector<double>({1, 0, 0, 0, 0, 1, 0, 0, -100, -100, -100, -100}, {3, 4});
  Tensor x = rand({5, 4}, DType::f64, &gen, 0.5, 1.0);
  Tensor y = moe(x);
  check_close(y, dense_mixture(moe, x), 1e-12);
  sum(y).backward();
  CHECK(moe.experts->operator[](0).w1->weight.grad().defined());
  CHECK_FALSE(moe.experts->operator[](2).w1->weight.grad().defined());
  CHECK(moe.load.to_vector<double>() == std::vector<double>{5, 5, 0});
}

// snippet-begin: gradcheck
TEST_CASE("MoE: gradcheck of the input and of every parameter, through the output and aux_loss") {
  Generator gen(3);
  MoE moe(4, 3, 3, {.top_k = 2, .dtype = DType::f64, .generator = &gen});
  // gradcheck perturbs copies of its inputs; the function puts them in the layer's members, so
  // the gradient of every parameter is checked through the module's own forward. The output
  // joins y and the aux loss, so both gradients are checked.
  auto fn = [&moe](const std::vector<Tensor>& in) {
    moe.router = in[1];
    for (size_t e = 0; e < 3; ++e) {
      nn::SwiGLU& expert = (*moe.experts)[e];
      expert.w1->weight = in[2 + 3 * e];
      expert.w2->weight = in[3 + 3 * e];
      expert.w3->weight = in[4 + 3 * e];
    }
    const Tensor y = moe(in[0]);
    return cat({reshape(y, {-1}), reshape(moe.aux_loss, {1})}, 0);
  };
  std::vector<Tensor> inputs = {randn({2, 3, 4}, DType::f64, &gen).set_requires_grad(true)};
  for (const auto& [name, p] : moe.named_parameters()) inputs.push_back(p.detach().set_requires_grad(true));
  REQUIRE(inputs.size() == 11);  // x, router, then w1, w2, w3 of each expert
  testing::GradcheckResult r = testing::gradcheck(fn, inputs);
  INFO(r.message);
  CHECK(r);
  CHECK(r.checked == 24 + 3 * 4 + 3 * (3 * 4 * 3));
}
// snippet-end: gradcheck

TEST_CASE("MoE: the load-balancing loss is 1 for an even load and E when one expert takes every token") {
  MoE moe(2, 4, 4, {.top_k = 1, .renormalize = false, .dtype = DType::f64});
  // token t points along axis t % 2; expert e's router row is e's direction, scaled by 50
  moe.router = from_vector<double>({50, 0, -50, 0, 0, 50, 0, -50}, {4, 2});
  const Tensor even = from_vector<double>({1, 0, -1, 0, 0, 1, 0, -1}, {4, 2});  // one token per expert
  moe(even);
  CHECK(moe.aux_loss.item<double>() == doctest::Approx(1.0).epsilon(1e-12));
  const Tensor skewed = from_vector<double>({1, 0, 1, 0, 1, 0, 1, 0}, {4, 2});  // all to expert 0
  moe(skewed);
  CHECK(moe.aux_loss.item<double>() == doctest::Approx(4.0).epsilon(1e-12));
}

TEST_CASE("MoE: bad arguments and input name the layer and the value") {
  MoE moe(4, 8, 3);
  CHECK(error_of([&] { moe(zeros({2, 5})); }) == "[MoE] expected input of shape [..., 4], got [2,5]");
  CHECK(error_of([&] { moe(zeros({0, 4})); }) == "[MoE] expected at least one token, got input of shape [0,4]");
  CHECK(error_of([&] { moe(full({2, 4}, NAN)); }) ==
        "[MoE] router logit 0 of token 0 is nan: the input is not finite");
  CHECK(error_of([] { MoE bad(4, 0, 3); }) == "[MoE] expected dim > 0 and hidden > 0, got dim = 4, hidden = 0");
  CHECK(error_of([] { MoE bad(4, 8, 3, {.top_k = 4}); }) ==
        "[MoE] expected 1 <= top_k <= num_experts, got top_k = 4, num_experts = 3");
  CHECK(error_of([] { MoE bad(4, 8, 0, {.top_k = 0}); }) ==
        "[MoE] expected 1 <= top_k <= num_experts, got top_k = 0, num_experts = 0");
  CHECK(error_of([] { MoE bad(4, 8, 3, {.dropout = 1.0}); }) == "[MoE] expected 0 <= dropout < 1, got 1");
}

TEST_CASE("MoE: the load buffer counts routing slots in training only, is saved and is not trained") {
  Generator gen(5);
  MoE moe(4, 6, 3, {.top_k = 2, .generator = &gen});
  CHECK_FALSE(moe.load.requires_grad());  // a buffer: no gradient, no optimizer step
  CHECK(moe.parameters().size() == 1 + 3 * 3);
  moe(randn({5, 4}, DType::f32, &gen));
  moe(randn({2, 3, 4}, DType::f32, &gen));
  const std::vector<double> load = moe.load.to_vector<double>();
  CHECK(total(moe.load) == 2 * (5 + 6));  // k slots per token
  moe.eval();
  moe(randn({5, 4}, DType::f32, &gen));
  CHECK(moe.load.to_vector<double>() == load);  // eval: not counted
  // saved: the state dict holds the layer's parameters, then its buffers, then the children's
  const nn::NamedTensors state = moe.state_dict();
  CHECK(state[0].first == "router");
  CHECK(state[1].first == "load");
  MoE restored(4, 6, 3);
  restored.load_state_dict(state);
  CHECK(restored.load.to_vector<double>() == load);
}

TEST_CASE("MoE: dropout only while training, the identity after eval()") {
  Generator gen(9);
  MoE moe(8, 16, 4, {.dropout = 0.5, .dtype = DType::f64, .generator = &gen});
  Tensor x = randn({4, 8}, DType::f64, &gen);
  moe.eval();
  const std::vector<double> e1 = moe(x).to_vector<double>(), e2 = moe(x).to_vector<double>();
  CHECK(e1 == e2);  // eval: deterministic
  moe.train();
  const std::vector<double> t1 = moe(x).to_vector<double>(), t2 = moe(x).to_vector<double>();
  CHECK(t1 != e1);  // training: half the outputs dropped, a fresh mask each call
  CHECK(t1 != t2);
}

// snippet-begin: training
TEST_CASE("MoE: a regressor learns y = x^2 elementwise with every expert in use (loss / 100 in 150 steps)") {
  Generator gen(7);
  MoE moe(4, 16, 4, {.top_k = 2, .generator = &gen});
  optim::AdamW opt(moe.parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  Tensor x = rand({128, 4}, DType::f32, &gen, -1.0, 1.0);
  Tensor target = mul(x, x);
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    Tensor mse = mse_loss(moe(x), target);
    Tensor loss = mse + moe.aux_loss * 0.01;  // Switch's alpha: the router learns to spread tokens
    opt.zero_grad();
    loss.backward();
    opt.step();
    last = mse.item<double>();
    if (step == 0) first = last;
  }
  INFO("loss " << first << " -> " << last);
  CHECK(std::isfinite(last));
  CHECK(last < 0.01 * first);
  // over the 150 steps each expert took at least a tenth of its even share (128 * 2 / 4 a step)
  for (const double served : moe.load.to_vector<double>()) CHECK(served > 0.1 * 150 * 64);
}
// snippet-end: training

// snippet-begin: block
TEST_CASE("MoE: the feed-forward of a TransformerBlock, trained and switched to eval with it") {
  Generator gen(13);
  auto moe = std::make_shared<MoE>(16, 32, 4, MoEOptions{.top_k = 2, .dropout = 0.1, .generator = &gen});
  // the block registers the module as its "mlp" in place of the built-in MLP
  nn::TransformerBlock block(16, 4, moe, {.causal = true, .generator = &gen});
  const nn::NamedTensors params = block.named_parameters();
  CHECK(params[8].first == "mlp.router");
  CHECK(params[9].first == "mlp.experts.0.w1.weight");
  CHECK(names_of(block.named_buffers()) == std::vector<std::string>{"mlp.load"});

  // train the block to halve its input (its residual branches must learn -x/2)
  Tensor x = randn({8, 6, 16}, DType::f32, &gen);
  Tensor target = mul(x, 0.5);
  optim::AdamW opt(block.parameters(), {.lr = 3e-3, .weight_decay = 0.0});
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    Tensor mse = mse_loss(block(x), target);
    Tensor loss = mse + moe->aux_loss * 0.01;  // the block ran the MoE: its aux_loss is this batch's
    opt.zero_grad();
    loss.backward();
    opt.step();
    last = mse.item<double>();
    if (step == 0) first = last;
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.5 * first);
  CHECK(total(moe->load) == 60 * 48 * 2);  // run by the block: 48 tokens, 2 slots each, 60 steps

  block.eval();  // reaches the MoE inside: no dropout, the same output twice, no counting
  CHECK_FALSE(moe->is_training());
  CHECK(block(x).to_vector<double>() == block(x).to_vector<double>());
  CHECK(total(moe->load) == 60 * 48 * 2);
}
// snippet-end: block
