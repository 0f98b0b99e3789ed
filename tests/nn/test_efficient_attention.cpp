// LinformerAttention, MemoryCompressedAttention and AxialAttention (nn/efficient_attention.h).
// The forward references below are written with plain loops over the layers' parameters (read back
// as numbers), not with the layers' own code: projections, compression, scores, softmax, masks.
// Gradchecks substitute the f64 inputs gradcheck perturbs for a layer's members (qkv->weight = in[1]):
// forward reads the members, so the gradient of every parameter is checked through the real forward.
// Attention dropout: the references take the mask from the rule of core/kernels/dropout_mask.h (which
// Philox elements a call's weights use, kept when u >= p) and scale a kept weight by 1 / (1 - p) themselves.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/kernels/dropout_mask.h"
#include "nn/efficient_attention.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

using Mat = std::vector<std::vector<double>>;  // rows

std::vector<std::string> names(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, t] : m.named_parameters()) out.push_back(name);
  return out;
}

// x[b] of a (B, T, d) tensor as T rows
Mat batch_rows(const Tensor& x, int64_t b) {
  const int64_t T = x.size(1), d = x.size(2);
  std::vector<double> v = x.to_vector<double>();
  Mat m(static_cast<size_t>(T), std::vector<double>(static_cast<size_t>(d)));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < d; ++c) m[t][c] = v[size_t((b * T + t) * d + c)];
  return m;
}

Mat matrix(const Tensor& w) {  // a 2-D tensor as rows
  std::vector<double> v = w.to_vector<double>();
  Mat m(static_cast<size_t>(w.size(0)), std::vector<double>(static_cast<size_t>(w.size(1))));
  for (int64_t i = 0; i < w.size(0); ++i)
    for (int64_t j = 0; j < w.size(1); ++j) m[i][j] = v[size_t(i * w.size(1) + j)];
  return m;
}

// rows of X times W^T plus b, W (out, in)
Mat affine(const Mat& X, const Tensor& W, const Tensor& b) {
  Mat w = matrix(W);
  std::vector<double> bias = b.defined() ? b.to_vector<double>() : std::vector<double>(w.size(), 0.0);
  Mat y(X.size(), std::vector<double>(w.size()));
  for (size_t n = 0; n < X.size(); ++n)
    for (size_t o = 0; o < w.size(); ++o) {
      double acc = bias[o];
      for (size_t i = 0; i < w[o].size(); ++i) acc += X[n][i] * w[o][i];
      y[n][o] = acc;
    }
  return y;
}

Mat columns(const Mat& X, size_t from, size_t n) {
  Mat y(X.size(), std::vector<double>(n));
  for (size_t r = 0; r < X.size(); ++r)
    for (size_t c = 0; c < n; ++c) y[r][c] = X[r][from + c];
  return y;
}

// The factor of weight (h, i, j) of one sequence after attention dropout: 0 or 1 / (1 - p).
using Keep = std::function<double(size_t h, size_t i, size_t j)>;

// Multi-head attention by loops: per head h, columns [h hs, (h+1) hs). A query that sees no key
// gets zeros. keep: attention dropout on the weights (none when empty).
Mat attend(const Mat& Q, const Mat& K, const Mat& V, int64_t H, const std::function<bool(size_t, size_t)>& visible,
           const Keep& keep = nullptr) {
  const size_t d = Q[0].size(), hs = d / size_t(H);
  Mat out(Q.size(), std::vector<double>(d, 0.0));
  for (size_t h = 0; h < size_t(H); ++h)
    for (size_t i = 0; i < Q.size(); ++i) {
      std::vector<double> s(K.size());
      double m = -INFINITY;
      for (size_t j = 0; j < K.size(); ++j) {
        if (!visible(i, j)) continue;
        double dot = 0;
        for (size_t c = 0; c < hs; ++c) dot += Q[i][h * hs + c] * K[j][h * hs + c];
        s[j] = dot / std::sqrt(double(hs));
        m = std::max(m, s[j]);
      }
      if (m == -INFINITY) continue;  // sees no key
      double z = 0;
      for (size_t j = 0; j < K.size(); ++j) z += visible(i, j) ? std::exp(s[j] - m) : 0.0;
      for (size_t j = 0; j < K.size(); ++j) {
        if (!visible(i, j)) continue;
        const double p = std::exp(s[j] - m) / z * (keep ? keep(h, i, j) : 1.0);
        for (size_t c = 0; c < hs; ++c) out[i][h * hs + c] += p * V[j][h * hs + c];
      }
    }
  return out;
}

std::vector<double> flat(const std::vector<Mat>& per_batch) {
  std::vector<double> v;
  for (const Mat& m : per_batch)
    for (const auto& r : m) v.insert(v.end(), r.begin(), r.end());
  return v;
}

