#include "cuda/memory.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/norm.h"
#include "nn/sequential.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

std::vector<std::string> names(const nn::NamedTensors& list) {
  std::vector<std::string> out;
  for (const auto& [n, t] : list) out.push_back(n);
  return out;
}

// A two-level module: a block holding a Sequential and a LayerNorm, plus a buffer of its own.
struct Block : nn::UnaryModule {
  std::shared_ptr<nn::Sequential> mlp;
  std::shared_ptr<nn::LayerNorm> ln;
  Tensor scale;
  explicit Block(uint64_t seed) {
    Generator g(seed);
    mlp = register_module("mlp", std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
                                     std::make_shared<nn::Linear>(3, 4, true, DType::f32, &g),
                                     std::make_shared<nn::ReLU>(),
                                     std::make_shared<nn::Linear>(4, 3, true, DType::f32, &g)}));
    ln = register_module("ln", std::make_shared<nn::LayerNorm>(3));
    scale = register_buffer("scale", full({3}, 2.0));
  }
  Tensor forward(const Tensor& x) override { return mul(ln->forward(mlp->forward(x)), scale); }
};

struct Net : nn::UnaryModule {
  std::shared_ptr<nn::Sequential> blocks;
  explicit Net(uint64_t seed) {
    blocks = register_module("blocks", std::make_shared<nn::Sequential>());
    blocks->push_back(std::make_shared<Block>(seed));
    blocks->push_back(std::make_shared<Block>(seed + 1));
  }
  Tensor forward(const Tensor& x) override { return blocks->forward(x); }
};

}  // namespace

