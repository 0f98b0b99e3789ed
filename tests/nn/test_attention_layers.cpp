// MultiHeadAttention, KVCache, TransformerBlock and PatchEmbedding. Weights and inputs are the formula
// vals(shape, phase)[k] = 0.5 sin(1.3 k + phase), computed the same way by
// tools/make_attention_reference.py, which printed the expected outputs pasted below (PyTorch 1.13's
// nn.MultiheadAttention(batch_first=True) and F.conv2d, computed in f64; compared here in f32 at 1e-5).
//
// Gradchecks substitute the f64 inputs gradcheck perturbs for a layer's members (qkv->weight = in[1]):
// forward reads the members, so the gradient of every parameter is checked through the real forward.
#include <cmath>

#include "nn/attention.h"
#include "nn/patch.h"
#include "nn/positional.h"
#include "nn/transformer.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {


// d 4, 2 heads, with the reference script's weights: qkv = in_proj, proj = out_proj
std::shared_ptr<nn::MultiHeadAttention> reference_mha() {
  auto mha = std::make_shared<nn::MultiHeadAttention>(4, 2);
  REQUIRE(mha->load_state_dict({{"qkv.weight", vals({12, 4}, 1)},
                                {"qkv.bias", vals({12}, 2)},
                                {"proj.weight", vals({4, 4}, 3)},
                                {"proj.bias", vals({4}, 4)}})
              .ok());
  return mha;
}

// gradcheck of mha's output w.r.t. x and every parameter: in = {x, qkv.weight, qkv.bias,
// proj.weight, proj.bias}, substituted for the members before each forward
void expect_mha_gradcheck(nn::MultiHeadAttention& mha, const nn::AttentionOptions& o, const std::vector<Tensor>& in) {
  expect_gradcheck(
      [&](const std::vector<Tensor>& t) {
        mha.qkv->weight = t[1], mha.qkv->bias = t[2], mha.proj->weight = t[3], mha.proj->bias = t[4];
        return mha.forward(t[0], o).out;
      },
      in);
}

std::vector<std::string> names(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, t] : m.named_parameters()) out.push_back(name);
  return out;
}

}  // namespace