// Attention dropout, by the rule of core/kernels/dropout_mask.h: the weights of one attention call,
// (N, H, Tq, Tk) row-major, use elements e = ((n H + h) Tq + i) Tk + j of the Philox stream
// (seed, offset) the call reserves from its generator; weight e is kept when dropout_keep(...), and
// a kept weight is multiplied by 1 / (1 - p), computed here.
struct Drop {
  uint64_t seed, offset;
  double p;
  int64_t H, Tq, Tk;  // the call's heads and weight rows and columns
  double factor(int64_t n, size_t h, size_t i, size_t j) const {
    const uint64_t e = uint64_t(((n * H + int64_t(h)) * Tq + int64_t(i)) * Tk + int64_t(j));
    return dropout_keep(seed, offset, e, p) ? 1.0 / (1.0 - p) : 0.0;
  }
  uint64_t blocks(int64_t N) const { return dropout_blocks(N * H * Tq * Tk); }  // what the call reserves
  // Weights dropped out of the call's N H Tq Tk: a test whose mask keeps or drops all is no test.
  int64_t dropped(int64_t N) const {
    int64_t n = 0;
    for (int64_t e = 0; e < N * H * Tq * Tk; ++e) n += dropout_keep(seed, offset, uint64_t(e), p) ? 0 : 1;
    return n;
  }
};
// The Drop of a call whose weights are (N, H, Tq, Tk), at the offset `g` stands at before it.
Drop drop_at(const Generator& g, double p, int64_t H, int64_t Tq, int64_t Tk) {
  return {g.seed(), g.offset(), p, H, Tq, Tk};
}

// valid[b][t]: false at the padded positions
using Valid = std::vector<std::vector<bool>>;
Valid all_valid(int64_t B, int64_t T) { return Valid(size_t(B), std::vector<bool>(size_t(T), true)); }

// drop: the weights (B, H, T, k) of the one attention call, or null in eval.
std::vector<double> linformer_reference(const nn::LinformerAttention& m, const Tensor& x, const Valid& valid,
                                        const Drop* drop = nullptr) {
  const int64_t B = x.size(0), T = x.size(1);
  const size_t d = size_t(m.d_model);
  Mat E = matrix(m.E), F = matrix(m.F);
  std::vector<Mat> ys;
  for (int64_t b = 0; b < B; ++b) {
    Mat qkv = affine(batch_rows(x, b), m.qkv->weight, m.qkv->bias);
    Mat Q = columns(qkv, 0, d), K = columns(qkv, d, d), V = columns(qkv, 2 * d, d);
    Mat Kp(size_t(m.k), std::vector<double>(d, 0.0)), Vp = Kp;
    for (size_t r = 0; r < size_t(m.k); ++r)
      for (size_t t = 0; t < size_t(T); ++t) {
        if (!valid[b][t]) continue;  // padded keys and values are zeroed before the projection
        for (size_t c = 0; c < d; ++c) Kp[r][c] += E[r][t] * K[t][c], Vp[r][c] += F[r][t] * V[t][c];
      }
    Keep keep;
    if (drop) keep = [&](size_t h, size_t i, size_t j) { return drop->factor(b, h, i, j); };
    Mat o = attend(Q, Kp, Vp, m.n_heads, [](size_t, size_t) { return true; }, keep);
    ys.push_back(affine(o, m.proj->weight, m.proj->bias));
  }
  return flat(ys);
}

// drop: the weights of the one attention call, or null in eval. Not causal, they are (B, H, T, Tc).
// Causal, the layer folds the queries (nn/efficient_attention.cpp): query i of head h stands at
// i' = i + 1, in group g = i' / s of head h s + i' % s, and block j is key j + 1 after a hidden
// dummy key, so the weights are (B, H s, G, G) with G = Tc + 1.
std::vector<double> compressed_reference(const nn::MemoryCompressedAttention& m, const Tensor& x, const Valid& valid,
                                         bool causal, const Drop* drop = nullptr) {
  const int64_t B = x.size(0), T = x.size(1), s = m.stride;
  const int64_t Tc = (T + s - 1) / s;
  const size_t d = size_t(m.d_model);
  std::vector<Mat> ys;
  for (int64_t b = 0; b < B; ++b) {
    Mat qkv = affine(batch_rows(x, b), m.qkv->weight, m.qkv->bias);
    Mat Q = columns(qkv, 0, d), K = columns(qkv, d, d), V = columns(qkv, 2 * d, d);
    // block j: the s rows j s .. j s + s - 1 side by side, zeros past T and at padded positions
    Mat Kb(size_t(Tc), std::vector<double>(size_t(s) * d, 0.0)), Vb = Kb;
    std::vector<bool> hidden(size_t(Tc), true);
    for (int64_t t = 0; t < T; ++t) {
      if (!valid[b][t]) continue;
      hidden[t / s] = false;
      for (size_t c = 0; c < d; ++c) Kb[t / s][(t % s) * d + c] = K[t][c], Vb[t / s][(t % s) * d + c] = V[t][c];
    }
    Mat Kc = affine(Kb, m.compress_k->weight, m.compress_k->bias);
    Mat Vc = affine(Vb, m.compress_v->weight, m.compress_v->bias);
    Keep keep;
    if (drop && !causal) keep = [&](size_t h, size_t i, size_t j) { return drop->factor(b, h, i, j); };
    if (drop && causal)
      keep = [&](size_t h, size_t i, size_t j) {
        return drop->factor(b, h * size_t(s) + (i + 1) % size_t(s), (i + 1) / size_t(s), j + 1);
      };
    Mat o = attend(
        Q, Kc, Vc, m.n_heads,
        [&](size_t i, size_t j) { return !hidden[j] && (!causal || int64_t((j + 1) * s - 1) <= int64_t(i)); }, keep);
    ys.push_back(affine(o, m.proj->weight, m.proj->bias));
  }
  return flat(ys);
}

