// Parity with PyTorch 1.13 through golden files: tests/golden/parity_*.safetensors, written by
// tools/make_golden.py (see its docstring for the naming: <case>.in.*, .param.*, .dy, .out.y,
// .grad.*). Each case reloads the stored inputs and parameters, redoes the forward and backward
// here in float32, and compares the output and every gradient with PyTorch's at atol = rtol = 1e-5.
// The literal-based tests of each op and layer are elsewhere; these use random inputs of
// realistic small shapes (B 2, T 5-8, d 16, 4 heads).
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <tuple>

#include "apps/gpt/model.h"
#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "nn/positional.h"
#include "nn/sequential.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/sgd.h"
#include "tests/helpers.h"

using namespace ag;
using ag::test::check_close;

namespace {

constexpr double kTol = 1e-5;  // atol and rtol of every float32 comparison

using Golden = std::map<std::string, Tensor>;
using Inputs = std::map<std::string, Tensor>;

Golden load_golden(const std::string& file) {
  return load_safetensors_map(std::string(ATTOGRAD_TEST_DATA) + "/" + file);
}

Tensor get(const Golden& g, const std::string& name) {
  auto it = g.find(name);
  REQUIRE_MESSAGE(it != g.end(), "golden file has no tensor '" << name << "'");
  return it->second;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// The entries "<prefix><rest>" of the file as (rest, tensor) pairs.
nn::NamedTensors with_prefix(const Golden& g, const std::string& prefix) {
  nn::NamedTensors out;
  for (const auto& [name, t] : g)
    if (starts_with(name, prefix)) out.emplace_back(name.substr(prefix.size()), t);
  return out;
}

void expect_close(const std::string& what, const Tensor& got, const Tensor& want, double atol = kTol,
                  double rtol = kTol) {
  INFO(what);
  REQUIRE_MESSAGE(got.defined(), what << " is undefined");
  CHECK(got.shape() == want.shape());
  check_close(got.to_vector<double>(), want.to_vector<double>(), atol, rtol);
}

// Runs case `c`: the stored inputs (floating ones as fresh leaves that require grad), the stored
// parameters loaded into `module` (when given), y = f(inputs), backward with the stored dy (none
// for a scalar), then y and the gradient of every floating input and every parameter against the
// file. A gradient missing on either side fails.
void run_case(const Golden& g, const std::string& c, nn::Module* module, const std::function<Tensor(const Inputs&)>& f) {
  Inputs in;
  for (const auto& [name, stored] : with_prefix(g, c + ".in.")) {
    Tensor t = stored.detach();  // a fresh leaf each run: no gradient left from an earlier one
    if (is_floating(t.dtype())) t.set_requires_grad(true);
    in[name] = t;
  }
  REQUIRE(!in.empty());
  if (module != nullptr) {
    nn::NamedTensors params = with_prefix(g, c + ".param.");
    REQUIRE(params.size() == module->named_parameters().size());
    module->load_state_dict(params);  // strict: every name must match
  }
  Tensor y = f(in);
  expect_close(c + ".out.y", y, get(g, c + ".out.y"));
  if (y.numel() == 1 && g.count(c + ".dy") == 0)
    y.backward();
  else
    y.backward(get(g, c + ".dy"));
  for (const auto& [name, t] : in)
    if (is_floating(t.dtype())) expect_close(c + ".grad." + name, t.grad(), get(g, c + ".grad." + name));
  if (module != nullptr)
    for (const auto& [name, p] : module->named_parameters())
      expect_close(c + ".grad." + name, p.grad(), get(g, c + ".grad." + name));
}

}  // namespace

// ---- ops (parity_ops.safetensors) -----------------------------------------------------------------
TEST_CASE("parity: gelu (erf and tanh), softmax (last and middle dim), log_softmax") {
  const Golden g = load_golden("parity_ops.safetensors");
  run_case(g, "gelu", nullptr, [](const Inputs& in) { return gelu(in.at("x")); });
  run_case(g, "gelu_tanh", nullptr, [](const Inputs& in) { return gelu(in.at("x"), "tanh"); });
  run_case(g, "softmax", nullptr, [](const Inputs& in) { return softmax(in.at("x"), -1); });
  run_case(g, "softmax_dim1", nullptr, [](const Inputs& in) { return softmax(in.at("x"), 1); });
  run_case(g, "log_softmax", nullptr, [](const Inputs& in) { return log_softmax(in.at("x"), -1); });
}

TEST_CASE("parity: cross_entropy with ignore_index and label smoothing") {
  const Golden g = load_golden("parity_ops.safetensors");
  // mean over the 9 rows whose target is not -100, smoothing 0.1
  run_case(g, "ce_smooth", nullptr,
           [](const Inputs& in) { return cross_entropy(in.at("logits"), in.at("target"), "mean", -100, 0.1); });
  // ignore_index 3 is a real class: rows with target 3 add nothing; summed
  run_case(g, "ce_ignore3_sum", nullptr,
           [](const Inputs& in) { return cross_entropy(in.at("logits"), in.at("target"), "sum", 3, 0.0); });
}

TEST_CASE("parity: scaled_dot_product_attention (no mask, causal, padding, window)") {
  const Golden g = load_golden("parity_ops.safetensors");
  auto sdpa = [](bool causal, int64_t window, bool return_weights = false) {
    return [=](const Inputs& in) {
      SdpaOptions o;
      o.causal = causal;
      o.window = window;
      o.return_weights = return_weights;
      if (in.count("lengths")) o.key_padding_lengths = in.at("lengths");
      return scaled_dot_product_attention(in.at("q"), in.at("k"), in.at("v"), o).out;
    };
  };
  run_case(g, "sdpa", nullptr, sdpa(false, -1));
  run_case(g, "sdpa_cross", nullptr, sdpa(false, -1));  // Tq 5, Tk 7
  run_case(g, "sdpa_causal", nullptr, sdpa(true, -1));
  run_case(g, "sdpa_causal_rect", nullptr, sdpa(true, -1));  // Tq 4, Tk 7: bottom-right aligned
  run_case(g, "sdpa_padding", nullptr, sdpa(false, -1));     // lengths [6, 3]
  run_case(g, "sdpa_window", nullptr, sdpa(false, 2));
  run_case(g, "sdpa_causal_window", nullptr, sdpa(true, 2));
  // the composed path (return_weights) must agree with PyTorch too
  run_case(g, "sdpa_causal_window", nullptr, sdpa(true, 2, true));
  run_case(g, "sdpa_padding", nullptr, sdpa(false, -1, true));
}

// ---- layers (parity_layers.safetensors) -----------------------------------------------------------
TEST_CASE("parity: Linear, Embedding (padding_idx), LayerNorm, RMSNorm") {
  const Golden g = load_golden("parity_layers.safetensors");
  nn::Linear linear(16, 8);
  run_case(g, "linear", &linear, [&](const Inputs& in) { return linear.forward(in.at("x")); });
  // row 0 is the padding row: torch gives it a zero gradient, and so must we
  nn::Embedding embedding(10, 16, 0);
  run_case(g, "embedding", &embedding, [&](const Inputs& in) { return embedding.forward(in.at("idx")); });
  nn::LayerNorm ln(16);
  run_case(g, "layer_norm", &ln, [&](const Inputs& in) { return ln.forward(in.at("x")); });
  nn::RMSNorm rms(16);
  run_case(g, "rms_norm", &rms, [&](const Inputs& in) { return rms.forward(in.at("x")); });
}

TEST_CASE("parity: MultiHeadAttention self (causal) and cross (key padding) vs torch.nn.MultiheadAttention") {
  const Golden g = load_golden("parity_layers.safetensors");
  nn::MultiHeadAttention self_attn(16, 4);
  run_case(g, "mha_self", &self_attn, [&](const Inputs& in) {
    nn::AttentionOptions o;
    o.causal = true;
    return self_attn.forward(in.at("x"), o).out;
  });
  nn::MultiHeadAttention cross_attn(16, 4);
  run_case(g, "mha_cross", &cross_attn, [&](const Inputs& in) {
    nn::AttentionOptions o;
    o.key_padding_lengths = in.at("lengths");  // [8, 5]: torch's key_padding_mask[1, 5:] = true
    return cross_attn.forward(in.at("x"), in.at("context"), o).out;
  });
}

TEST_CASE("parity: TransformerBlock (pre-LN, causal, d 16, 4 heads, mlp 64)") {
  const Golden g = load_golden("parity_layers.safetensors");
  nn::TransformerBlock block(16, 4, {.mlp_hidden = 64, .causal = true});
  run_case(g, "block", &block, [&](const Inputs& in) { return block.forward(in.at("x")); });
}

// ---- optimizers (parity_optim.safetensors) --------------------------------------------------------
namespace {

// Three steps on parameters a (3, 4) and b (5) with the stored gradients; the parameters after
// every step against PyTorch's. The options are those of OPTIMIZERS in tools/make_golden.py.
template <class Opt, class Options>
void run_optimizer(const Golden& g, const std::string& c, const Options& options) {
  Tensor a = get(g, c + ".init.a").set_requires_grad(true);
  Tensor b = get(g, c + ".init.b").set_requires_grad(true);
  Opt opt({a, b}, options);
  for (int t = 0; t < 3; ++t) {
    a.set_grad(get(g, fmt::format("{}.grad{}.a", c, t)));
    b.set_grad(get(g, fmt::format("{}.grad{}.b", c, t)));
    opt.step();
    expect_close(fmt::format("{}.step{}.a", c, t), a, get(g, fmt::format("{}.step{}.a", c, t)));
    expect_close(fmt::format("{}.step{}.b", c, t), b, get(g, fmt::format("{}.step{}.b", c, t)));
  }
}

}  // namespace

TEST_CASE("parity: 3 steps of SGD (momentum, dampening, nesterov, weight decay), Adam, AdamW") {
  const Golden g = load_golden("parity_optim.safetensors");
  run_optimizer<optim::SGD>(g, "sgd", optim::SGD::Options{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01,
                                                          .dampening = 0.1});
  run_optimizer<optim::SGD>(g, "sgd_nesterov", optim::SGD::Options{.lr = 0.1, .momentum = 0.9,
                                                                   .weight_decay = 0.01, .nesterov = true});
  run_optimizer<optim::Adam>(g, "adam", optim::Adam::Options{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6,
                                                             .weight_decay = 0.01});
  run_optimizer<optim::AdamW>(g, "adamw", optim::AdamW::Options{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999,
                                                                .eps = 1e-8, .weight_decay = 0.1});
}

TEST_CASE("parity: clip_grad_norm (2-norm and inf-norm) returns torch's norm and clips the same") {
  const Golden g = load_golden("parity_optim.safetensors");
  for (auto [c, norm_type, max_norm] : {std::tuple{"clip2", 2.0, 1.0}, std::tuple{"clip_inf", double(INFINITY), 0.5}}) {
    std::vector<Tensor> params;
    for (int i = 0; i < 3; ++i) {
      Tensor gi = get(g, fmt::format("{}.grad.{}", c, i));
      Tensor p = zeros(gi.shape()).set_requires_grad(true);
      p.set_grad(gi);
      params.push_back(p);
    }
    const double norm = optim::clip_grad_norm(params, max_norm, norm_type);
    INFO(c);
    const double want = get(g, std::string(c) + ".norm").item<double>();
    CHECK(want > max_norm);  // the case must clip, or it tests nothing
    CHECK(norm == doctest::Approx(want).epsilon(kTol));
    for (int i = 0; i < 3; ++i)
      expect_close(fmt::format("{}.clipped.{}", c, i), params[size_t(i)].grad(),
                   get(g, fmt::format("{}.clipped.{}", c, i)));
  }
}

// ---- a 20-step training run (parity_train.safetensors) --------------------------------------------
// The model is the sample app's GPT (apps/gpt/model.h); tools/make_golden.py's TorchGPT is
// written independently in PyTorch with the same names.
namespace {
// 20 AdamW steps (lr 1e-2, weight decay 0.01, gradients clipped to norm 1) on the stored batch of
// case `c`, compared with PyTorch's losses (1e-4) and gradient norms before each clip.
void expect_training_parity(apps::GPT& model, const Golden& g, const std::string& c, int64_t tokens, int64_t V) {
  const Tensor idx = get(g, c + ".in.idx"), target = get(g, c + ".in.target").reshape({tokens});
  const std::vector<double> want_loss = get(g, c + ".losses").to_vector<double>();
  const std::vector<double> want_norm = get(g, c + ".grad_norms").to_vector<double>();
  REQUIRE(want_loss.size() == 20);
  optim::AdamW opt(model.parameters(), optim::AdamW::Options{.lr = 1e-2, .weight_decay = 0.01});
  std::vector<double> loss_curve, norms;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    Tensor loss = cross_entropy(model.forward(idx).reshape({tokens, V}), target);
    loss.backward();
    norms.push_back(optim::clip_grad_norm(model.parameters(), 1.0));
    opt.step();
    loss_curve.push_back(loss.item<double>());
  }
  std::string curve;
  for (double l : loss_curve) curve += fmt::format(" {:.6f}", l);
  INFO("losses:" << curve);
  check_close(loss_curve, want_loss, 1e-4, 0);
  check_close(norms, want_norm, 1e-4, 1e-4);  // the gradients agree before each clip and step
  CHECK(loss_curve.back() < 0.5 * loss_curve.front());  // it learns: the curve is not flat
}
}  // namespace