TEST_CASE("MultiHeadAttention: self-attention matches PyTorch (no mask, causal, key_padding_mask)") {
  auto mha = reference_mha();
  Tensor x = vals({2, 3, 4}, 0) * 2.0;
  nn::AttentionOptions plain;
  plain.need_weights = true;
  nn::AttentionResult r = mha->forward(x, plain);
  check_close(r.out,
              {-1.06590738, 0.0243612551, 1.2560353, 1.08996032, -0.776705044, 0.0502708155, 0.99111108, 0.81580794,
               -0.783425505, 0.0838971456, 1.02934053, 0.818003883, -0.71735413, -1.17755198, -0.218750734,
               0.909949878, -0.945264174, -1.18806144, -0.00068840497, 1.12479101, -0.914802109, -1.21650303,
               -0.0578011818, 1.09971602},
              1e-5, 1e-5);
  // torch's per-head weights (average_attn_weights=False), [B, H, Tq, Tk]
  CHECK(r.weights.shape() == Shape{2, 2, 3, 3});
  check_close(r.weights,
              {0.291980332, 0.238188689, 0.469830979, 0.393496511, 0.317825483, 0.288678007, 0.342154226,
               0.409477616, 0.248368158, 0.190878287, 0.284876384, 0.524245329, 0.494832581, 0.308423029,
               0.19674439,  0.487646584, 0.339021388, 0.173332028, 0.431734389, 0.259170883, 0.309094728,
               0.536619284, 0.303849405, 0.159531312, 0.479587059, 0.384678301, 0.135734639, 0.489674234,
               0.26993609,  0.240389676, 0.765708534, 0.175332452, 0.0589590135, 0.735346775, 0.204587934,
               0.0600652915},
              1e-5, 1e-5);

  nn::AttentionOptions causal;  // torch: attn_mask = upper triangle True
  causal.causal = true;
  check_close(mha->forward(x, causal).out,
              {-0.183967624, -0.215487157, 0.149349579, 0.292807319, -0.518054964, 0.0464819341, 0.728910692,
               0.573906315, -0.783425505, 0.0838971456, 1.02934053, 0.818003883, -1.30406821, -1.01787406,
               0.517586891, 1.44024486, -1.06974615, -1.18333893, 0.128218725, 1.24085878, -0.914802109,
               -1.21650303, -0.0578011818, 1.09971602},
              1e-5, 1e-5);

  nn::AttentionOptions padded;  // torch: key_padding_mask [[F,F,F],[F,T,F]]
  padded.key_padding_mask = from_vector(std::vector<double>{0, 0, 0, 0, 1, 0}, {2, 3}).to(DType::b8);
  check_close(mha->forward(x, padded).out,
              {-1.06590738, 0.0243612551, 1.2560353, 1.08996032, -0.776705044, 0.0502708155, 0.99111108, 0.81580794,
               -0.783425505, 0.0838971456, 1.02934053, 0.818003883, -0.799775011, -1.04672896, -0.0137443171,
               0.971224701, -1.08823688, -1.06232634, 0.260102282, 1.24342548, -1.09256569, -1.05891285,
               0.267629654, 1.24706538},
              1e-5, 1e-5);

  // key_padding_lengths [3, 2] is the mask [[F,F,F],[F,F,T]]
  nn::AttentionOptions lengths, mask;
  lengths.key_padding_lengths = from_vector(std::vector<double>{3, 2}, {2}).to(DType::i64);
  mask.key_padding_mask = from_vector(std::vector<double>{0, 0, 0, 0, 0, 1}, {2, 3}).to(DType::b8);
  Tensor yl = mha->forward(x, lengths).out;
  check_close(yl, mha->forward(x, mask).out, 1e-6, 1e-6);
  // the first sequence keeps all its keys, so equals the unmasked output; the second does not
  check_close(yl.select(0, 0), r.out.select(0, 0), 1e-6, 1e-6);
  CHECK(std::abs(yl.select(0, 1).to_vector<double>()[0] - r.out.select(0, 1).to_vector<double>()[0]) > 1e-3);
}

TEST_CASE("MultiHeadAttention: cross-attention matches PyTorch, shapes, gradcheck") {
  auto mha = reference_mha();
  Tensor x = vals({2, 3, 4}, 0) * 2.0, ctx = vals({2, 2, 4}, 7) * 2.0;  // Tq 3, Tk 2
  nn::AttentionOptions o;
  o.need_weights = true;
  nn::AttentionResult r = mha->forward(x, ctx, o);
  CHECK(r.out.shape() == Shape{2, 3, 4});
  CHECK(r.weights.shape() == Shape{2, 2, 3, 2});
  check_close(r.out,
              {-0.149854034, -0.49598427, -0.147599158, 0.295053565, -0.175649502, -0.449139014, -0.0779081237,
               0.313511131, -0.235057538, -0.324300044, 0.0984781894, 0.353952018, -1.3899418, 0.0423149681,
               1.59689294, 1.39140159, -1.45822931, -0.102633713, 1.52935871, 1.47306844, -1.48591642,
               -0.149896387, 1.51275911, 1.50477674},
              1e-5, 1e-5);
  // with context = x, cross-attention is self-attention
  check_close(mha->forward(x, x).out, mha->forward(x).out, 1e-6, 1e-6);

  nn::MultiHeadAttention m64(4, 2, {.dtype = DType::f64});
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        m64.qkv->weight = in[2], m64.qkv->bias = in[3], m64.proj->weight = in[4], m64.proj->bias = in[5];
        return m64.forward(in[0], in[1]).out;
      },
      {leaf64({1, 3, 4}, 1), leaf64({1, 2, 4}, 2), leaf64({12, 4}, 3, 0.5), leaf64({12}, 4), leaf64({4, 4}, 5),
       leaf64({4}, 6)});
}