TEST_CASE("module: Sequential(Linear, ReLU, Linear) has PyTorch's names") {
  nn::Sequential s{std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(4, 2)};
  CHECK(names(s.named_parameters()) == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  CHECK(s.num_parameters() == 4 * 3 + 4 + 2 * 4 + 2);
  CHECK(s.parameters().size() == 4);
  for (const Tensor& p : s.parameters()) CHECK(p.requires_grad());
  CHECK(s.size() == 3);
  // the registered tensor and the layer's member are one TensorImpl
  auto first = std::dynamic_pointer_cast<nn::Linear>(s[0]);
  REQUIRE(first);
  CHECK(s.parameters()[0].impl_ptr() == first->weight.impl_ptr());
}

TEST_CASE("module: nested names, buffers and state_dict order") {
  Net net(1);
  CHECK(names(net.named_parameters()) ==
        std::vector<std::string>{"blocks.0.mlp.0.weight", "blocks.0.mlp.0.bias", "blocks.0.mlp.2.weight",
                                 "blocks.0.mlp.2.bias", "blocks.0.ln.weight", "blocks.0.ln.bias",
                                 "blocks.1.mlp.0.weight", "blocks.1.mlp.0.bias", "blocks.1.mlp.2.weight",
                                 "blocks.1.mlp.2.bias", "blocks.1.ln.weight", "blocks.1.ln.bias"});
  CHECK(names(net.named_buffers()) == std::vector<std::string>{"blocks.0.scale", "blocks.1.scale"});
  CHECK(names(net.state_dict()) ==
        std::vector<std::string>{"blocks.0.scale", "blocks.0.mlp.0.weight", "blocks.0.mlp.0.bias",
                                 "blocks.0.mlp.2.weight", "blocks.0.mlp.2.bias", "blocks.0.ln.weight",
                                 "blocks.0.ln.bias", "blocks.1.scale", "blocks.1.mlp.0.weight",
                                 "blocks.1.mlp.0.bias", "blocks.1.mlp.2.weight", "blocks.1.mlp.2.bias",
                                 "blocks.1.ln.weight", "blocks.1.ln.bias"});
  CHECK(net.num_parameters() == 2 * (12 + 4 + 12 + 3 + 3 + 3));
  CHECK_FALSE(net.named_buffers()[0].second.requires_grad());
}

TEST_CASE("module: train/eval propagate to every descendant") {
  Net net(1);
  auto inner = net.blocks->named_children()[1].second;  // blocks.1
  CHECK(net.is_training());
  CHECK(inner->is_training());
  net.eval();
  CHECK_FALSE(net.is_training());
  CHECK_FALSE(inner->is_training());
  CHECK_FALSE(std::dynamic_pointer_cast<Block>(inner)->mlp->named_children()[1].second->is_training());
  net.train();
  CHECK(std::dynamic_pointer_cast<Block>(inner)->ln->is_training());
}

TEST_CASE("module: state_dict round trip reproduces outputs exactly") {
  Net a(1), b(7);
  Tensor x = randn({5, 3});
  CHECK(a.forward(x).to_vector<float>() != b.forward(x).to_vector<float>());  // different inits
  nn::LoadResult r = b.load_state_dict(a.state_dict());
  CHECK(r.ok());
  CHECK(a.forward(x).to_vector<float>() == b.forward(x).to_vector<float>());
  // loaded by value: later changes to a do not reach b, and b's parameters still train
  {
    NoGradGuard no_grad;
    a.parameters()[0].fill_(0.0);
  }
  CHECK(b.parameters()[0].to_vector<float>() != a.parameters()[0].to_vector<float>());
  CHECK(b.parameters()[0].requires_grad());
}

TEST_CASE("module: strict load_state_dict lists every problem at once") {
  Net a(1);
  nn::NamedTensors sd = a.state_dict();
  sd.erase(sd.begin() + 1);                                      // blocks.0.mlp.0.weight missing
  sd.erase(sd.begin() + 5);                                      // blocks.0.ln.bias missing
  sd.emplace_back("blocks.2.ln.weight", ones({3}));              // unexpected
  sd[1].second = zeros({5});                                     // blocks.0.mlp.0.bias: [4] -> [5]
  sd[2].second = zeros({3, 4}, DType::f64);                      // blocks.0.mlp.2.weight: f32 -> f64
  Tensor before = a.parameters()[1].clone();
  AG_CHECK_ERROR(a.load_state_dict(sd), "load_state_dict", "2 missing", "blocks.0.mlp.0.weight", "blocks.0.ln.bias",
                 "1 unexpected", "blocks.2.ln.weight", "2 mismatched", "blocks.0.mlp.0.bias: expected [4] f32, got [5] f32",
                 "blocks.0.mlp.2.weight: expected [3,4] f32, got [3,4] f64");
  // nothing was copied
  CHECK(a.parameters()[1].to_vector<float>() == before.to_vector<float>());

  // non-strict: loads what matches, reports the rest
  Net b(2);
  nn::LoadResult r = b.load_state_dict(sd, false);
  CHECK(r.missing == std::vector<std::string>{"blocks.0.mlp.0.weight", "blocks.0.ln.bias"});
  CHECK(r.unexpected == std::vector<std::string>{"blocks.2.ln.weight"});
  CHECK(r.mismatched.size() == 2);
  CHECK(b.named_parameters()[6].second.to_vector<float>() == a.named_parameters()[6].second.to_vector<float>());
  CHECK(b.named_parameters()[0].second.to_vector<float>() != a.named_parameters()[0].second.to_vector<float>());
}

TEST_CASE("module: registration refuses duplicate, dotted and empty names") {
  nn::Linear l(2, 2);
  AG_CHECK_ERROR(l.register_parameter("weight", zeros({2})), "register_parameter", "'weight'", "already registered");
  AG_CHECK_ERROR(l.register_buffer("bias", zeros({2})), "register_buffer", "'bias'", "already registered");
  AG_CHECK_ERROR(l.register_parameter("a.b", zeros({2})), "register_parameter", "'a.b'", "contains '.'");
  AG_CHECK_ERROR(l.register_module("", std::make_shared<nn::ReLU>()), "register_module", "empty name");
  AG_CHECK_ERROR(l.register_parameter("idx", zeros({2}, DType::i64)), "register_parameter", "'idx'", "i64");
  AG_CHECK_ERROR(l.register_module("weight", std::make_shared<nn::ReLU>()), "register_module", "already registered");
}

TEST_CASE("module: zero_grad clears gradients, to(cpu) is a no-op that keeps identity") {
  nn::Linear l(3, 2);
  sum(l.forward(ones({4, 3}))).backward();
  CHECK(l.weight.grad().defined());
  CHECK(l.bias.grad().defined());
  l.zero_grad();
  CHECK_FALSE(l.weight.grad().defined());
  CHECK_FALSE(l.bias.grad().defined());

  const void* ptr = l.weight.raw_data();
  std::vector<float> w = l.weight.to_vector<float>();
  l.to(Device::cpu());
  CHECK(l.weight.raw_data() == ptr);
  CHECK(l.weight.to_vector<float>() == w);
  CHECK(l.parameters()[0].impl_ptr() == l.weight.impl_ptr());
}

TEST_CASE("module: rebind_storage makes every handle of the impl see the new data") {
  nn::Linear l(2, 2);
  Tensor handle = l.parameters()[0];
  Tensor fresh = tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {3, 2}).mT();  // [2,3]: not the weight's shape
  AG_CHECK_ERROR(nn::rebind_storage(l.weight, fresh), "rebind_storage", "[2,2]", "[2,3]");
  Tensor src = tensor({1.f, 2.f, 3.f, 4.f}, {2, 2}).mT();  // strides (1, 2)
  nn::rebind_storage(l.weight, src);
  CHECK(handle.to_vector<float>() == std::vector<float>{1, 3, 2, 4});
  CHECK(l.weight.requires_grad());
}

TEST_CASE("module: to(cuda) fails cleanly without a GPU, and leaves the module as it was") {
  if (cuda::available()) {  // the move itself: the next case
    MESSAGE("[skipped: no failure to provoke: cuda:0 is usable]");
    return;
  }
  Net net(3);
  Tensor x = randn({2, 3});
  std::vector<float> y = net.forward(x).to_vector<float>();
  auto first = net.named_parameters()[0].second;
  AG_CHECK_ERROR(net.to(Device::cuda(0)), "cuda:0");
  CHECK(first.device() == Device::cpu());
  CHECK(net.forward(x).to_vector<float>() == y);
}

TEST_CASE("module: to(cuda) moves every tensor in place, and to(cpu) brings it back") {
  if (skip_without_gpu()) return;
  Net net(3);
  Tensor x = randn({2, 3});
  std::vector<float> y = net.forward(x).to_vector<float>();
  auto first = net.named_parameters()[0].second;
  sum(net.forward(x)).backward();
  net.to(Device::cuda(0));
  for (const auto& [n, t] : net.state_dict()) CHECK(t.device() == Device::cuda(0));
  CHECK(first.device() == Device::cuda(0));  // the handle taken before the move follows it
  CHECK(first.grad().device() == Device::cuda(0));
  net.to(Device::cpu());
  CHECK(net.forward(x).to_vector<float>() == y);
}
