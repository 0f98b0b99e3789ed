// Layers vs PyTorch. Weights and inputs are the formula vals(shape, phase)[k] = 0.5 sin(1.3 k + phase),
// computed the same way by tools/make_layers_reference.py, which printed the expected outputs
// pasted below (PyTorch 1.13, computed in f64; compared here in f32 at 1e-5).
//
// Gradchecks substitute the f64 inputs gradcheck perturbs for a layer's members (lin.weight = in[1]):
// forward reads the members, so the gradient of every parameter is checked through the real forward.
#include <cmath>

#include "nn/activation.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/mlp.h"
#include "nn/norm.h"
#include "nn/positional.h"
#include "nn/sequential.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {


}  // namespace

TEST_CASE("Linear: matches PyTorch") {
  nn::Linear lin(3, 2);
  CHECK(lin.load_state_dict({{"weight", vals({2, 3}, 1)}, {"bias", vals({2}, 2)}}).ok());
  check_close(lin.forward(vals({2, 3}, 0)), {0.57725133, 0.0219968531, 0.121466963, 0.158848634}, 1e-5, 1e-5);
  // leading batch dims pass through: (2, 1, 3) -> (2, 1, 2)
  CHECK(lin.forward(vals({2, 1, 3}, 0)).shape() == Shape{2, 1, 2});
  nn::Linear nobias(3, 2, false);
  CHECK(nobias.named_parameters().size() == 1);
  CHECK_FALSE(nobias.bias.defined());
  AG_CHECK_ERROR(lin.forward(zeros({2, 4})), "Linear", "[..., 3]", "[2,4]");
}

TEST_CASE("Linear: gradcheck w.r.t. input, weight and bias") {
  nn::Linear lin(3, 2, true, DType::f64);
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        lin.weight = in[1], lin.bias = in[2];
        return lin.forward(in[0]);
      },
      {leaf64({2, 2, 3}, 1), leaf64({2, 3}, 2), leaf64({2}, 3)});
  nn::Linear nobias(3, 2, false, DType::f64);
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        nobias.weight = in[1];
        return nobias.forward(in[0].mT());  // a transposed (non-contiguous) input
      },
      {leaf64({3, 4}, 4), leaf64({2, 3}, 5)});
}

TEST_CASE("Linear: init is U(-1/sqrt(in), 1/sqrt(in)) for weight and bias") {
  Generator g(5);
  nn::Linear lin(400, 300, true, DType::f32, &g);
  const double bound = 1.0 / std::sqrt(400.0);
  for (const Tensor& t : {lin.weight, lin.bias}) {
    std::vector<float> v = t.to_vector<float>();
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    CHECK(*lo >= -bound);
    CHECK(*hi < bound);
    CHECK(*hi > 0.97 * bound);
    CHECK(*lo < -0.97 * bound);
  }
  double s2 = 0;
  for (float w : lin.weight.to_vector<float>()) s2 += double(w) * w;
  CHECK(std::abs(std::sqrt(s2 / (400.0 * 300.0)) - bound / std::sqrt(3.0)) < 0.01 * bound);  // std of U(-b, b)
}

TEST_CASE("Sequential: Linear-ReLU-Linear matches PyTorch") {
  nn::Sequential s{std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(4, 2)};
  CHECK(s.load_state_dict({{"0.weight", vals({4, 3}, 1)},
                           {"0.bias", vals({4}, 2)},
                           {"2.weight", vals({2, 4}, 3)},
                           {"2.bias", vals({2}, 4)}})
            .ok());
  check_close(s.forward(vals({2, 3}, 0)), {-0.318009563, -0.168557367, -0.442596392, -0.364968706}, 1e-5, 1e-5);
  AG_CHECK_ERROR(s[3], "Sequential", "index 3", "3 modules");
}

TEST_CASE("Embedding: matches PyTorch, padding row gets no gradient") {
  nn::Embedding emb(5, 3, 1);
  CHECK(emb.load_state_dict({{"weight", vals({5, 3}, 1)}}).ok());
  Tensor idx = tensor<int64_t>({0, 1, 4, 3, 1, 0}, {2, 3});
  Tensor y = emb.forward(idx);
  CHECK(y.shape() == Shape{2, 3, 3});
  // forward returns the padding row's stored value (not zeros), as PyTorch does
  check_close(y, {0.420735492, 0.372852606, -0.221260222, -0.491226306, -0.0415447014, 0.468999988,
                  -0.389176039, -0.406578556, 0.171657464, 0.0666160207, 0.495303678, 0.198370287,
                  -0.491226306, -0.0415447014, 0.468999988, 0.420735492, 0.372852606, -0.221260222},
              1e-6, 1e-5);
  y.backward(vals({2, 3, 3}, 2));
  check_close(emb.weight.grad(), {0.690468215, -0.440620225, -0.926199003, 0, 0, 0, 0, 0, 0, 0.452977371,
                                  0.32514392, -0.279026136, -0.183239565, -0.497276294, -0.0828020877},
              1e-6, 1e-5);
}