TEST_CASE("MultiHeadAttention: need_weights rows sum to 1 and respect the causal and window masks") {
  Generator g(3);
  nn::MultiHeadAttention mha(8, 4, {.generator = &g});
  nn::AttentionOptions o;
  o.causal = true;
  o.need_weights = true;
  Tensor w = mha.forward(randn({2, 5, 8}, DType::f32, &g), o).weights;
  REQUIRE(w.shape() == Shape{2, 4, 5, 5});
  check_close(sum(w, {-1}), std::vector<double>(40, 1.0), 1e-5, 1e-5);
  std::vector<double> wv = w.to_vector<double>();
  for (size_t r = 0; r < 40; ++r)
    for (size_t j = 0; j < 5; ++j)
      if (j > r % 5) CHECK(wv[r * 5 + j] == 0.0);  // key j after query i = r % 5
  CHECK_FALSE(mha.forward(randn({2, 5, 8}, DType::f32, &g)).weights.defined());  // only when asked
  // window 1 (not causal): query i sees keys i-1, i, i+1 only
  nn::AttentionOptions local;
  local.window = 1;
  local.need_weights = true;
  std::vector<double> lv = mha.forward(randn({1, 5, 8}, DType::f32, &g), local).weights.to_vector<double>();
  for (size_t r = 0; r < 20; ++r)
    for (size_t j = 0; j < 5; ++j) CHECK((lv[r * 5 + j] == 0.0) == (j + 1 < r % 5 || j > r % 5 + 1));
}

TEST_CASE("MultiHeadAttention: gradcheck w.r.t. input and all parameters (plain and causal)") {
  nn::MultiHeadAttention mha(4, 2, {.dtype = DType::f64});
  CHECK(names(mha) == std::vector<std::string>{"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"});
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    nn::AttentionOptions o;
    o.causal = causal;
    expect_mha_gradcheck(
        mha, o, {leaf64({1, 3, 4}, 1), leaf64({12, 4}, 2, 0.5), leaf64({12}, 3), leaf64({4, 4}, 4), leaf64({4}, 5)});
  }
  // a transposed (non-contiguous) input, used twice in one graph (self-attention reads x as q, k and v)
  expect_gradcheck([&](const std::vector<Tensor>& in) { return mha.forward(in[0].transpose(1, 2)).out; },
                   {leaf64({1, 4, 3}, 6)});
}

TEST_CASE("MultiHeadAttention: dropout acts in training only, errors") {
  Generator g(7);
  nn::MultiHeadAttention mha(8, 2, {.dropout = 0.5, .generator = &g});
  Tensor x = randn({1, 4, 8}, DType::f32, &g);
  mha.eval();
  Tensor y_eval = mha.forward(x).out;
  nn::MultiHeadAttention nodrop(8, 2);
  CHECK(nodrop.load_state_dict(mha.state_dict()).ok());
  check_close(y_eval, nodrop.forward(x).out, 0, 0);  // eval: no dropout at all
  mha.train();
  const Generator at = g;  // the module's generator, where the next dropout mask starts
  Tensor y_train = mha.forward(x).out;
  double diff = max(abs(y_train - y_eval)).to_vector<double>()[0];
  CHECK(diff > 1e-3);
  // the mask comes from the module's generator (not the default one): rewinding it replays the
  // mask, which is what makes a resumed training run exact
  CHECK(g.offset() > at.offset());
  g = at;
  check_close(mha.forward(x).out, y_train, 0, 0);

  AG_CHECK_ERROR(nn::MultiHeadAttention(6, 4), "MultiHeadAttention", "6", "4");
  AG_CHECK_ERROR(mha.forward(zeros({1, 4, 6})), "MultiHeadAttention", "[B, T, 8]", "[1,4,6]");
  AG_CHECK_ERROR(mha.forward(x, zeros({2, 3, 8})), "MultiHeadAttention", "context", "[2,3,8]");
  nn::KVCache cache;
  nn::AttentionOptions o;
  o.cache = &cache;
  AG_CHECK_ERROR(mha.forward(x, x, o), "MultiHeadAttention", "cross-attention");
}

