// TransformerBlock with a feed-forward module of one's own in place of its MLP: the module is
// registered as "mlp" (its parameters and buffers named under it), run on ln2's output, trained,
// switched to eval and moved with the block; the attention part is built as in the default block.
// And the built-in choices of TransformerBlock::Options: SwiGLU (PyTorch values from
// tools/make_layers_reference.py, 9 significant digits) and RMSNorm.
#include "nn/linear.h"
#include "nn/norm.h"
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
  nn::TransformerBlock block(4, 2, ffn, {.causal = true, .dtype = DType::f64, .generator = &gen});
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
  nn::TransformerBlock plain(8, 2, {.mlp_hidden = 16, .generator = &g1});
  nn::TransformerBlock custom(8, 2, std::make_shared<nn::Linear>(8, 8), {.generator = &g2});
  check_close(custom.attn->qkv->weight, plain.attn->qkv->weight, 0, 0);
  check_close(custom.attn->proj->weight, plain.attn->proj->weight, 0, 0);
  CHECK(plain.feed_forward == plain.mlp);
  CHECK(names_of(custom.named_parameters()).back() == "mlp.bias");
}

TEST_CASE("TransformerBlock: a null feed-forward is an error") {
  AG_CHECK_ERROR(nn::TransformerBlock(4, 2, std::shared_ptr<nn::UnaryModule>()), "TransformerBlock",
                 "feed-forward module is null");
}

TEST_CASE("TransformerBlock: options reach the sublayers, mlp_hidden 0 is 4 d_model, conflicts are errors") {
  nn::TransformerBlock plain(8, 2);
  CHECK(plain.options.mlp_hidden == 4 * 8);
  CHECK(plain.mlp->fc1->weight.shape() == Shape{32, 8});
  // dropout, dtype and generator are the block's, for every sublayer; bias and kv_heads come from
  // .attention, for both attentions
  Generator g(5);
  nn::TransformerBlock block(8, 4,
                             {.mlp_hidden = 12,
                              .dropout = 0.25,
                              .cross = true,
                              .attention = {.bias = false, .kv_heads = 2},
                              .dtype = DType::f64,
                              .generator = &g});
  for (const nn::MultiHeadAttention* a : {block.attn.get(), block.cross_attn.get()}) {
    CHECK(a->options.dropout == 0.25);
    CHECK(a->options.dtype == DType::f64);
    CHECK(a->options.generator == &g);
    CHECK(a->kv_heads == 2);
    CHECK_FALSE(a->qkv->bias.defined());
    CHECK(a->qkv->weight.dtype() == DType::f64);
  }
  CHECK(block.mlp->drop->p == 0.25);
  CHECK(block.mlp->drop->gen == &g);
  CHECK(block.mlp->fc1->weight.shape() == Shape{12, 8});
  // the same value in both places is no conflict; a different one is
  CHECK(nn::TransformerBlock(8, 2, {.dropout = 0.1, .attention = {.dropout = 0.1}}).attn->options.dropout == 0.1);
  AG_CHECK_ERROR(nn::TransformerBlock(8, 2, {.attention = {.dropout = 0.1}}), "TransformerBlock",
                 "attention dropout 0.1", "set them on the block");
  AG_CHECK_ERROR(nn::TransformerBlock(8, 2, {.attention = {.dtype = DType::f64}}), "TransformerBlock", "dtype f64");
  AG_CHECK_ERROR(nn::TransformerBlock(8, 2, {.attention = {.generator = &g}}), "TransformerBlock", "generator");
  AG_CHECK_ERROR(nn::TransformerBlock(8, 2, {.mlp_hidden = -1}), "TransformerBlock", "mlp_hidden", "-1");
  // a block given its own feed-forward has no built-in MLP to size or choose
  AG_CHECK_ERROR(nn::TransformerBlock(8, 2, std::make_shared<nn::Linear>(8, 8), {.mlp_hidden = 16}), "mlp_hidden 16",
                 "its own feed-forward");
  AG_CHECK_ERROR(nn::TransformerBlock(8, 2, std::make_shared<nn::Linear>(8, 8), {.mlp = "swiglu"}), "mlp 'swiglu'",
                 "its own feed-forward");
}