TEST_CASE("Embedding: init N(0, 1) with a zero padding row, negative padding_idx, gradcheck") {
  Generator g(2);
  nn::Embedding emb(200, 50, -1, DType::f32, &g);
  CHECK(emb.padding_idx == 199);
  CHECK(sum(abs(emb.weight.select(0, 199))).item<double>() == 0.0);
  std::vector<float> v = emb.weight.narrow(0, 0, 199).contiguous().to_vector<float>();
  double m = 0, s2 = 0;
  for (float w : v) m += w, s2 += double(w) * w;
  m /= double(v.size());
  CHECK(std::abs(m) < 0.03);
  CHECK(std::abs(std::sqrt(s2 / double(v.size()) - m * m) - 1.0) < 0.03);
  AG_CHECK_ERROR(nn::Embedding(5, 3, 5), "Embedding", "padding_idx 5", "5 embeddings");

  // gradcheck without padding: with it, the padding row's gradient is zero by definition (not the
  // true derivative, which finite differences would see)
  nn::Embedding e64(4, 3, std::nullopt, DType::f64);
  Tensor idx = tensor<int64_t>({2, 0, 3, 0, 2}, {5});
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        e64.weight = in[0];
        return e64.forward(idx);
      },
      {leaf64({4, 3}, 3)});
  // with padding_idx = 2 the padding row is exactly zero in the gradient; row 0 (used twice) gets 2 * 3
  nn::Embedding padded(4, 3, 2, DType::f64);
  Tensor w = leaf64({4, 3}, 4);
  padded.weight = w;
  sum(mul(padded.forward(idx), 3.0)).backward();
  CHECK(w.grad().select(0, 2).to_vector<double>() == std::vector<double>{0, 0, 0});
  CHECK(w.grad().select(0, 0).to_vector<double>() == std::vector<double>{6, 6, 6});
}

TEST_CASE("LayerNorm: matches PyTorch, gradcheck") {
  nn::LayerNorm ln(4);
  CHECK(ln.weight.to_vector<float>() == std::vector<float>{1, 1, 1, 1});
  CHECK(ln.bias.to_vector<float>() == std::vector<float>{0, 0, 0, 0});
  CHECK(ln.load_state_dict({{"weight", vals({4}, 1)}, {"bias", vals({4}, 2)}}).ok());
  check_close(ln.forward(mul(vals({2, 4}, 0), 3.0)),
              {0.319214295, 0.385704399, -0.611220964, 0.520936426, -0.197593162, -0.0496936048, -0.771117031,
               -0.301096666},
              1e-5, 1e-5);
  nn::LayerNorm plain(4, 1e-5, false);
  CHECK(plain.num_parameters() == 0);

  nn::LayerNorm l64(Shape{2, 3}, 1e-5, true, DType::f64);
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        l64.weight = in[1], l64.bias = in[2];
        return l64.forward(in[0]);
      },
      {leaf64({2, 2, 3}, 1), leaf64({2, 3}, 2), leaf64({2, 3}, 3)});
}

TEST_CASE("RMSNorm: matches the PyTorch formula, gradcheck") {
  nn::RMSNorm rms(4);
  CHECK(rms.eps == 1e-6);
  CHECK(rms.load_state_dict({{"weight", vals({4}, 1)}}).ok());
  check_close(rms.forward(mul(vals({2, 4}, 0), 3.0)),
              {0, 0.556480507, -0.17667211, 0.523307848, -0.535711538, 0.115599388, -0.318425509, -0.225914329},
              1e-5, 1e-5);
  AG_CHECK_ERROR(rms.forward(zeros({2, 3})), "RMSNorm", "[..., 4]", "[2,3]");

  nn::RMSNorm r64(3, 1e-6, DType::f64);
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        r64.weight = in[1];
        return r64.forward(in[0]);
      },
      {leaf64({2, 3}, 1), leaf64({3}, 2)});
  // the same tensor twice: x normalised and then scaled by itself
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        r64.weight = in[0].select(0, 0);
        return r64.forward(in[0]);
      },
      {leaf64({2, 3}, 3)});
}