TEST_CASE("KVCache: decoding one token at a time and in chunks equals the causal forward") {
  for (DType dt : {DType::f64, DType::f32}) {
    CAPTURE(dt);
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    Generator g(11);
    nn::MultiHeadAttention mha(8, 2, {.dtype = dt, .generator = &g});
    Tensor x = randn({2, 6, 8}, dt, &g);
    NoGradGuard no_grad;
    nn::AttentionOptions full;
    full.causal = true;
    Tensor y = mha.forward(x, full).out;
    for (const std::vector<int64_t>& chunks : {std::vector<int64_t>{1, 1, 1, 1, 1, 1}, std::vector<int64_t>{2, 1, 3}}) {
      nn::KVCache cache;
      nn::AttentionOptions step;
      step.causal = true;
      step.cache = &cache;
      std::vector<Tensor> parts;
      int64_t t = 0;
      for (int64_t n : chunks) {
        parts.push_back(mha.forward(x.narrow(1, t, n), step).out);
        t += n;
        CHECK(cache.length() == t);
      }
      CHECK(cache.k.shape() == Shape{2, 2, 6, 4});
      check_close(cat(parts, 1), y, tol, tol);
    }
  }
  // the same through a causal TransformerBlock
  Generator g(12);
  nn::TransformerBlock block(8, 2, {.mlp_hidden = 16, .causal = true, .dtype = DType::f64, .generator = &g});
  Tensor x = randn({1, 5, 8}, DType::f64, &g);
  NoGradGuard no_grad;
  Tensor y = block.forward(x);
  nn::KVCache cache;
  std::vector<Tensor> parts;
  for (int64_t t = 0; t < 5; ++t) parts.push_back(block.forward(x.narrow(1, t, 1), Tensor(), &cache));
  check_close(cat(parts, 1), y, 1e-12, 1e-12);
  AG_CHECK_ERROR(cache.append(zeros({1, 3, 1, 4}, DType::f64), zeros({1, 3, 1, 4}, DType::f64)), "KVCache",
                 "[1,3,1,4]", "[1,2,5,4]");
}

TEST_CASE("TransformerBlock: parameter names, residual structure, gradcheck") {
  nn::TransformerBlock block(4, 2, {.mlp_hidden = 6, .causal = true, .dtype = DType::f64});
  CHECK(names(block) == std::vector<std::string>{"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias",
                                                 "attn.proj.weight", "attn.proj.bias", "ln2.weight", "ln2.bias",
                                                 "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"});
  // x + attn(ln1(x)), then h + mlp(ln2(h)), composed by hand
  Tensor x = leaf64({2, 3, 4}, 9);
  nn::AttentionOptions causal;
  causal.causal = true;
  Tensor h = x + block.attn->forward(block.ln1->forward(x), causal).out;
  check_close(block.forward(x), h + block.mlp->forward(block.ln2->forward(h)), 1e-12, 1e-12);

  auto& ln1 = dynamic_cast<nn::LayerNorm&>(*block.ln1);
  auto& ln2 = dynamic_cast<nn::LayerNorm&>(*block.ln2);
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        ln1.weight = in[1], ln1.bias = in[2];
        block.attn->qkv->weight = in[3], block.attn->qkv->bias = in[4];
        block.attn->proj->weight = in[5], block.attn->proj->bias = in[6];
        ln2.weight = in[7], ln2.bias = in[8];
        block.mlp->fc1->weight = in[9], block.mlp->fc1->bias = in[10];
        block.mlp->fc2->weight = in[11], block.mlp->fc2->bias = in[12];
        return block.forward(in[0]);
      },
      {leaf64({1, 3, 4}, 1), leaf64({4}, 2), leaf64({4}, 3), leaf64({12, 4}, 4, 0.5), leaf64({12}, 5),
       leaf64({4, 4}, 6), leaf64({4}, 7), leaf64({4}, 8), leaf64({4}, 9), leaf64({6, 4}, 10), leaf64({6}, 11),
       leaf64({4, 6}, 12), leaf64({4}, 13)});
}