Mat mha_reference(const nn::MultiHeadAttention& m, const Mat& X, bool causal, const Keep& keep = nullptr) {
  const size_t d = size_t(m.d_model);
  Mat qkv = affine(X, m.qkv->weight, m.qkv->bias);
  Mat o = attend(columns(qkv, 0, d), columns(qkv, d, d), columns(qkv, 2 * d, d), m.n_heads,
                 [&](size_t i, size_t j) { return !causal || j <= i; }, keep);
  return affine(o, m.proj->weight, m.proj->bias);
}

// drop_row, drop_col: the weights of the row attention, (B Hh, H, Ww, Ww) with sequence b Hh + r,
// and of the column attention after it, (B Ww, H, Hh, Hh) with sequence b Ww + c; null in eval.
std::vector<double> axial_reference(const nn::AxialAttention& m, const Tensor& x, const Drop* drop_row = nullptr,
                                    const Drop* drop_col = nullptr) {
  const int64_t B = x.size(0), Hh = m.height, Ww = m.width;
  std::vector<Mat> ys;
  for (int64_t b = 0; b < B; ++b) {
    Mat X = batch_rows(x, b), Z = X, Y = X;
    for (int64_t r = 0; r < Hh; ++r) {  // each row among itself
      Mat row(X.begin() + r * Ww, X.begin() + (r + 1) * Ww);
      Keep keep;
      if (drop_row) keep = [&](size_t h, size_t i, size_t j) { return drop_row->factor(b * Hh + r, h, i, j); };
      Mat out = mha_reference(*m.row, row, m.options.causal, keep);
      for (int64_t c = 0; c < Ww; ++c) Z[r * Ww + c] = out[c];
    }
    for (int64_t c = 0; c < Ww; ++c) {  // then each column among itself
      Mat col;
      for (int64_t r = 0; r < Hh; ++r) col.push_back(Z[r * Ww + c]);
      Keep keep;
      if (drop_col) keep = [&](size_t h, size_t i, size_t j) { return drop_col->factor(b * Ww + c, h, i, j); };
      Mat out = mha_reference(*m.col, col, m.options.causal, keep);
      for (int64_t r = 0; r < Hh; ++r) Y[r * Ww + c] = out[r];
    }
    ys.push_back(Y);
  }
  return flat(ys);
}

Tensor i64s(const std::vector<int64_t>& v) { return from_vector<int64_t>(v); }

Tensor bools(const std::vector<bool>& v, const Shape& shape) {
  std::vector<double> d(v.begin(), v.end());
  return gt(from_vector<double>(d, shape), 0.5);
}