TEST_CASE("activations: ReLU, GELU, SiLU modules match PyTorch") {
  Tensor a = tensor({-2.f, -0.5f, 0.f, 0.5f, 2.f});
  CHECK(nn::ReLU().forward(a).to_vector<float>() == std::vector<float>{0, 0, 0, 0.5f, 2});
  check_close(nn::GELU().forward(a), {-0.0455002639, -0.154268769, 0, 0.345731231, 1.95449974}, 1e-6, 1e-5);
  check_close(nn::GELU("tanh").forward(a), {-0.0454023059, -0.15428599, 0, 0.34571401, 1.95459769}, 1e-6, 1e-5);
  check_close(nn::SiLU().forward(a), {-0.238405844, -0.188770334, 0, 0.311229666, 1.76159416}, 1e-6, 1e-5);
  AG_CHECK_ERROR(nn::GELU("fast"), "GELU", "'fast'");
}

TEST_CASE("Dropout: scales kept values in training, identity in eval") {
  Generator g(11);
  nn::Dropout drop(0.25, &g);
  Tensor x = ones({4000});
  std::vector<float> y = drop.forward(x).to_vector<float>();
  int64_t zeros_n = 0;
  for (float v : y) {
    CHECK((v == 0.f || std::abs(v - 1.f / 0.75f) < 1e-6));
    zeros_n += v == 0.f;
  }
  CHECK(std::abs(double(zeros_n) / 4000.0 - 0.25) < 0.03);
  drop.eval();
  CHECK(drop.forward(x).to_vector<float>() == x.to_vector<float>());
  AG_CHECK_ERROR(nn::Dropout(1.0), "Dropout", "[0, 1)", "1");
}

TEST_CASE("MLP: fc1-GELU-fc2 matches PyTorch, names, gradcheck") {
  nn::MLP mlp(4, 6, {.dropout = 0.1});
  std::vector<std::string> names;
  for (const auto& [n, t] : mlp.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
  CHECK(mlp.load_state_dict({{"fc1.weight", vals({6, 4}, 1)},
                             {"fc1.bias", vals({6}, 2)},
                             {"fc2.weight", vals({4, 6}, 3)},
                             {"fc2.bias", vals({4}, 4)}})
            .ok());
  mlp.eval();  // no dropout
  check_close(mlp.forward(mul(vals({2, 4}, 0), 3.0)),
              {-0.851119043, -1.38213077, 0.524246924, 1.5052303, -0.660590322, 0.211564003, 0.505695145,
               -0.09046641},
              1e-5, 1e-5);

  nn::MLP m64(3, 4, {.dtype = DType::f64});
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        m64.fc1->weight = in[1], m64.fc1->bias = in[2], m64.fc2->weight = in[3], m64.fc2->bias = in[4];
        return m64.forward(in[0]);
      },
      {leaf64({2, 3}, 1), leaf64({4, 3}, 2), leaf64({4}, 3), leaf64({3, 4}, 4), leaf64({3}, 5)});
}

TEST_CASE("positional: sinusoidal_positions matches the PyTorch formula") {
  check_close(nn::sinusoidal_positions(4, 6),
              {0, 1, 0, 1, 0, 1, 0.841470985, 0.540302306, 0.0463992235, 0.998922976, 0.00215443302, 0.999997679,
               0.909297427, -0.416146837, 0.0926985008, 0.995694224, 0.00430885605, 0.999990717, 0.141120008,
               -0.989992497, 0.138798101, 0.990320699, 0.00646325907, 0.999979113},
              1e-7, 1e-6);
  CHECK(nn::sinusoidal_positions(3, 5, DType::f64).dtype() == DType::f64);
  AG_CHECK_ERROR(nn::sinusoidal_positions(3, 0), "sinusoidal_positions", "d = 0");
}

TEST_CASE("positional: LearnedPositions returns rows start..start+T and trains only those") {
  nn::LearnedPositions pos(8, 3);
  CHECK(pos.named_parameters()[0].first == "weight");
  Tensor p = pos.forward(2, 5);
  CHECK(p.shape() == Shape{2, 3});
  CHECK(p.to_vector<float>() == pos.weight.narrow(0, 5, 2).contiguous().to_vector<float>());
  sum(p).backward();
  std::vector<float> g = pos.weight.grad().to_vector<float>();
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t c = 0; c < 3; ++c) CHECK(g[size_t(r * 3 + c)] == (r == 5 || r == 6 ? 1.f : 0.f));
  AG_CHECK_ERROR(pos.forward(4, 6), "LearnedPositions", "[6, 10)", "max_len 8");
}