TEST_CASE("TransformerBlock: cross-attention block, names, gradcheck, context errors") {
  nn::TransformerBlock block(4, 2, {.mlp_hidden = 6, .cross = true, .dtype = DType::f64});
  std::vector<std::string> n = names(block);
  REQUIRE(n.size() == 18);
  CHECK(n[6] == "ln_cross.weight");
  CHECK(n[8] == "cross_attn.qkv.weight");
  CHECK(n[12] == "ln2.weight");
  expect_gradcheck([&](const std::vector<Tensor>& in) { return block.forward(in[0], in[1]); },
                   {leaf64({1, 3, 4}, 1), leaf64({1, 2, 4}, 2)});
  AG_CHECK_ERROR(block.forward(leaf64({1, 3, 4}, 1)), "TransformerBlock", "needs a context");
  nn::TransformerBlock plain(4, 2, {.mlp_hidden = 6, .dtype = DType::f64});
  AG_CHECK_ERROR(plain.forward(leaf64({1, 3, 4}, 1), leaf64({1, 2, 4}, 2)), "TransformerBlock", "without cross");
}

namespace {

// The plain multi-head twin of a grouped-query `gqa`: its qkv weight and bias repeat the rows of
// key/value head g for each of the H / Hkv query heads of group g (what GQA means), the rest copied.
std::shared_ptr<nn::MultiHeadAttention> repeated_heads_twin(const nn::MultiHeadAttention& gqa) {
  const int64_t d = gqa.d_model, H = gqa.n_heads, hs = gqa.head_size, G = H / gqa.kv_heads;
  auto mha = std::make_shared<nn::MultiHeadAttention>(d, H, nn::MultiHeadAttention::Options{.dtype = DType::f64});
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < d; ++r) rows.push_back(r);                  // q: all of it
  for (int64_t part = 0; part < 2; ++part)                            // k, then v
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < hs; ++i) rows.push_back(d + part * gqa.kv_heads * hs + (h / G) * hs + i);
  const Tensor idx = from_vector<int64_t>(rows, {int64_t(rows.size())});
  REQUIRE(mha->load_state_dict({{"qkv.weight", index_select(gqa.qkv->weight, 0, idx)},
                               {"qkv.bias", index_select(gqa.qkv->bias, 0, idx)},
                               {"proj.weight", gqa.proj->weight},
                               {"proj.bias", gqa.proj->bias}})
              .ok());
  return mha;
}

}  // namespace

TEST_CASE("MultiHeadAttention: kv_heads (grouped-query) equals plain heads with repeated k, v rows") {
  Generator g(21);
  for (int64_t kv : {1, 2}) {
    CAPTURE(kv);
    nn::MultiHeadAttention gqa(8, 4, {.kv_heads = kv, .dtype = DType::f64, .generator = &g});
    CHECK(gqa.kv_heads == kv);
    CHECK(gqa.qkv->weight.shape() == Shape{8 + 2 * kv * 2, 8});  // d + 2 Hkv hs rows, hs 2
    const auto twin = repeated_heads_twin(gqa);
    nn::MultiHeadAttention& mha = *twin;
    const Tensor x = randn({2, 5, 8}, DType::f64, &g), ctx = randn({2, 3, 8}, DType::f64, &g);
    nn::AttentionOptions none, causal, padded;
    causal.causal = true;
    padded.key_padding_lengths = from_vector<int64_t>({5, 3}, {2});
    for (const nn::AttentionOptions* o : {&none, &causal, &padded}) {
      nn::AttentionOptions w = *o;
      w.need_weights = true;
      const nn::AttentionResult a = gqa.forward(x, w), b = mha.forward(x, w);
      check_close(a.out, b.out, 1e-12, 1e-12);
      check_close(a.weights, b.weights, 1e-12, 1e-12);
    }
    check_close(gqa.forward(x, ctx).out, mha.forward(x, ctx).out, 1e-12, 1e-12);  // cross-attention
  }
  // kv_heads = n_heads is plain multi-head attention: PyTorch's in_proj layout, 3d rows
  CHECK(nn::MultiHeadAttention(8, 4, {.kv_heads = 4}).qkv->weight.shape() == Shape{24, 8});
  AG_CHECK_ERROR(nn::MultiHeadAttention(8, 4, {.kv_heads = 3}), "kv_heads 3", "n_heads 4");
  AG_CHECK_ERROR(nn::MultiHeadAttention(8, 4, {.kv_heads = -1}), "kv_heads -1");
}