bool all_finite(const Tensor& t) {
  for (double v : t.to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

// A gradcheck's function of the input in[0] and every parameter, in[1...]: the layer's parameters
// become those inputs, in the order the layer names them.
void set_parameters(nn::LinformerAttention& lin, const std::vector<Tensor>& in) {
  lin.qkv->weight = in[1], lin.qkv->bias = in[2], lin.proj->weight = in[3], lin.proj->bias = in[4];
  lin.E = in[5], lin.F = in[6];
}
void set_parameters(nn::MemoryCompressedAttention& mca, const std::vector<Tensor>& in) {
  mca.qkv->weight = in[1], mca.qkv->bias = in[2];
  mca.compress_k->weight = in[3], mca.compress_k->bias = in[4];
  mca.compress_v->weight = in[5], mca.compress_v->bias = in[6];
  mca.proj->weight = in[7], mca.proj->bias = in[8];
}
void set_parameters(nn::AxialAttention& ax, const std::vector<Tensor>& in) {
  ax.row->qkv->weight = in[1], ax.row->qkv->bias = in[2], ax.row->proj->weight = in[3], ax.row->proj->bias = in[4];
  ax.col->qkv->weight = in[5], ax.col->qkv->bias = in[6], ax.col->proj->weight = in[7], ax.col->proj->bias = in[8];
}

}  // namespace

// ================================== LinformerAttention ===========================================

TEST_CASE("LinformerAttention: parameter names, shapes and init bound") {
  nn::LinformerAttention lin(8, 2, 16, 4);
  CHECK(names(lin) == std::vector<std::string>{"E", "F", "qkv.weight", "qkv.bias", "proj.weight", "proj.bias"});
  CHECK(lin.E.shape() == Shape{4, 16});
  CHECK(lin.F.shape() == Shape{4, 16});
  CHECK(lin.qkv->weight.shape() == Shape{24, 8});
  const double bound = 1.0 / std::sqrt(16.0);
  CHECK(max(abs(lin.E)).to_vector<double>()[0] <= bound);
  CHECK(max(abs(lin.F)).to_vector<double>()[0] <= bound);
  Tensor x = randn({2, 10, 8});
  nn::AttentionOptions o;
  o.need_weights = true;
  nn::AttentionResult r = lin.forward(x, o);
  CHECK(r.out.shape() == Shape{2, 10, 8});
  CHECK(r.weights.shape() == Shape{2, 2, 10, 4});
  check_close(sum(r.weights, {3}), ones({2, 2, 10}), 1e-5, 1e-5);
}

TEST_CASE("LinformerAttention: forward matches a loop reference in f64 (no padding, lengths, mask)") {
  Generator g(3);
  nn::LinformerAttention lin(4, 2, 7, 3, {.dtype = DType::f64, .generator = &g});
  Tensor x = randn({2, 5, 4}, DType::f64, &g);
  check_close(lin.forward(x).out, linformer_reference(lin, x, all_valid(2, 5)), 1e-10, 1e-10);

  Valid valid = all_valid(2, 5);
  valid[0][3] = valid[0][4] = false;  // lengths {3, 5}
  nn::AttentionOptions o;
  o.key_padding_lengths = i64s({3, 5});
  check_close(lin.forward(x, o).out, linformer_reference(lin, x, valid), 1e-10, 1e-10);

  valid = all_valid(2, 5);
  valid[0][1] = valid[1][0] = valid[1][4] = false;
  nn::AttentionOptions om;
  om.key_padding_mask = bools({0, 1, 0, 0, 0, 1, 0, 0, 0, 1}, {2, 5});
  check_close(lin.forward(x, om).out, linformer_reference(lin, x, valid), 1e-10, 1e-10);

  // every key padded: k' = v' = 0, the attention gives 0 and y = proj's bias, not NaN
  nn::AttentionOptions none;
  none.key_padding_lengths = i64s({0, 0});
  Tensor y = lin.forward(x, none).out;
  CHECK(all_finite(y));
  check_close(y, lin.proj->bias.reshape({1, 1, 4}).expand({2, 5, 4}).contiguous(), 1e-12, 0);
}

TEST_CASE("LinformerAttention: gradcheck w.r.t. input and every parameter (plain, key padding)") {
  nn::LinformerAttention lin(4, 2, 6, 3, {.dtype = DType::f64});
  for (int padding : {0, 1, 2}) {
    CAPTURE(padding);
    nn::AttentionOptions o;
    if (padding == 1) o.key_padding_lengths = i64s({2, 4});
    if (padding == 2) o.key_padding_mask = bools({1, 0, 0, 1, 0, 0, 0, 0}, {2, 4});
    expect_gradcheck(
        [&](const std::vector<Tensor>& in) {
          set_parameters(lin, in);
          return lin.forward(in[0], o).out;
        },
        {leaf64({2, 4, 4}, 1), leaf64({12, 4}, 2, 0.5), leaf64({12}, 3), leaf64({4, 4}, 4), leaf64({4}, 5),
         leaf64({3, 6}, 6, 0.5), leaf64({3, 6}, 7, 0.5)});
  }
}

TEST_CASE("LinformerAttention: attention dropout by hand in training, none in eval, gradcheck with the mask fixed") {
  const double p = 0.3;
  Generator g(41);
  nn::LinformerAttention lin(4, 2, 7, 3, {.dropout = p, .dtype = DType::f64, .generator = &g});
  const Tensor x = randn({2, 5, 4}, DType::f64, &g);
  nn::AttentionOptions lengths;
  lengths.key_padding_lengths = i64s({5, 3});
  const Valid short_second{{true, true, true, true, true}, {true, true, true, false, false}};
  // training (a module's mode until eval()): the weights (B, H, T, k) = (2, 2, 5, 3) take the
  // elements the layer's generator reserves at the call, and a kept weight is scaled by 1 / (1 - p)
  for (bool padded : {false, true}) {
    CAPTURE(padded);
    const Drop drop = drop_at(g, p, 2, 5, 3);
    REQUIRE(drop.dropped(2) > 0);
    REQUIRE(drop.dropped(2) < 2 * 2 * 5 * 3);
    const Tensor y = lin.forward(x, padded ? lengths : nn::AttentionOptions{}).out;
    CHECK(g.offset() == drop.offset + drop.blocks(2));
    check_close(y, linformer_reference(lin, x, padded ? short_second : all_valid(2, 5), &drop), 1e-10, 1e-10);
  }
  // eval: no dropout, and nothing drawn from the generator
  lin.eval();
  const uint64_t offset = g.offset();
  check_close(lin.forward(x).out, linformer_reference(lin, x, all_valid(2, 5)), 1e-10, 1e-10);
  CHECK(g.offset() == offset);
  // the gradients with one mask: every forward of the gradcheck rewinds the generator to one state
  lin.train();
  const Generator fixed = g;
  REQUIRE(drop_at(fixed, p, 2, 4, 3).dropped(2) > 0);
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        g = fixed;
        set_parameters(lin, in);
        return lin.forward(in[0]).out;
      },
      {leaf64({2, 4, 4}, 1), leaf64({12, 4}, 2, 0.5), leaf64({12}, 3), leaf64({4, 4}, 4), leaf64({4}, 5),
       leaf64({3, 7}, 6, 0.5), leaf64({3, 7}, 7, 0.5)});
}

