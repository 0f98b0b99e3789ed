// SwiGLU: parameter and buffer names and shapes, known values (computed by hand in f64 from the
// formula), gradcheck for the input and every weight, the buffer (saved, moved, not trained, pruning),
// dropout in training only, bad arguments, a small regression it learns, and the layer as the
// feed-forward of a TransformerBlock.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attograd.h"
#include "autograd/testing.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "swiglu.h"

using namespace ag;
using ext::SwiGLU;
using ext::SwiGLUOptions;

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

}  // namespace

TEST_CASE("SwiGLU: PyTorch's parameter names and shapes, no bias by default") {
  SwiGLU ffn(8, 24);
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  for (const auto& [name, p] : ffn.named_parameters()) {
    names.push_back(name);
    shapes.push_back(p.shape());
  }
  // the layer's own tensors first, then each child's (registration order within each)
  CHECK(names == std::vector<std::string>{"gamma", "w1.weight", "w2.weight", "w3.weight"});
  CHECK(shapes == std::vector<Shape>{{8}, {24, 8}, {8, 24}, {24, 8}});
  CHECK(ffn.num_parameters() == 8 + 3 * 8 * 24);
  CHECK(names_of(ffn.named_buffers()) == std::vector<std::string>{"mask"});
  CHECK(ffn.mask.shape() == Shape{24});
  CHECK(ffn(zeros({2, 5, 8})).shape() == Shape{2, 5, 8});

  SwiGLU biased(8, 24, {.bias = true});
  CHECK(biased.named_parameters().size() == 7);
  CHECK(biased.named_parameters()[2].first == "w1.bias");
}

TEST_CASE("SwiGLU: known values") {
  // dim 3, hidden 2, f64: w1 = vals((2,3),1), w3 = vals((2,3),2), w2 = vals((3,2),3), x = vals((2,3),0);
  // y = (silu(x w1^T) * (x w3^T)) w2^T, evaluated term by term in f64.
  // (gamma and mask at their initial values: ones)
  SwiGLU ffn(3, 2, {.dtype = DType::f64});
  ffn.load_state_dict({{"gamma", ones({3}, DType::f64)},
                       {"w1.weight", vals({2, 3}, 1)},
                       {"w2.weight", vals({3, 2}, 3)},
                       {"w3.weight", vals({2, 3}, 2)},
                       {"mask", ones({2}, DType::f64)}});
  const std::vector<double> y = ffn(vals({2, 3}, 0)).to_vector<double>();
  const std::vector<double> want = {-0.0078991519547719161, 0.0079158191105236989, -0.0056668007842495599,
                                    0.0058614197987657711,  -0.010297196153159599, 0.011785683350987119};
  REQUIRE(y.size() == want.size());
  for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(want[i]).epsilon(1e-12));
}

// snippet-begin: gradcheck
TEST_CASE("SwiGLU: gradcheck of the input and of every weight and bias") {
  Generator gen(3);
  SwiGLU ffn(4, 6, {.bias = true, .layer_scale = 0.7, .dtype = DType::f64, .gen = &gen});
  // gradcheck perturbs copies of its inputs; the function puts them in the layer's members, so
  // the gradient of every parameter is checked through the module's own forward.
  auto fn = [&ffn](const std::vector<Tensor>& in) {
    ffn.gamma = in[1];
    ffn.w1->weight = in[2];
    ffn.w1->bias = in[3];
    ffn.w2->weight = in[4];
    ffn.w2->bias = in[5];
    ffn.w3->weight = in[6];
    ffn.w3->bias = in[7];
    return ffn(in[0]);
  };
  std::vector<Tensor> inputs = {randn({2, 3, 4}, DType::f64, &gen).set_requires_grad(true)};
  for (const auto& [name, p] : ffn.named_parameters()) inputs.push_back(p.detach().set_requires_grad(true));
  REQUIRE(inputs.size() == 8);  // x, then gamma, w1.weight, w1.bias, w2.weight, w2.bias, w3.weight, w3.bias
  testing::GradcheckResult r = testing::gradcheck(fn, inputs);
  INFO(r.message);
  CHECK(r);
  CHECK(r.checked == 24 + 4 + (6 * 4 + 6) + (4 * 6 + 4) + (6 * 4 + 6));
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
  message.clear();
  try {
    SwiGLU bad(4, 8, {.dropout = 1.0});
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message == "[SwiGLU] expected 0 <= dropout < 1, got 1");
}