TEST_CASE("MultiHeadAttention: kv_heads gradcheck of every parameter, and a KV cache of kv_heads") {
  for (int64_t kv : {1, 2}) {
    CAPTURE(kv);
    nn::MultiHeadAttention mha(8, 4, {.kv_heads = kv, .dtype = DType::f64});
    const int64_t rows = 8 + 4 * kv;
    for (bool causal : {false, true}) {
      CAPTURE(causal);
      nn::AttentionOptions o;
      o.causal = causal;
      expect_mha_gradcheck(mha, o,
                           {leaf64({2, 3, 8}, 1), leaf64({rows, 8}, 2, 0.5), leaf64({rows}, 3), leaf64({8, 8}, 4),
                            leaf64({8}, 5)});
    }
    // decoding one token at a time caches (B, Hkv, T, hs) and equals the causal forward
    Generator g(3);
    nn::TransformerBlock block(
        8, 4, {.mlp_hidden = 16, .causal = true, .attention = {.kv_heads = kv}, .dtype = DType::f64, .generator = &g});
    CHECK(block.attn->kv_heads == kv);
    const Tensor x = randn({2, 6, 8}, DType::f64, &g);
    NoGradGuard no_grad;
    const Tensor y = block.forward(x);
    nn::KVCache cache;
    std::vector<Tensor> parts;
    for (int64_t t = 0; t < 6; ++t) parts.push_back(block.forward(x.narrow(1, t, 1), Tensor(), &cache));
    CHECK(cache.k.shape() == Shape{2, kv, 6, 2});
    check_close(cat(parts, 1), y, 1e-12, 1e-12);
  }
}

TEST_CASE("MultiHeadAttention: rope and alibi positions, by hand, through a KV cache, gradcheck") {
  Generator g(31);
  const Tensor x = randn({2, 6, 8}, DType::f64, &g);
  for (const char* positions : {"rope", "alibi"}) {
    CAPTURE(positions);
    nn::MultiHeadAttention mha(8, 4, {.kv_heads = 2, .positions = positions, .dtype = DType::f64, .generator = &g});
    nn::AttentionOptions causal;
    causal.causal = true;
    // by hand: the projection split as documented, then rope on q and k, or ALiBi's slopes
    {
      NoGradGuard no_grad;
      const Tensor p = linear(x, mha.qkv->weight, mha.qkv->bias);
      auto heads = [](const Tensor& t, int64_t first, int64_t n) {
        return t.narrow(2, first, n * 2).reshape({2, 6, n, 2}).transpose(1, 2);
      };
      Tensor q = heads(p, 0, 4), k = heads(p, 8, 2), v = heads(p, 12, 2);
      SdpaOptions o;
      o.causal = true, o.enable_gqa = true;
      if (std::string(positions) == "rope") q = rope(q), k = rope(k);
      else o.alibi_slopes = nn::alibi_slopes(4);
      const Tensor o_heads = scaled_dot_product_attention(q, k, v, o).out;
      const Tensor ref = linear(o_heads.transpose(1, 2).reshape({2, 6, 8}), mha.proj->weight, mha.proj->bias);
      check_close(mha.forward(x, causal).out, ref, 1e-12, 1e-12);
      // decoding one token at a time (rope at the cache's offset, ALiBi bottom-right aligned) and
      // in chunks equals the causal forward
      for (const std::vector<int64_t>& chunks : {std::vector<int64_t>{1, 1, 1, 1, 1, 1}, std::vector<int64_t>{2, 3, 1}}) {
        nn::KVCache cache;
        nn::AttentionOptions step = causal;
        step.cache = &cache;
        std::vector<Tensor> parts;
        int64_t t = 0;
        for (int64_t n : chunks) parts.push_back(mha.forward(x.narrow(1, t, n), step).out), t += n;
        check_close(cat(parts, 1), ref, 1e-12, 1e-12);
      }
      // and the positions matter: without them the output differs
      nn::MultiHeadAttention plain(8, 4, {.kv_heads = 2, .dtype = DType::f64});
      REQUIRE(plain.load_state_dict(mha.state_dict()).ok());
      CHECK(max(abs(plain.forward(x, causal).out - ref)).item<double>() > 1e-3);
    }
    expect_mha_gradcheck(
        mha, causal, {leaf64({1, 5, 8}, 1), leaf64({16, 8}, 2, 0.5), leaf64({16}, 3), leaf64({8, 8}, 4), leaf64({8}, 5)});
    AG_CHECK_ERROR(mha.forward(x, x), "positions", positions, "self-attention");
    // a cross-attention block keeps the positions to its self-attention
    nn::TransformerBlock block(
        8, 4, {.mlp_hidden = 16, .cross = true, .attention = {.positions = positions}, .dtype = DType::f64});
    CHECK(block.attn->options.positions == positions);
    CHECK(block.cross_attn->options.positions == "none");
  }
  AG_CHECK_ERROR(nn::MultiHeadAttention(8, 4, {.positions = "learned"}), "positions 'learned'", "none, rope or alibi");
  AG_CHECK_ERROR(nn::MultiHeadAttention(12, 4, {.positions = "rope"}), "head size must be even", "3");
}