TEST_CASE("LinformerAttention: errors name the layer, the option and the value") {
  const std::string L = "LinformerAttention";
  AG_CHECK_ERROR(nn::LinformerAttention(6, 4, 8, 2), L.c_str(), "d_model 6", "n_heads 4");
  AG_CHECK_ERROR(nn::LinformerAttention(8, 0, 8, 2), L.c_str(), "n_heads", "0");
  AG_CHECK_ERROR(nn::LinformerAttention(-8, 2, 8, 2), L.c_str(), "d_model", "-8");
  AG_CHECK_ERROR(nn::LinformerAttention(8, 2, -3, 2), L.c_str(), "max_len", "-3");
  AG_CHECK_ERROR(nn::LinformerAttention(8, 2, 8, 0), L.c_str(), "k (the projected length)", "0");
  AG_CHECK_ERROR(nn::LinformerAttention(8, 2, 8, 2, {.dropout = 1.5}), L.c_str(), "dropout", "1.5");
  nn::LinformerAttention lin(8, 2, 6, 3);
  AG_CHECK_ERROR(lin.forward(zeros({2, 7, 8})), L.c_str(), "T = 7", "max_len = 6");
  AG_CHECK_ERROR(lin.forward(zeros({2, 4})), L.c_str(), "[B, T, 8]", "[2,4]");
  AG_CHECK_ERROR(lin.forward(zeros({2, 4, 5})), L.c_str(), "[B, T, 8]", "[2,4,5]");
  Tensor x = zeros({2, 4, 8});
  nn::AttentionOptions causal;
  causal.causal = true;
  AG_CHECK_ERROR(lin.forward(x, causal), L.c_str(), "causal", "not causal by construction");
  nn::AttentionOptions w;
  w.window = 2;
  AG_CHECK_ERROR(lin.forward(x, w), L.c_str(), "window", "2");
  nn::KVCache cache;
  nn::AttentionOptions c;
  c.cache = &cache;
  AG_CHECK_ERROR(lin.forward(x, c), L.c_str(), "cache");
  nn::AttentionOptions len;
  len.key_padding_lengths = i64s({1, 5});
  AG_CHECK_ERROR(lin.forward(x, len), L.c_str(), "key_padding_lengths", "5");
  len.key_padding_lengths = i64s({1, 2, 3});
  AG_CHECK_ERROR(lin.forward(x, len), L.c_str(), "key_padding_lengths", "[3]");
  nn::AttentionOptions mask;
  mask.key_padding_mask = bools({0, 0, 0}, {1, 3});
  AG_CHECK_ERROR(lin.forward(x, mask), L.c_str(), "key_padding_mask", "[1,3]");
  mask.key_padding_lengths = i64s({1, 1});
  AG_CHECK_ERROR(lin.forward(x, mask), L.c_str(), "not both");
}

// ============================== MemoryCompressedAttention ========================================

TEST_CASE("MemoryCompressedAttention: parameter names and shapes") {
  nn::MemoryCompressedAttention mca(8, 2, 3);
  CHECK(names(mca) == std::vector<std::string>{"qkv.weight", "qkv.bias", "compress_k.weight", "compress_k.bias",
                                               "compress_v.weight", "compress_v.bias", "proj.weight", "proj.bias"});
  CHECK(mca.compress_k->weight.shape() == Shape{8, 24});
  nn::AttentionOptions o;
  o.need_weights = true;
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    o.causal = causal;
    nn::AttentionResult r = mca.forward(randn({2, 10, 8}), o);  // 10 = 3 blocks of 3 and one of 1
    CHECK(r.out.shape() == Shape{2, 10, 8});
    REQUIRE(r.weights.shape() == Shape{2, 2, 10, 4});
    std::vector<double> rows = sum(r.weights, {3}).to_vector<double>();
    for (size_t n = 0; n < rows.size(); ++n) {
      const int64_t i = int64_t(n % 10);
      // causal: queries 0, 1 see no block (weights all 0); the others' weights sum to 1 over the
      // blocks ending at or before them
      CHECK(rows[n] == doctest::Approx(causal && i < 2 ? 0.0 : 1.0).epsilon(1e-5));
    }
    if (causal) {
      std::vector<double> w = r.weights.to_vector<double>();
      for (size_t n = 0; n < w.size(); ++n) {
        const int64_t j = int64_t(n % 4), i = int64_t((n / 4) % 10);
        if ((j + 1) * 3 - 1 > i) CHECK(w[n] == 0.0);
      }
    }
  }
}