TEST_CASE("SwiGLU: the mask buffer is saved and not trained, and a 0 in it prunes that hidden unit") {
  Generator gen(5);
  SwiGLU ffn(4, 6, {.dtype = DType::f64, .gen = &gen});
  CHECK_FALSE(ffn.mask.requires_grad());  // a buffer: no gradient, no optimizer step
  CHECK(ffn.parameters().size() == 4);    // gamma, w1, w2, w3: the mask is not among them
  // but it is saved: the state dict holds the layer's parameters, then its buffers, then the children's
  nn::NamedTensors weights = ffn.state_dict();
  CHECK(names_of(weights) == std::vector<std::string>{"gamma", "mask", "w1.weight", "w2.weight", "w3.weight"});

  // mask[2] = 0 gives the output of the same layer whose w2 has no column 2
  Tensor x = randn({3, 4}, DType::f64, &gen);
  SwiGLU pruned(4, 6, {.dtype = DType::f64});
  weights[1].second = from_vector<double>({1, 1, 0, 1, 1, 1});
  pruned.load_state_dict(weights);
  ffn.w2->weight = mul(ffn.w2->weight.detach(), from_vector<double>({1, 1, 0, 1, 1, 1}));  // column 2 zeroed
  const std::vector<double> a = pruned(x).to_vector<double>(), b = ffn(x).to_vector<double>();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-12));
}

TEST_CASE("SwiGLU: dropout only while training, the identity after eval()") {
  Generator gen(9);
  SwiGLU ffn(8, 32, {.dropout = 0.5, .dtype = DType::f64, .gen = &gen});
  Tensor x = randn({4, 8}, DType::f64, &gen);
  ffn.eval();
  const std::vector<double> e1 = ffn(x).to_vector<double>(), e2 = ffn(x).to_vector<double>();
  CHECK(e1 == e2);  // eval: deterministic
  ffn.train();
  const std::vector<double> t1 = ffn(x).to_vector<double>(), t2 = ffn(x).to_vector<double>();
  CHECK(t1 != e1);  // training: half the hidden units dropped, a fresh mask each call
  CHECK(t1 != t2);
}

// snippet-begin: training
TEST_CASE("SwiGLU: a regressor learns y = x^2 elementwise (the loss falls 100x in 150 AdamW steps)") {
  Generator gen(7);
  SwiGLU ffn(4, 32, {.bias = true, .gen = &gen});
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

// snippet-begin: block
TEST_CASE("SwiGLU: the feed-forward of a TransformerBlock, trained and switched to eval with it") {
  Generator gen(13);
  auto ffn = std::make_shared<SwiGLU>(16, 32, SwiGLUOptions{.dropout = 0.1, .layer_scale = 0.5, .gen = &gen});
  // the block registers the module as its "mlp" in place of the built-in MLP
  nn::TransformerBlock block(16, 4, ffn, 0.0, /*causal=*/true, /*cross=*/false, DType::f32, &gen);
  const nn::NamedTensors params = block.named_parameters();
  CHECK(params[8].first == "mlp.gamma");
  CHECK(params[9].first == "mlp.w1.weight");
  CHECK(names_of(block.named_buffers()) == std::vector<std::string>{"mlp.mask"});

  // train the block to halve its input (its residual branches must learn -x/2)
  Tensor x = randn({8, 6, 16}, DType::f32, &gen);
  Tensor target = mul(x, 0.5);
  optim::AdamW opt(block.parameters(), {.lr = 3e-3, .weight_decay = 0.0});
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    Tensor loss = mse_loss(block(x), target);
    opt.zero_grad();
    loss.backward();
    opt.step();
    last = loss.item<double>();
    if (step == 0) first = last;
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.5 * first);
  CHECK(ffn->gamma.to_vector<double>() != std::vector<double>(16, 0.5));  // trained with the block
  CHECK(ffn->mask.to_vector<double>() == std::vector<double>(32, 1.0));   // a buffer: untouched

  block.eval();  // reaches the SwiGLU inside: no dropout, the same output twice
  CHECK_FALSE(ffn->is_training());
  CHECK(block(x).to_vector<double>() == block(x).to_vector<double>());
}
// snippet-end: block