TEST_CASE("SwiGLU: matches PyTorch (LLaMA's FeedForward), gradcheck of every weight") {
  nn::SwiGLU ffn(4, 6, {.dtype = DType::f64});
  REQUIRE(ffn.load_state_dict({{"w1.weight", vals({6, 4}, 1.0, DType::f64)},
                               {"w2.weight", vals({4, 6}, 2.0, DType::f64)},
                               {"w3.weight", vals({6, 4}, 3.0, DType::f64)}})
              .ok());
  CHECK(names_of(ffn.named_parameters()) == std::vector<std::string>{"w1.weight", "w2.weight", "w3.weight"});
  Tensor x = vals({2, 3, 4}, 0.0, DType::f64).set_requires_grad();
  const Tensor y = ffn.forward(x);
  check_close(y, from_vector<double>({
      -0.025533411, -0.00789934184, 0.0246809864, 0.0105626878, 0.0132579833, 0.0382800011, -0.00912715614,
      -0.0392649202, 0.0308548276, 0.0113323427, -0.029631945, -0.0145299508, -0.0163477261, -0.0218247937,
      0.0139925943, 0.0233347463, -0.0122156866, 0.0355685832, 0.0160539224, -0.0338361909, -0.0368063298,
      0.0262571516, 0.0396397611, -0.0219795916}, {2, 3, 4}), 1e-8, 1e-8);
  sum(mul(y, vals({2, 3, 4}, 4.0, DType::f64))).backward();
  check_close(x.grad(), from_vector<double>({
      0.0113603335, 0.0479411973, 0.0142880947, -0.0402971001, 0.0370577117, -0.0169889737, -0.0461467729,
      -0.00769944167, -0.0909208818, -0.0240695967, 0.078043704, 0.0658227955, -0.00664528842, 0.0721770193,
      0.0452598247, -0.0479631192, 0.0643409158, 0.0205203479, -0.0533625778, -0.049069202, 0.0289549648,
      0.0881971653, 0.018230312, -0.0784439911}, {2, 3, 4}), 1e-8, 1e-8);
  nn::SwiGLU biased(4, 6, {.bias = true, .dtype = DType::f64});
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        biased.w1->weight = in[1], biased.w2->weight = in[2], biased.w3->weight = in[3];
        biased.w1->bias = in[4], biased.w2->bias = in[5], biased.w3->bias = in[6];
        return biased.forward(in[0]);
      },
      {leaf64({2, 4}, 1), leaf64({6, 4}, 2), leaf64({4, 6}, 3), leaf64({6, 4}, 4), leaf64({6}, 5), leaf64({4}, 6),
       leaf64({6}, 7)});
}

TEST_CASE("TransformerBlock: options rmsnorm + swiglu (LLaMA's block), names, by hand, gradcheck, errors") {
  Generator gen(9);
  nn::TransformerBlock block(8, 4,
                             {.mlp_hidden = 12,
                              .causal = true,
                              .norm = "rmsnorm",
                              .mlp = "swiglu",
                              .attention = {.kv_heads = 2, .positions = "rope"},
                              .dtype = DType::f64,
                              .generator = &gen});
  CHECK(block.mlp == nullptr);
  CHECK(names_of(block.named_parameters()) ==
        std::vector<std::string>{"ln1.weight", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
                                 "ln2.weight", "mlp.w1.weight", "mlp.w2.weight", "mlp.w3.weight"});
  CHECK(dynamic_cast<nn::RMSNorm*>(block.ln1.get()) != nullptr);
  // x + attn(rmsnorm(x)), then h + swiglu(rmsnorm(h)), composed by hand
  const Tensor x = leaf64({2, 5, 8}, 3);
  nn::AttentionOptions causal;
  causal.causal = true;
  auto rms = [](const Tensor& t, const Tensor& w) { return t * rsqrt(mean(t * t, {-1}, true) + 1e-6) * w; };
  const auto& n1 = dynamic_cast<nn::RMSNorm&>(*block.ln1);
  const auto& n2 = dynamic_cast<nn::RMSNorm&>(*block.ln2);
  const Tensor h = x + block.attn->forward(rms(x, n1.weight), causal).out;
  const auto& f = dynamic_cast<nn::SwiGLU&>(*block.feed_forward);
  const Tensor hn = rms(h, n2.weight);
  const Tensor ref = h + linear(silu(linear(hn, f.w1->weight)) * linear(hn, f.w3->weight), f.w2->weight);
  check_close(block.forward(x), ref, 1e-12, 1e-12);
  expect_gradcheck([&](const std::vector<Tensor>& in) { return block.forward(in[0]); }, {leaf64({1, 4, 8}, 4)});
  AG_CHECK_ERROR(nn::TransformerBlock(8, 4, {.norm = "batchnorm"}), "norm 'batchnorm'", "layernorm or rmsnorm");
  AG_CHECK_ERROR(nn::TransformerBlock(8, 4, {.mlp = "relu"}), "mlp 'relu'", "gelu or swiglu");
}