TEST_CASE("MemoryCompressedAttention: forward matches a loop reference in f64 (causal, padding, T % s != 0)") {
  Generator g(5);
  nn::MemoryCompressedAttention mca(4, 2, 2, {.dtype = DType::f64, .generator = &g});
  for (int64_t T : {6, 7}) {
    Tensor x = randn({2, T, 4}, DType::f64, &g);
    for (bool causal : {false, true}) {
      CAPTURE(T);
      CAPTURE(causal);
      nn::AttentionOptions o;
      o.causal = causal;
      check_close(mca.forward(x, o).out, compressed_reference(mca, x, all_valid(2, T), causal), 1e-10, 1e-10);

      // lengths {3, 1}: batch 0 has block 1 half padded, batch 1 keeps one position
      Valid valid = all_valid(2, T);
      for (int64_t t = 3; t < T; ++t) valid[0][t] = false;
      for (int64_t t = 1; t < T; ++t) valid[1][t] = false;
      nn::AttentionOptions ol = o;
      ol.key_padding_lengths = i64s({3, 1});
      check_close(mca.forward(x, ol).out, compressed_reference(mca, x, valid, causal), 1e-10, 1e-10);

      // a mask that pads a whole block (positions 2, 3 of batch 0) and scattered positions
      valid = all_valid(2, T);
      std::vector<bool> m(size_t(2 * T), false);
      for (int64_t t : {2, 3}) m[t] = true, valid[0][t] = false;
      for (int64_t t : {0, 5}) m[T + t] = true, valid[1][t] = false;
      nn::AttentionOptions om = o;
      om.key_padding_mask = bools(m, {2, T});
      check_close(mca.forward(x, om).out, compressed_reference(mca, x, valid, causal), 1e-10, 1e-10);
    }
  }
}

TEST_CASE("MemoryCompressedAttention: queries that see no block get zeros, not NaN (causal, padding)") {
  Generator g(9);
  nn::MemoryCompressedAttention mca(4, 2, 3, {.dtype = DType::f64, .generator = &g});
  Tensor x = randn({2, 7, 4}, DType::f64, &g).set_requires_grad(true);
  Tensor bias_rows = mca.proj->bias.detach();
  nn::AttentionOptions o;
  o.causal = true;
  Tensor y = mca.forward(x, o).out;  // queries 0, 1 see no block: the attention gives 0, y = proj's bias
  CHECK(all_finite(y));
  check_close(y.narrow(1, 0, 2).contiguous(), bias_rows.reshape({1, 1, 4}).expand({2, 2, 4}).contiguous(), 1e-12, 0);
  // every position of batch 1 padded: every query of it sees no block
  nn::AttentionOptions op;
  op.key_padding_lengths = i64s({7, 0});
  for (bool causal : {false, true}) {
    op.causal = causal;
    Tensor yp = mca.forward(x, op).out;
    CHECK(all_finite(yp));
    check_close(yp.select(0, 1).contiguous(), bias_rows.reshape({1, 4}).expand({7, 4}).contiguous(), 1e-12, 0);
    backward(sum(yp * yp));
    CHECK(all_finite(x.grad()));
    x.set_grad(Tensor());
  }
}

TEST_CASE("MemoryCompressedAttention: the zero end padding equals padded keys, and causal outputs ignore the future") {
  Generator g(13);
  nn::MemoryCompressedAttention mca(4, 2, 3, {.dtype = DType::f64, .generator = &g});
  Tensor x = randn({2, 9, 4}, DType::f64, &g);
  Tensor x7 = x.narrow(1, 0, 7).contiguous();
  // T = 7 with s = 3: the last block holds position 6 and two zero positions, which is what
  // key padding of positions 7, 8 of a 9-long input gives, for every query of the 7
  nn::AttentionOptions o;
  o.key_padding_lengths = i64s({7, 7});
  check_close(mca.forward(x7).out, mca.forward(x, o).out.narrow(1, 0, 7).contiguous(), 1e-12, 1e-12);
  // causal: query i sees only blocks that end at or before i, so its output is the same for any
  // continuation of the sequence (in particular, the end padding is never seen)
  nn::AttentionOptions c;
  c.causal = true;
  check_close(mca.forward(x7, c).out, mca.forward(x, c).out.narrow(1, 0, 7).contiguous(), 1e-12, 1e-12);
}

TEST_CASE("MemoryCompressedAttention: gradcheck w.r.t. input and every parameter (plain, causal, padding)") {
  nn::MemoryCompressedAttention mca(4, 2, 2, {.dtype = DType::f64});
  for (int padding : {0, 1, 2})
    for (bool causal : {false, true}) {
      CAPTURE(padding);
      CAPTURE(causal);
      nn::AttentionOptions o;
      o.causal = causal;
      if (padding == 1) o.key_padding_lengths = i64s({3, 5});
      if (padding == 2) o.key_padding_mask = bools({1, 1, 0, 0, 1, 0, 0, 1, 0, 0}, {2, 5});
      expect_gradcheck(
          [&](const std::vector<Tensor>& in) {
            set_parameters(mca, in);
            return mca.forward(in[0], o).out;
          },
          // T = 5: two full blocks of 2 and one of 1
          {leaf64({2, 5, 4}, 1), leaf64({12, 4}, 2, 0.5), leaf64({12}, 3), leaf64({4, 8}, 4, 0.5), leaf64({4}, 5),
           leaf64({4, 8}, 6, 0.5), leaf64({4}, 7), leaf64({4, 4}, 8), leaf64({4}, 9)});
    }
}

