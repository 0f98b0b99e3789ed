// The sample models of apps/common/models.h: names (the PyTorch twins' names), sizes, masks,
// the KV-cache decode and the initialisation.
#include <cmath>

#include "apps/common/models.h"
#include "attograd.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::apps;
using namespace ag::test;

namespace {

bool has_name(const nn::Module& m, const std::string& name) {
  for (const auto& [n, t] : m.named_parameters())
    if (n == name) return true;
  return false;
}

double max_abs(const Tensor& t) { return max(abs(t.contiguous())).item<float>(); }

}  // namespace

TEST_CASE("models: ViT parameter names and count") {
  ViT vit(ViTConfig{});
  // patch 3136+64, cls 64, pos 17*64, 4 blocks of 49984, norm 128, head 650 (see the config)
  CHECK(vit.num_parameters() == 3200 + 64 + 1088 + 4 * 49984 + 128 + 650);
  for (const char* n : {"patch.proj.weight", "patch.cls_token", "pos_embed", "blocks.0.ln1.weight",
                        "blocks.3.attn.qkv.weight", "blocks.3.attn.proj.bias", "blocks.2.mlp.fc2.weight",
                        "norm.bias", "head.weight"})
    CHECK_MESSAGE(has_name(vit, n), n);
  Tensor logits = vit.forward(randn({2, 1, 28, 28}));
  CHECK(logits.shape() == Shape{2, 10});
  AG_CHECK_ERROR(vit.forward(randn({2, 3, 28, 28})), "ViT", "[2,3,28,28]");
}

TEST_CASE("models: GPT-2 style initialisation") {
  Generator gen(7);
  GPTConfig c;
  c.n_layers = 2, c.d_model = 64, c.mlp_hidden = 256;
  GPT gpt(c, &gen);
  CHECK_FALSE(has_name(gpt, "head.bias"));
  auto stddev = [](const Tensor& t) { return std::sqrt(var(t.to(DType::f64)).item<double>()); };
  for (const auto& [name, p] : gpt.named_parameters()) {
    if (name == "blocks.0.attn.proj.weight" || name == "blocks.1.mlp.fc2.weight")
      CHECK(stddev(p) == doctest::Approx(0.02 / std::sqrt(4.0)).epsilon(0.1));
    else if (name == "wte.weight" || name == "blocks.1.mlp.fc1.weight")
      CHECK(stddev(p) == doctest::Approx(0.02).epsilon(0.1));
    else if (name == "blocks.0.ln1.weight")
      CHECK(max_abs(p - 1.0) == 0.0);
    else if (name == "blocks.0.attn.qkv.bias")
      CHECK(max_abs(p) == 0.0);
  }
}

TEST_CASE("models: GPT decoding with KV caches equals the full causal forward") {
  Generator gen(3);
  GPTConfig c;
  c.vocab = 11, c.context = 16, c.d_model = 32, c.n_heads = 4, c.n_layers = 2, c.mlp_hidden = 64;
  GPT gpt(c, &gen);
  gpt.eval();
  NoGradGuard no_grad;
  Tensor idx = randint(0, c.vocab, {2, 9}, &gen);
  Tensor full = gpt.forward(idx);  // (2, 9, 11)
  std::vector<nn::KVCache> caches(size_t(c.n_layers));
  // a 4-token prompt, then one token at a time
  Tensor first = gpt.forward(idx.narrow(1, 0, 4), &caches);
  check_close(first, full.narrow(1, 0, 4), 1e-5, 1e-5);
  for (int64_t t = 4; t < 9; ++t)
    check_close(gpt.forward(idx.narrow(1, t, 1), &caches), full.narrow(1, t, 1), 1e-5, 1e-5);
  CHECK(caches[1].length() == 9);
  AG_CHECK_ERROR(gpt.forward(randint(0, c.vocab, {2, 8}, &gen), &caches), "GPT", "exceed the context of 16");
}

TEST_CASE("models: TextClassifier ignores padding and pools over valid tokens") {
  Generator gen(5);
  TextClassifierConfig c;
  c.vocab = 30, c.max_len = 12, c.d_model = 16, c.n_heads = 2, c.n_layers = 2, c.mlp_hidden = 32, c.dropout = 0.0;
  TextClassifier model(c, &gen);
  model.eval();
  CHECK(max_abs(model.tok->weight.select(0, 0)) == 0.0);  // padding row
  Tensor tokens = randint(1, c.vocab, {3, 7}, &gen);
  Tensor lengths = tensor<int64_t>({7, 4, 1});
  // zero the padded slots (id 0) in one copy, put random ids there in the other
  Tensor valid = lt(arange(7).reshape({1, 7}), lengths.reshape({-1, 1}));
  Tensor padded = where(valid, tokens, zeros({3, 7}, DType::i64));
  Tensor noisy = where(valid, tokens, randint(1, c.vocab, {3, 7}, &gen));
  Tensor a = model.forward(padded, lengths), b = model.forward(noisy, lengths);
  check_close(a, b, 1e-6, 1e-6);
  // the first sequence alone, unpadded, gives the same logits as inside the batch
  Tensor one = model.forward(padded.narrow(0, 1, 1).narrow(1, 0, 4), tensor<int64_t>({4}));
  check_close(one, a.narrow(0, 1, 1), 1e-5, 1e-5);
  AG_CHECK_ERROR(model.forward(padded, tensor<int64_t>({7, 4})), "TextClassifier", "lengths");
}