TEST_CASE("PatchEmbedding: matches PyTorch's Conv2d(kernel = stride = p) + flatten(2).transpose(1, 2)") {
  nn::PatchEmbedding pe(2, 2, 4, 3);
  CHECK(pe.num_patches == 4);
  CHECK(names(pe) == std::vector<std::string>{"cls_token", "proj.weight", "proj.bias"});
  // our Linear weight [d, C p p] = conv weight [d, C, p, p].reshape(d, -1)
  CHECK(pe.load_state_dict({{"cls_token", vals({1, 1, 3}, 8)},
                            {"proj.weight", vals({3, 2, 2, 2}, 5).reshape({3, 8})},
                            {"proj.bias", vals({3}, 6)}})
            .ok());
  Tensor img = vals({1, 2, 4, 6}, 0);  // H 4, W 6: 2 x 3 patches, numbered row-major
  Tensor y = pe.forward(img);
  CHECK(y.shape() == Shape{1, 6, 3});
  check_close(y,
              {0.174357809, -0.263207362, 0.82552492, -0.829624748, 1.12947655, 0.266959974, 0.728590928,
               -0.0932979515, 0.0806587924, -0.539902749, 1.13353878, -0.0273197142, 0.604117109, -0.257181658,
               0.389004969, -1.01426306, 0.886379559, 0.724345459},
              1e-5, 1e-5);
  // patch 1 is the top row's second one: image[0, c, 0:2, 2:4] flattened as (c, i, j)
  std::vector<double> iv = img.to_vector<double>(), p1 = pe.patchify(img).select(1, 1).to_vector<double>();
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) CHECK(p1[size_t(c * 4 + i * 2 + j)] == iv[size_t(c * 24 + i * 6 + 2 + j)]);

  Tensor with_cls = pe.with_cls_token(y.expand({2, 6, 3}));
  CHECK(with_cls.shape() == Shape{2, 7, 3});
  check_close(with_cls.select(0, 1).select(0, 0), vals({3}, 8), 0, 0);
  check_close(with_cls.select(0, 1).narrow(0, 1, 6), y.select(0, 0), 0, 0);

  AG_CHECK_ERROR(pe.forward(zeros({1, 2, 5, 6})), "PatchEmbedding", "H 5", "patch 2");
  AG_CHECK_ERROR(pe.forward(zeros({1, 2, 4, 7})), "PatchEmbedding", "W 7", "patch 2");
  AG_CHECK_ERROR(pe.forward(zeros({1, 3, 4, 4})), "PatchEmbedding", "[B, 2, H, W]", "[1,3,4,4]");
  AG_CHECK_ERROR(nn::PatchEmbedding(2, 3, 4, 3), "PatchEmbedding", "image_size 4", "patch 3");
}

TEST_CASE("PatchEmbedding: gradcheck w.r.t. image, weight, bias and cls_token") {
  nn::PatchEmbedding pe(1, 2, 4, 2, DType::f64);
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        pe.proj->weight = in[1], pe.proj->bias = in[2], pe.cls_token = in[3];
        return pe.with_cls_token(pe.forward(in[0]));
      },
      {leaf64({2, 1, 4, 4}, 1), leaf64({2, 4}, 2), leaf64({2}, 3), leaf64({1, 1, 2}, 4)});
}