TEST_CASE("MemoryCompressedAttention: attention dropout by hand in training (plain, causal), none in eval, gradcheck") {
  const double p = 0.3;
  Generator g(43);
  nn::MemoryCompressedAttention mca(4, 2, 2, {.dropout = p, .dtype = DType::f64, .generator = &g});
  const Tensor x = randn({2, 7, 4}, DType::f64, &g);  // T = 7, s = 2: Tc = 4 blocks, the last one half empty
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    nn::AttentionOptions o;
    o.causal = causal;
    // training: plain, the weights are (B, H, T, Tc) = (2, 2, 7, 4); causal, the folded ones
    // (B, H s, G, G) = (2, 4, 5, 5) (see compressed_reference)
    const Drop drop = causal ? drop_at(g, p, 2 * 2, 5, 5) : drop_at(g, p, 2, 7, 4);
    REQUIRE(drop.dropped(2) > 0);
    REQUIRE(drop.dropped(2) < 2 * drop.H * drop.Tq * drop.Tk);
    const Tensor y = mca.forward(x, o).out;
    CHECK(g.offset() == drop.offset + drop.blocks(2));
    check_close(y, compressed_reference(mca, x, all_valid(2, 7), causal, &drop), 1e-10, 1e-10);
    // eval: no dropout, and nothing drawn from the generator
    mca.eval();
    const uint64_t offset = g.offset();
    check_close(mca.forward(x, o).out, compressed_reference(mca, x, all_valid(2, 7), causal), 1e-10, 1e-10);
    CHECK(g.offset() == offset);
    mca.train();
    // the gradients with one mask: every forward of the gradcheck rewinds the generator to one state
    const Generator fixed = g;
    expect_gradcheck(
        [&](const std::vector<Tensor>& in) {
          g = fixed;
          set_parameters(mca, in);
          return mca.forward(in[0], o).out;
        },
        {leaf64({2, 5, 4}, 1), leaf64({12, 4}, 2, 0.5), leaf64({12}, 3), leaf64({4, 8}, 4, 0.5), leaf64({4}, 5),
         leaf64({4, 8}, 6, 0.5), leaf64({4}, 7), leaf64({4, 4}, 8), leaf64({4}, 9)});
  }
}

TEST_CASE("MemoryCompressedAttention: errors name the layer, the option and the value") {
  const std::string L = "MemoryCompressedAttention";
  AG_CHECK_ERROR(nn::MemoryCompressedAttention(6, 4, 2), L.c_str(), "d_model 6", "n_heads 4");
  AG_CHECK_ERROR(nn::MemoryCompressedAttention(8, 2, 0), L.c_str(), "stride", "0");
  AG_CHECK_ERROR(nn::MemoryCompressedAttention(8, 2, -2), L.c_str(), "stride", "-2");
  AG_CHECK_ERROR(nn::MemoryCompressedAttention(8, 2, 2, {.dropout = -0.1}), L.c_str(), "dropout", "-0.1");
  nn::MemoryCompressedAttention mca(8, 2, 2);
  AG_CHECK_ERROR(mca.forward(zeros({2, 4, 6})), L.c_str(), "[B, T, 8]", "[2,4,6]");
  AG_CHECK_ERROR(mca.forward(zeros({2, 0, 8})), L.c_str(), "non-empty");
  Tensor x = zeros({2, 5, 8});
  nn::AttentionOptions w;
  w.window = 3;
  AG_CHECK_ERROR(mca.forward(x, w), L.c_str(), "window", "3");
  nn::AttentionOptions len;
  len.key_padding_lengths = i64s({-1, 2});
  AG_CHECK_ERROR(mca.forward(x, len), L.c_str(), "key_padding_lengths", "-1");
  nn::AttentionOptions mask;
  mask.key_padding_mask = bools({0, 0, 0, 0}, {2, 2});
  AG_CHECK_ERROR(mca.forward(x, mask), L.c_str(), "key_padding_mask", "[2,2]");
}

// ==================================== AxialAttention =============================================

TEST_CASE("AxialAttention: parameter names and shapes") {
  nn::AxialAttention ax(8, 2, 3, 4);
  CHECK(names(ax) == std::vector<std::string>{"row.qkv.weight", "row.qkv.bias", "row.proj.weight", "row.proj.bias",
                                              "col.qkv.weight", "col.qkv.bias", "col.proj.weight", "col.proj.bias"});
  CHECK(ax.forward(randn({2, 12, 8})).shape() == Shape{2, 12, 8});
}

TEST_CASE("AxialAttention: forward matches a loop reference in f64 (rows then columns, causal)") {
  Generator g(17);
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    nn::AxialAttention ax(4, 2, 3, 2, {.causal = causal, .dtype = DType::f64, .generator = &g});
    Tensor x = randn({2, 6, 4}, DType::f64, &g);
    check_close(ax.forward(x), axial_reference(ax, x), 1e-10, 1e-10);
  }
}

