// TransformerBlock with a feed-forward module of one's own in place of its MLP: the module is
// registered as "mlp" (its parameters and buffers named under it), run on ln2's output, trained,
// switched to eval and moved with the block; the attention part is built as in the default block.
#include "nn/linear.h"
#include "nn/transformer.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

// y = scale * relu(fc(x)) * keep: a parameter of its own (scale), a child Linear, a buffer (keep,
// not trained) and a flag that follows train()/eval() (eval doubles nothing; train records calls).
struct ScaledRelu : nn::UnaryModule {
  std::shared_ptr<nn::Linear> fc;
  Tensor scale, keep;
  int training_calls = 0;

  ScaledRelu(int64_t d, DType dtype, Generator* gen) {
    fc = register_module("fc", std::make_shared<nn::Linear>(d, d, true, dtype, gen));
    scale = register_parameter("scale", full({d}, 0.5, dtype));
    keep = register_buffer("keep", ones({d}, dtype));
  }
  Tensor forward(const Tensor& x) override {
    if (is_training()) ++training_calls;
    return relu(fc->forward(x)) * scale * keep;
  }
};

std::vector<std::string> names_of(const nn::NamedTensors& ts) {
  std::vector<std::string> n;
  for (const auto& [name, t] : ts) n.push_back(name);
  return n;
}

}  // namespace

TEST_CASE("TransformerBlock: a feed-forward of one's own, registered as mlp") {
  Generator gen(4);
  auto ffn = std::make_shared<ScaledRelu>(4, DType::f64, &gen);
  nn::TransformerBlock block(4, 2, ffn, 0.0, true, false, DType::f64, &gen);
  CHECK(block.mlp == nullptr);
  CHECK(block.feed_forward == ffn);
  CHECK(names_of(block.named_parameters()) ==
        std::vector<std::string>{"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                                 "attn.proj.bias", "ln2.weight", "ln2.bias", "mlp.scale", "mlp.fc.weight",
                                 "mlp.fc.bias"});
  CHECK(names_of(block.named_buffers()) == std::vector<std::string>{"mlp.keep"});
  const std::vector<std::string> saved = names_of(block.state_dict());  // the buffer is saved too
  CHECK(std::vector<std::string>(saved.end() - 4, saved.end()) ==
        std::vector<std::string>{"mlp.scale", "mlp.keep", "mlp.fc.weight", "mlp.fc.bias"});

  // x + attn(ln1(x)), then h + ffn(ln2(h)), composed by hand
  Tensor x = leaf64({2, 3, 4}, 9);
  nn::AttentionOptions causal;
  causal.causal = true;
  Tensor h = x + block.attn->forward(block.ln1->forward(x), causal).out;
  check_close(block.forward(x), h + ffn->forward(block.ln2->forward(h)), 1e-12, 1e-12);

  // gradients reach the module's own parameter and its child's; the buffer is not trained
  block.zero_grad();
  sum(block.forward(x)).backward();
  CHECK(ffn->scale.grad().defined());
  CHECK(ffn->fc->weight.grad().defined());
  CHECK_FALSE(ffn->keep.requires_grad());

  // train()/eval() reach it
  const int calls = ffn->training_calls;
  block.eval();
  CHECK_FALSE(ffn->is_training());
  block.forward(x);
  CHECK(ffn->training_calls == calls);
  block.train();
  block.forward(x);
  CHECK(ffn->training_calls == calls + 1);
}

TEST_CASE("TransformerBlock: with its own feed-forward, the attention part draws and names as the default block") {
  // Both constructors build ln1, attn, ln2 first, from the same generator draws, so the attention
  // weights of a block do not depend on which feed-forward it has.
  Generator g1(7), g2(7);
  nn::TransformerBlock plain(8, 2, 16, 0.0, false, false, DType::f32, &g1);
  nn::TransformerBlock custom(8, 2, std::make_shared<nn::Linear>(8, 8), 0.0, false, false, DType::f32, &g2);
  check_close(custom.attn->qkv->weight, plain.attn->qkv->weight, 0, 0);
  check_close(custom.attn->proj->weight, plain.attn->proj->weight, 0, 0);
  CHECK(plain.feed_forward == plain.mlp);
  CHECK(names_of(custom.named_parameters()).back() == "mlp.bias");
}

TEST_CASE("TransformerBlock: a null feed-forward is an error") {
  AG_CHECK_ERROR(nn::TransformerBlock(4, 2, std::shared_ptr<nn::UnaryModule>(), 0.0), "TransformerBlock",
                 "feed-forward module is null");
}
