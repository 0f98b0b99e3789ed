// SwiGLU: parameter names and shapes, known values (computed by hand in f64 from the formula),
// gradcheck for the input and every weight, a bad input, and a small regression it learns.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attograd.h"
#include "autograd/testing.h"
#include "optim/adam.h"
#include "swiglu.h"

using namespace ag;
using ext::SwiGLU;

namespace {

// v_k = 0.5 sin(1.3 k + phase), k the row-major index: inputs and weights anyone can rebuild.
Tensor vals(const Shape& shape, double phase) {
  std::vector<double> v(size_t(shape.numel()));
  for (size_t k = 0; k < v.size(); ++k) v[k] = 0.5 * std::sin(1.3 * double(k) + phase);
  return from_vector(v, shape);
}

}  // namespace

TEST_CASE("SwiGLU: PyTorch's parameter names and shapes, no bias by default") {
  SwiGLU ffn(8, 24);
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  for (const auto& [name, p] : ffn.named_parameters()) {
    names.push_back(name);
    shapes.push_back(p.shape());
  }
  CHECK(names == std::vector<std::string>{"w1.weight", "w2.weight", "w3.weight"});
  CHECK(shapes == std::vector<Shape>{{24, 8}, {8, 24}, {24, 8}});
  CHECK(ffn.num_parameters() == 3 * 8 * 24);
  CHECK(ffn(zeros({2, 5, 8})).shape() == Shape{2, 5, 8});

  SwiGLU biased(8, 24, true);
  CHECK(biased.named_parameters().size() == 6);
  CHECK(biased.named_parameters()[1].first == "w1.bias");
}

TEST_CASE("SwiGLU: known values") {
  // dim 3, hidden 2, f64: w1 = vals((2,3),1), w3 = vals((2,3),2), w2 = vals((3,2),3), x = vals((2,3),0);
  // y = (silu(x w1^T) * (x w3^T)) w2^T, evaluated term by term in f64.
  SwiGLU ffn(3, 2, false, DType::f64);
  ffn.load_state_dict({{"w1.weight", vals({2, 3}, 1)}, {"w2.weight", vals({3, 2}, 3)}, {"w3.weight", vals({2, 3}, 2)}});
  const std::vector<double> y = ffn(vals({2, 3}, 0)).to_vector<double>();
  const std::vector<double> want = {-0.0078991519547719161, 0.0079158191105236989, -0.0056668007842495599,
                                    0.0058614197987657711,  -0.010297196153159599, 0.011785683350987119};
  REQUIRE(y.size() == want.size());
  for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(want[i]).epsilon(1e-12));
}

// snippet-begin: gradcheck
TEST_CASE("SwiGLU: gradcheck of the input and of every weight and bias") {
  Generator gen(3);
  SwiGLU ffn(4, 6, true, DType::f64, &gen);
  // gradcheck perturbs copies of its inputs; the function puts them in the layer's members, so
  // the gradient of every parameter is checked through the module's own forward.
  auto fn = [&ffn](const std::vector<Tensor>& in) {
    ffn.w1->weight = in[1];
    ffn.w1->bias = in[2];
    ffn.w2->weight = in[3];
    ffn.w2->bias = in[4];
    ffn.w3->weight = in[5];
    ffn.w3->bias = in[6];
    return ffn(in[0]);
  };
  std::vector<Tensor> inputs = {randn({2, 3, 4}, DType::f64, &gen).set_requires_grad(true)};
  for (const auto& [name, p] : ffn.named_parameters()) inputs.push_back(p.detach().set_requires_grad(true));
  REQUIRE(inputs.size() == 7);  // x, then w1.weight, w1.bias, w2.weight, w2.bias, w3.weight, w3.bias
  testing::GradcheckResult r = testing::gradcheck(fn, inputs);
  INFO(r.message);
  CHECK(r);
  CHECK(r.checked == 24 + (6 * 4 + 6) + (4 * 6 + 4) + (6 * 4 + 6));
}
// snippet-end: gradcheck

TEST_CASE("SwiGLU: an input of the wrong width names the layer and the shape") {
  SwiGLU ffn(4, 8);
  std::string message;
  try {
    ffn(zeros({2, 5}));
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message == "[SwiGLU] expected input of shape [..., 4], got [2,5]");
  message.clear();
  try {
    SwiGLU bad(4, 0);
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message == "[SwiGLU] expected dim > 0 and hidden > 0, got dim = 4, hidden = 0");
}

// snippet-begin: training
TEST_CASE("SwiGLU: a regressor learns y = x^2 elementwise (the loss falls 100x in 150 AdamW steps)") {
  Generator gen(7);
  SwiGLU ffn(4, 32, true, DType::f32, &gen);
  optim::AdamW opt(ffn.parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  Tensor x = rand({128, 4}, DType::f32, &gen, -1.0, 1.0);
  Tensor target = mul(x, x);
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    Tensor loss = mse_loss(ffn(x), target);
    opt.zero_grad();
    loss.backward();
    opt.step();
    last = loss.item<double>();
    if (step == 0) first = last;
  }
  INFO("loss " << first << " -> " << last);
  CHECK(std::isfinite(last));
  CHECK(last < 0.01 * first);
}
// snippet-end: training