TEST_CASE("parity: 20 AdamW steps of a 2-block GPT follow PyTorch's loss curve within 1e-4") {
  const Golden g = load_golden("parity_train.safetensors");
  const int64_t V = 16, T = 8, d = 16, H = 2, B = 4;
  apps::GPTConfig c{.vocab = V, .context = T, .d_model = d, .n_heads = H, .n_layers = 2, .mlp_hidden = 4 * d};
  apps::GPT model(c);
  model.load_state_dict(with_prefix(g, "train.param."));
  expect_training_parity(model, g, "train", B * T, V);
}

// ---- the same run for GPTs of current small models' parts (parity_modern.safetensors) ------------
// tools/make_golden.py's TorchModernGPT: RMSNorm, SwiGLU, 4 query heads on 2 key/value heads
// (repeat_interleave), and rope (GPT-NeoX's rotate_half) or ALiBi (an explicit bias tensor) in
// plain PyTorch; here the fused attention kernel with enable_gqa, rope and alibi_slopes.
TEST_CASE("parity: 20 AdamW steps of a GPT with rmsnorm, swiglu, grouped-query heads and rope or alibi") {
  const Golden g = load_golden("parity_modern.safetensors");
  const int64_t V = 16, T = 8, d = 16, B = 4;
  for (const char* pos : {"rope", "alibi"}) {
    CAPTURE(pos);
    const std::string c = std::string("modern_") + pos;
    apps::GPTConfig cfg{.vocab = V, .context = T, .d_model = d, .n_heads = 4, .n_layers = 2, .mlp_hidden = 3 * d};
    cfg.pos = pos, cfg.kv_heads = 2, cfg.mlp_kind = "swiglu", cfg.norm = "rmsnorm";
    apps::GPT model(cfg);
    const nn::LoadResult loaded = model.load_state_dict(with_prefix(g, c + ".param."));
    REQUIRE(loaded.ok());
    expect_training_parity(model, g, c, B * T, V);
  }
}