TEST_CASE("AxialAttention: causal receptive field is the rectangle up and to the left") {
  // d(y at (r, c)) / d(x at (r', c')) is nonzero exactly when r' <= r and c' <= c (causal);
  // everywhere without the mask
  const int64_t Hh = 3, Ww = 3;
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    Generator g(19);
    nn::AxialAttention ax(4, 2, Hh, Ww, {.causal = causal, .dtype = DType::f64, .generator = &g});
    Tensor x = randn({1, Hh * Ww, 4}, DType::f64, &g).set_requires_grad(true);
    for (int64_t r = 0; r < Hh; ++r)
      for (int64_t c = 0; c < Ww; ++c) {
        x.set_grad(Tensor());
        backward(sum(ax.forward(x).select(1, r * Ww + c)));
        std::vector<double> gx = sum(abs(x.grad()), {2}).to_vector<double>();
        for (int64_t r2 = 0; r2 < Hh; ++r2)
          for (int64_t c2 = 0; c2 < Ww; ++c2) {
            CAPTURE(r);
            CAPTURE(c);
            CAPTURE(r2);
            CAPTURE(c2);
            const bool seen = !causal || (r2 <= r && c2 <= c);
            CHECK((gx[r2 * Ww + c2] > 1e-12) == seen);
          }
      }
  }
}

TEST_CASE("AxialAttention: gradcheck w.r.t. input and every parameter (plain and causal)") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    nn::AxialAttention ax(4, 2, 2, 3, {.causal = causal, .dtype = DType::f64});
    expect_gradcheck(
        [&](const std::vector<Tensor>& in) {
          set_parameters(ax, in);
          return ax.forward(in[0]);
        },
        {leaf64({2, 6, 4}, 1), leaf64({12, 4}, 2, 0.5), leaf64({12}, 3), leaf64({4, 4}, 4), leaf64({4}, 5),
         leaf64({12, 4}, 6, 0.5), leaf64({12}, 7), leaf64({4, 4}, 8), leaf64({4}, 9)});
  }
}

TEST_CASE("AxialAttention: attention dropout by hand in training (row, then column), none in eval, gradcheck") {
  const double p = 0.3;
  Generator g(47);
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    nn::AxialAttention ax(4, 2, 3, 2, {.dropout = p, .causal = causal, .dtype = DType::f64, .generator = &g});
    const Tensor x = randn({2, 6, 4}, DType::f64, &g);
    // training: the row attention draws first, weights (B Hh, H, Ww, Ww) = (6, 2, 2, 2); the column
    // attention next, from where the row's left the generator, (B Ww, H, Hh, Hh) = (4, 2, 3, 3)
    const Drop row = drop_at(g, p, 2, 2, 2);
    Drop col = drop_at(g, p, 2, 3, 3);
    col.offset += row.blocks(6);
    REQUIRE(row.dropped(6) > 0);
    REQUIRE(row.dropped(6) < 6 * 2 * 2 * 2);
    REQUIRE(col.dropped(4) > 0);
    REQUIRE(col.dropped(4) < 4 * 2 * 3 * 3);
    const Tensor y = ax.forward(x);
    CHECK(g.offset() == col.offset + col.blocks(4));
    check_close(y, axial_reference(ax, x, &row, &col), 1e-10, 1e-10);
    // eval: no dropout, and nothing drawn from the generator
    ax.eval();
    const uint64_t offset = g.offset();
    check_close(ax.forward(x), axial_reference(ax, x), 1e-10, 1e-10);
    CHECK(g.offset() == offset);
    ax.train();
    // the gradients with one mask: every forward of the gradcheck rewinds the generator to one state
    const Generator fixed = g;
    expect_gradcheck(
        [&](const std::vector<Tensor>& in) {
          g = fixed;
          set_parameters(ax, in);
          return ax.forward(in[0]);
        },
        {leaf64({2, 6, 4}, 1), leaf64({12, 4}, 2, 0.5), leaf64({12}, 3), leaf64({4, 4}, 4), leaf64({4}, 5),
         leaf64({12, 4}, 6, 0.5), leaf64({12}, 7), leaf64({4, 4}, 8), leaf64({4}, 9)});
  }
}

TEST_CASE("AxialAttention: errors name the layer, the option and the value") {
  const std::string L = "AxialAttention";
  AG_CHECK_ERROR(nn::AxialAttention(6, 4, 2, 2), L.c_str(), "d_model 6", "n_heads 4");
  AG_CHECK_ERROR(nn::AxialAttention(8, 2, 0, 2), L.c_str(), "height 0");
  AG_CHECK_ERROR(nn::AxialAttention(8, 2, 2, -3), L.c_str(), "width -3");
  AG_CHECK_ERROR(nn::AxialAttention(8, 2, 2, 2, {.dropout = 1.0}), L.c_str(), "dropout", "1");
  nn::AxialAttention ax(8, 2, 2, 3);
  AG_CHECK_ERROR(ax.forward(zeros({1, 5, 8})), L.c_str(), "2 * 3 = 6", "[1,5,8]");
  AG_CHECK_ERROR(ax.forward(zeros({1, 6, 4})), L.c_str(), "8", "[1,6,4]");
  AG_CHECK_ERROR(ax.forward(zeros({6, 8})), L.c_str(), "[6,8]");
}
