// Block-sparse attention: SdpaOptions::block_mask and block_size, the patterns of
// nn/sparse_patterns.h. The block mask's part of the rule and of the tile classification
// (core/kernels/attention_mask.h) against the element rule; the fused CPU kernel against an oracle
// composed from ordinary ops in f64 (forward and the three gradients) for both patterns, with
// causal and key padding, block sizes below, above and across the kernel's tiles; gradchecks;
// queries that see nothing; proof that dropped blocks are skipped, not masked; errors; the
// builders' formulas; MultiHeadAttention and the diagnostics with a pattern.
// The same on the GPU: tests/cuda/test_cuda_sparse_attention.cpp.
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "core/kernels/attention_mask.h"
#include "nn/attention.h"
#include "nn/diagnostics.h"
#include "nn/sparse_patterns.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

// A (rows, cols) block mask as bools, each block kept with probability `density`.
std::unique_ptr<bool[]> random_blocks(int64_t rows, int64_t cols, double density, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::unique_ptr<bool[]> m(new bool[size_t(std::max<int64_t>(rows * cols, 1))]);
  for (int64_t e = 0; e < rows * cols; ++e) m[size_t(e)] = u(rng) < density;
  return m;
}

Tensor blocks_tensor(const bool* m, int64_t rows, int64_t cols) {
  return from_vector<bool>(std::span<const bool>(m, size_t(rows * cols)), {rows, cols});
}

}  // namespace

// ---- the rule and the tile classification ----------------------------------------------------

TEST_CASE("attention mask: block mask rule, block_cover, tile classification and kept_run against the element rule") {
  // Exhaustive over small shapes and random block masks: visible(i, j) is the other masks' rule
  // and block_mask[i / bs][j / bs] (docs/ops.md); block_cover is exact; "hidden" tiles have no
  // visible (i, j) and "full" ones no hidden one, both exact without the other masks; the runs
  // of kept_run hold every key a row of the tile sees and no key of a column every row drops.
  int64_t hidden = 0, full = 0, partial = 0, elements = 0;
  for (int64_t Tq : {1, 5, 9})
    for (int64_t Tk : {1, 6, 11})
      for (int64_t bs : {1, 2, 3, 4, 7})
        for (uint64_t seed : {1, 2, 3})
          for (double density : {0.3, 0.7}) {
            const int64_t rows = (Tq + bs - 1) / bs, cols = (Tk + bs - 1) / bs;
            const auto kept = random_blocks(rows, cols, density, seed * 1000 + uint64_t(Tq * 100 + Tk * 10 + bs));
            auto block = [&](int64_t i, int64_t j) { return kept[size_t((i / bs) * cols + j / bs)]; };
            const int64_t lens[2] = {Tk, Tk / 2};
            for (bool causal : {false, true})
              for (int64_t window : {int64_t(-1), int64_t(1)})
                for (bool padded : {false, true}) {
                  if (causal && Tq > Tk) continue;
                  const Visibility plain{Tq, Tk, causal, window, padded ? lens : nullptr, nullptr};
                  Visibility m = plain;
                  m.block_mask = kept.get(), m.block_cols = cols, m.block_size = bs;
                  const bool others = causal || window >= 0 || padded;
                  INFO("Tq ", Tq, " Tk ", Tk, " bs ", bs, " causal ", causal, " window ", window, " padded ", padded);
                  for (int64_t b = 0; b < 2; ++b)
                    for (int64_t i = 0; i < Tq; ++i)
                      for (int64_t j = 0; j < Tk; ++j) {
                        ++elements;
                        CHECK(visible(m, b, i, j) == (visible(plain, b, i, j) && block(i, j)));
                        CHECK(block_kept(m, i, j) == block(i, j));
                      }
                  for (int64_t bq : {1, 2, 4})
                    for (int64_t bk : {1, 3, 4})
                      for (int64_t b = 0; b < 2; ++b)
                        for (int64_t i0 = 0; i0 < Tq; i0 += bq) {
                          const int64_t i1 = std::min(i0 + bq, Tq);
                          for (int64_t j0 = 0; j0 < Tk; j0 += bk) {
                            const int64_t j1 = std::min(j0 + bk, Tk);
                            int64_t seen = 0, in_kept = 0;
                            for (int64_t i = i0; i < i1; ++i)
                              for (int64_t j = j0; j < j1; ++j) seen += visible(m, b, i, j), in_kept += block(i, j);
                            const int64_t all = (i1 - i0) * (j1 - j0);
                            const BlockCover cover = block_cover(m, i0, i1, j0, j1);
                            CHECK((cover == BlockCover::none) == (in_kept == 0));
                            CHECK((cover == BlockCover::all) == (in_kept == all));
                            const TileVisibility t = tile_visibility(m, b, i0, i1, j0, j1);
                            if (t == TileVisibility::hidden) {
                              CHECK(seen == 0);
                              ++hidden;
                            } else if (t == TileVisibility::full) {
                              CHECK(seen == all);
                              ++full;
                            } else {
                              ++partial;
                            }
                            if (!others) {
                              CHECK((t == TileVisibility::hidden) == (seen == 0));
                              CHECK((t == TileVisibility::full) == (seen == all));
                            }
                          }
                          // the runs from key 0: disjoint, in order, inside [0, Tk)
                          std::vector<char> in_run(size_t(Tk), 0);
                          int64_t last = 0;
                          for (KeyRange r = kept_run(m, i0, i1, 0, Tk); !r.empty(); r = kept_run(m, i0, i1, r.hi, Tk)) {
                            CHECK(r.lo >= last);
                            CHECK(r.hi <= Tk);
                            for (int64_t j = r.lo; j < r.hi; ++j) in_run[size_t(j)] = 1;
                            last = r.hi;
                          }
                          for (int64_t j = 0; j < Tk; ++j) {
                            bool some_row_keeps = false;
                            for (int64_t i = i0; i < i1; ++i) {
                              some_row_keeps = some_row_keeps || block(i, j);
                              if (visible(m, b, i, j)) CHECK(in_run[size_t(j)]);
                            }
                            // a key outside the runs is in a column no block row of the tile keeps, and back
                            bool column_kept = false;
                            for (int64_t r = i0 / bs; r <= (i1 - 1) / bs; ++r) column_kept |= kept[size_t(r * cols + j / bs)];
                            CHECK(bool(in_run[size_t(j)]) == column_kept);
                            (void)some_row_keeps;
                          }
                        }
                }
          }
  CHECK(elements > 100000);
  CHECK(hidden > 1000);
  CHECK(full > 1000);
  CHECK(partial > 1000);
}

TEST_CASE("attention mask: kept_run walks O(kept blocks) keys, not Tq x Tk (the CPU kernel's tile walk)") {
  // The CPU kernel visits, for each tile of 32 queries, the keys of kept_run's runs from the first
  // key its rows may see (core/cpu/attention.cpp, for_each_key_tile). T = 4096, bs = 64: with only
  // the diagonal blocks kept a query tile walks its own 64 keys, 1/64 of the dense 4096.
  const int64_t T = 4096, bs = 64, n = T / bs;
  auto walked = [&](const Tensor& blocks, bool causal) {
    const Visibility m{T, T, causal, -1, nullptr, nullptr, blocks.data<bool>(), n, bs};
    int64_t keys = 0;
    for (int64_t i0 = 0; i0 < T; i0 += 32) {
      const KeyRange span = key_hull(m, 0, i0, i0 + 32);
      for (KeyRange r = kept_run(m, i0, i0 + 32, span.lo, span.hi); !r.empty(); r = kept_run(m, i0, i0 + 32, r.hi, span.hi))
        keys += r.hi - r.lo;
    }
    return keys;
  };
  const Tensor diagonal = nn::local_global_block_mask(T, bs, 0, 0);
  CHECK(walked(diagonal, false) == (T / 32) * bs);
  const Tensor dense = ones({n, n}, DType::b8);
  CHECK(walked(dense, false) == (T / 32) * T);
  // local + global: the band of 3 blocks and the global column, about (3 + 1) / 64 of the work,
  // and the global block row (two query tiles) sees everything
  CHECK(walked(nn::local_global_block_mask(T, bs, 1, 1), false) <= (T / 32) * 4 * bs + (bs / 32) * T);
  // strided, s = 8: 15 local + about n / 8 strided columns per row
  CHECK(walked(nn::strided_block_mask(T, bs, 8), false) <= (T / 32) * (15 + n / 8 + 1) * bs);
  // causal: a row walks keys up to its own only
  CHECK(walked(nn::local_global_block_mask(T, bs, 1, 1), true) <= (T / 32) * 3 * bs);
}

// ---- the fused CPU kernel against an oracle composed from ordinary ops ------------------------
namespace {

struct SparseCase {
  int64_t B = 2, H = 2, Tq = 70, Tk = 70, D = 5, Dv = 3;
  int64_t bs = 16;
  Tensor blocks;              // b8 (ceil(Tq/bs), ceil(Tk/bs))
  bool causal = false;
  std::vector<int64_t> lengths;  // key_padding_lengths, or empty
  std::vector<char> key_mask;    // key_padding_mask (B, Tk), or empty
};

// hidden (B, Tq, Tk) from docs/ops.md, written here apart from the header: key j is hidden from
// query i when causal and j > i + Tk - Tq, or j >= len[b], or mask[b, j], or the block of (i, j)
// is dropped.
std::vector<char> hidden_of(const SparseCase& c) {
  const std::vector<char> kept = [&] {
    std::vector<char> k;
    for (bool x : c.blocks.to_vector<uint8_t>()) k.push_back(x);
    return k;
  }();
  const int64_t cols = c.blocks.size(1);
  std::vector<char> h(size_t(c.B * c.Tq * c.Tk));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t i = 0; i < c.Tq; ++i)
      for (int64_t j = 0; j < c.Tk; ++j)
        h[size_t((b * c.Tq + i) * c.Tk + j)] = (c.causal && j > i + c.Tk - c.Tq) ||
                                               (!c.lengths.empty() && j >= c.lengths[size_t(b)]) ||
                                               (!c.key_mask.empty() && c.key_mask[size_t(b * c.Tk + j)]) ||
                                               !kept[size_t((i / c.bs) * cols + j / c.bs)];
  return h;
}

// out = softmax(masked_fill(q k^T scale, hidden, -inf)) v over ordinary ops, a row with no visible
// key giving 0 (it is left unmasked for the softmax, so no NaN enters, and zeroed after).
Tensor oracle(const Tensor& q, const Tensor& k, const Tensor& v, const SparseCase& c) {
  const std::vector<char> h = hidden_of(c);
  std::unique_ptr<bool[]> hide(new bool[h.size()]), none(new bool[size_t(c.B * c.Tq)]);
  for (int64_t r = 0; r < c.B * c.Tq; ++r) {
    bool all = true;
    for (int64_t j = 0; j < c.Tk; ++j) all = all && h[size_t(r * c.Tk + j)];
    none[size_t(r)] = all;
    for (int64_t j = 0; j < c.Tk; ++j) hide[size_t(r * c.Tk + j)] = h[size_t(r * c.Tk + j)] && !all;
  }
  const Tensor hide_t = from_vector<bool>(std::span<const bool>(hide.get(), h.size()), {c.B, 1, c.Tq, c.Tk});
  const Tensor none_t = from_vector<bool>(std::span<const bool>(none.get(), size_t(c.B * c.Tq)), {c.B, 1, c.Tq, 1});
  Tensor s = mul(matmul(q, k.mT()), 1.0 / std::sqrt(double(c.D)));
  Tensor w = softmax(masked_fill(s, hide_t, -std::numeric_limits<double>::infinity()), -1);
  w = where(none_t, zeros({}, w.dtype()), w);
  return matmul(w, v);
}

SdpaOptions options_of(const SparseCase& c) {
  SdpaOptions o;
  o.block_mask = c.blocks, o.block_size = c.bs, o.causal = c.causal;
  if (!c.lengths.empty()) o.key_padding_lengths = from_vector<int64_t>(c.lengths, {c.B});
  if (!c.key_mask.empty()) {
    std::unique_ptr<bool[]> km(new bool[c.key_mask.size()]);
    for (size_t e = 0; e < c.key_mask.size(); ++e) km[e] = c.key_mask[e];
    o.key_padding_mask = from_vector<bool>(std::span<const bool>(km.get(), c.key_mask.size()), {c.B, c.Tk});
  }
  return o;
}

// The fused kernel and the oracle on the same f64 inputs: out, then dq, dk, dv through a fixed
// random projection of the output.
void expect_matches_oracle(const SparseCase& c) {
  INFO("B ", c.B, " H ", c.H, " Tq ", c.Tq, " Tk ", c.Tk, " bs ", c.bs, " blocks ", c.blocks.shape(), " causal ",
       c.causal, " lengths ", !c.lengths.empty(), " key_mask ", !c.key_mask.empty());
  auto inputs = [&] {
    Generator g(7);
    auto leaf = [&](Shape s) { return randn(s, DType::f64, &g).set_requires_grad(true); };
    Tensor q = leaf({c.B, c.H, c.Tq, c.D}), k = leaf({c.B, c.H, c.Tk, c.D}), v = leaf({c.B, c.H, c.Tk, c.Dv});
    return std::vector{q, k, v};
  };
  const std::vector<Tensor> a = inputs(), b = inputs();
  Generator gr(99);
  const Tensor r = randn({c.B, c.H, c.Tq, c.Dv}, DType::f64, &gr);
  const Tensor yf = scaled_dot_product_attention(a[0], a[1], a[2], options_of(c)).out;
  const Tensor yo = oracle(b[0], b[1], b[2], c);
  check_close(yf, yo, 1e-11, 1e-10);
  for (double x : yf.to_vector<double>()) REQUIRE(std::isfinite(x));
  sum(mul(yf, r)).backward();
  sum(mul(yo, r)).backward();
  for (int t = 0; t < 3; ++t) check_close(a[size_t(t)].grad(), b[size_t(t)].grad(), 1e-11, 1e-10);
}

}  // namespace

TEST_CASE("sparse attention: the CPU kernel equals the composed oracle, both patterns, bs around its tiles") {
  // The kernel's tiles are 32 queries x 256 keys: bs 7 and 16 (smaller, 7 dividing neither), 48
  // (larger than 32, dividing neither 32 nor 256), 64; T not a multiple of bs.
  for (int64_t bs : {7, 16, 48, 64})
    for (int64_t T : {70, 100}) {
      const int64_t n = (T + bs - 1) / bs;
      for (const Tensor& blocks : {nn::local_global_block_mask(T, bs, 1, 1), nn::strided_block_mask(T, bs, 2),
                                   nn::strided_block_mask(T, bs, 3), nn::local_global_block_mask(T, bs, 0, 0)}) {
        REQUIRE(blocks.shape() == Shape{n, n});
        SparseCase c;
        c.Tq = c.Tk = T, c.bs = bs, c.blocks = blocks;
        expect_matches_oracle(c);
        c.causal = true;  // the autoregressive version
        expect_matches_oracle(c);
        c.lengths = {T, T / 3};  // and key padding
        expect_matches_oracle(c);
        c.causal = false, c.lengths.clear();
        c.key_mask.assign(size_t(2 * T), 0);
        for (int64_t j = 0; j < T; ++j) c.key_mask[size_t(j)] = j % 5 == 2, c.key_mask[size_t(T + j)] = j >= T / 2;
        expect_matches_oracle(c);
      }
    }
}

TEST_CASE("sparse attention: the CPU kernel equals the oracle for bs above its key tile and Tq < Tk") {
  // bs 300 > 256 keys per tile: 600 positions in 2 x 2 blocks, one dropped, and 3 x 3 with Tk 601
  {
    SparseCase c;
    c.B = 1, c.H = 1, c.Tq = c.Tk = 600, c.D = 4, c.Dv = 2, c.bs = 300;
    const bool m[4] = {true, false, true, true};
    c.blocks = blocks_tensor(m, 2, 2);
    expect_matches_oracle(c);
    c.causal = true;
    expect_matches_oracle(c);
    c.Tk = 601, c.causal = false;
    c.blocks = nn::strided_block_mask(601, 300, 2).narrow(0, 0, 2).contiguous();  // (2, 3)
    expect_matches_oracle(c);
  }
  // a query block at the end of the keys (a KV cache): causal bottom-right aligned, blocks by i
  for (int64_t bs : {5, 16, 40}) {
    SparseCase c;
    c.Tq = 40, c.Tk = 100, c.bs = bs;
    const int64_t rows = (40 + bs - 1) / bs, cols = (100 + bs - 1) / bs;
    const auto m = random_blocks(rows, cols, 0.5, uint64_t(bs));
    c.blocks = blocks_tensor(m.get(), rows, cols);
    expect_matches_oracle(c);
    c.causal = true, c.lengths = {100, 77};
    expect_matches_oracle(c);
  }
}

TEST_CASE("sparse attention: gradcheck of the fused kernel with a block mask") {
  for (bool causal : {false, true})
    for (int64_t bs : {2, 3}) {
      SdpaOptions o;
      o.causal = causal, o.block_size = bs;
      o.block_mask = nn::local_global_block_mask(7, bs, 0, 1);
      Generator g(11);
      auto leaf = [&](Shape s) { return randn(s, DType::f64, &g).set_requires_grad(true); };
      Tensor q = leaf({1, 2, 7, 3}), k = leaf({1, 2, 7, 3}), v = leaf({1, 2, 7, 2});
      expect_gradcheck([o](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], o).out; },
                       {q, k, v});
    }
  // strided, with a padded sequence
  SdpaOptions o;
  o.block_size = 2, o.block_mask = nn::strided_block_mask(6, 2, 2), o.key_padding_lengths = tensor<int64_t>({6, 3});
  Generator g(12);
  auto leaf = [&](Shape s) { return randn(s, DType::f64, &g).set_requires_grad(true); };
  Tensor q = leaf({2, 1, 6, 3}), k = leaf({2, 1, 6, 3}), v = leaf({2, 1, 6, 3});
  expect_gradcheck([o](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], o).out; },
                   {q, k, v});
}

TEST_CASE("sparse attention: a query whose block row is all dropped gives zeros and zero gradients, not NaN") {
  // T 40, bs 8: block row 2 (queries 16..23) keeps nothing
  const int64_t T = 40, bs = 8, n = 5;
  std::unique_ptr<bool[]> m(new bool[n * n]);
  for (int64_t e = 0; e < n * n; ++e) m[size_t(e)] = e / n != 2;
  SparseCase c;
  c.Tq = c.Tk = T, c.bs = bs, c.blocks = blocks_tensor(m.get(), n, n);
  expect_matches_oracle(c);
  Generator g(3);
  Tensor q = randn({2, 2, T, 4}, DType::f64, &g).set_requires_grad(true), k = randn({2, 2, T, 4}, DType::f64, &g),
         v = randn({2, 2, T, 4}, DType::f64, &g);
  Tensor y = scaled_dot_product_attention(q, k, v, options_of(c)).out;
  for (double x : y.narrow(2, 16, 8).to_vector<double>()) CHECK(x == 0.0);
  sum(y).backward();
  for (double x : q.grad().to_vector<double>()) CHECK(std::isfinite(x));
  for (double x : q.grad().narrow(2, 16, 8).to_vector<double>()) CHECK(x == 0.0);
  // and an all-dropped mask: every output 0
  SdpaOptions none;
  none.block_size = bs, none.block_mask = zeros({n, n}, DType::b8);
  for (double x : scaled_dot_product_attention(q, k, v, none).out.to_vector<double>()) CHECK(x == 0.0);
}

TEST_CASE("sparse attention: dropped blocks are skipped, not computed and masked") {
  // Keys of a block column that every block row drops are never read by the fused kernel: poison
  // them (NaN in k and v) and the output and gradients stay finite and equal the oracle on clean
  // inputs. A kernel that computed those scores and masked them would get 0 * NaN = NaN in P V
  // and dS K. T 300 (two of the CPU's 256-key tiles), bs 20: diagonal blocks and the strided
  // pattern, with columns 3 and 11 dropped everywhere.
  const int64_t T = 300, bs = 20, n = 15;
  for (bool strided : {false, true}) {
    Tensor blocks = strided ? nn::strided_block_mask(T, bs, 4) : nn::local_global_block_mask(T, bs, 0, 0);
    std::vector<uint8_t> kept = blocks.to_vector<uint8_t>();
    std::unique_ptr<bool[]> m(new bool[n * n]);
    for (int64_t e = 0; e < n * n; ++e) m[size_t(e)] = kept[size_t(e)] && e % n != 3 && e % n != 11;
    SparseCase c;
    c.B = 1, c.Tq = c.Tk = T, c.D = 4, c.Dv = 3, c.bs = bs, c.blocks = blocks_tensor(m.get(), n, n);
    Generator g(5);
    Tensor q = randn({1, 2, T, 4}, DType::f64, &g), k = randn({1, 2, T, 4}, DType::f64, &g),
           v = randn({1, 2, T, 3}, DType::f64, &g);
    std::vector<double> kp = k.to_vector<double>(), vp = v.to_vector<double>();
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t j = 0; j < T; ++j)
        if (j / bs == 3 || j / bs == 11) {
          for (int64_t e = 0; e < 4; ++e) kp[size_t((h * T + j) * 4 + e)] = std::numeric_limits<double>::quiet_NaN();
          for (int64_t e = 0; e < 3; ++e) vp[size_t((h * T + j) * 3 + e)] = std::numeric_limits<double>::quiet_NaN();
        }
    Tensor qf = q.detach().set_requires_grad(true), kf = from_vector<double>(kp, {1, 2, T, 4}).set_requires_grad(true),
           vf = from_vector<double>(vp, {1, 2, T, 3}).set_requires_grad(true);
    Tensor y = scaled_dot_product_attention(qf, kf, vf, options_of(c)).out;
    const Tensor yo = oracle(q, k, v, c);  // clean inputs
    INFO("strided ", strided);
    check_close(y, yo, 1e-11, 1e-10);
    sum(y).backward();
    for (double x : qf.grad().to_vector<double>()) REQUIRE(std::isfinite(x));
    for (double x : kf.grad().to_vector<double>()) REQUIRE(std::isfinite(x));
    for (double x : vf.grad().to_vector<double>()) REQUIRE(std::isfinite(x));
    // the probe sees reads: the same keys hidden element by element (key_padding_mask, which the
    // kernel masks inside the tiles it walks) poison the output
    SdpaOptions km;
    std::unique_ptr<bool[]> pad(new bool[T]);
    for (int64_t j = 0; j < T; ++j) pad[size_t(j)] = j / bs == 3 || j / bs == 11;
    km.key_padding_mask = from_vector<bool>(std::span<const bool>(pad.get(), size_t(T)), {1, T});
    bool any_nan = false;
    for (double x : scaled_dot_product_attention(qf, kf, vf, km).out.to_vector<double>()) any_nan |= std::isnan(x);
    CHECK(any_nan);
  }
}

TEST_CASE("sparse attention: fused equals composed (return_weights), dropout included") {
  // The composed path builds its mask from the same rule; with dropout both draw the same Philox
  // elements (bh Tq + i) Tk + j, so the weights a block mask leaves are dropped alike.
  for (double p : {0.0, 0.3}) {
    SdpaOptions o;
    o.block_size = 5, o.block_mask = nn::local_global_block_mask(23, 5, 1, 1), o.dropout = p, o.causal = p > 0;
    Generator gi(8);
    Tensor q = randn({2, 2, 23, 4}, DType::f64, &gi), k = randn({2, 2, 23, 4}, DType::f64, &gi),
           v = randn({2, 2, 23, 3}, DType::f64, &gi);
    Tensor qa = q.detach().set_requires_grad(true), qb = q.detach().set_requires_grad(true);
    Generator g1(5), g2(5);
    SdpaOptions of = o, oc = o;
    of.generator = &g1, oc.generator = &g2, oc.return_weights = true;
    const Tensor yf = scaled_dot_product_attention(qa, k, v, of).out;
    const SdpaResult rc = scaled_dot_product_attention(qb, k, v, oc);
    check_close(yf, rc.out, 1e-11, 1e-10);
    sum(yf).backward();
    sum(rc.out).backward();
    check_close(qa.grad(), qb.grad(), 1e-11, 1e-10);
    // the weights are 0 exactly in the dropped blocks (and above the diagonal with causal)
    const std::vector<double> w = rc.weights.to_vector<double>();
    const std::vector<uint8_t> kept = o.block_mask.to_vector<uint8_t>();
    for (int64_t bh = 0; bh < 4; ++bh)
      for (int64_t i = 0; i < 23; ++i)
        for (int64_t j = 0; j < 23; ++j)
          CHECK((w[size_t((bh * 23 + i) * 23 + j)] > 0) == (kept[size_t((i / 5) * 5 + j / 5)] && !(o.causal && j > i)));
  }
}

TEST_CASE("sparse attention: errors name the op, the option and the bad value") {
  Generator g(1);
  Tensor q = randn({2, 2, 10, 4}, DType::f32, &g), k = randn({2, 2, 12, 4}, DType::f32, &g),
         v = randn({2, 2, 12, 4}, DType::f32, &g);
  SdpaOptions o;
  o.block_size = 4, o.block_mask = ones({3, 3}, DType::b8);  // ceil(10/4) x ceil(12/4) = (3, 3): fine
  CHECK(scaled_dot_product_attention(q, k, v, o).out.shape() == Shape{2, 2, 10, 4});
  SdpaOptions shape = o;
  shape.block_mask = ones({3, 4}, DType::b8);
  AG_CHECK_ERROR(scaled_dot_product_attention(q, k, v, shape), "scaled_dot_product_attention", "block_mask",
                 "[3, 3]", "[3,4]");
  SdpaOptions dtype = o;
  dtype.block_mask = ones({3, 3}, DType::f32);
  AG_CHECK_ERROR(scaled_dot_product_attention(q, k, v, dtype), "scaled_dot_product_attention", "block_mask", "f32");
  SdpaOptions dims = o;
  dims.block_mask = ones({9}, DType::b8);
  AG_CHECK_ERROR(scaled_dot_product_attention(q, k, v, dims), "block_mask", "[9]");
  for (int64_t bs : {0, -3}) {
    SdpaOptions bad = o;
    bad.block_size = bs;
    const std::string got = "got " + std::to_string(bs);
    AG_CHECK_ERROR(scaled_dot_product_attention(q, k, v, bad), "scaled_dot_product_attention", "block_size",
                   got.c_str());
  }
  SdpaOptions weights = shape;  // the composed path checks the same
  weights.return_weights = true;
  AG_CHECK_ERROR(scaled_dot_product_attention(q, k, v, weights), "block_mask", "[3,4]");
  AG_CHECK_ERROR(nn::local_global_block_mask(10, 0, 1, 1), "local_global_block_mask", "block_size 0");
  AG_CHECK_ERROR(nn::local_global_block_mask(10, 2, -1, 1), "local_global_block_mask", "window_blocks -1");
  AG_CHECK_ERROR(nn::strided_block_mask(10, 2, 0), "strided_block_mask", "stride_blocks 0");
}

// ---- the builders -----------------------------------------------------------------------------

TEST_CASE("sparse patterns: known values and the kept-block counts of the header") {
  // local_global(T 10, bs 2, w 1, g 1): n = 5, the band |a - c| <= 1 and row/column 0
  check_close(nn::local_global_block_mask(10, 2, 1, 1).to(DType::f64),
              {1, 1, 1, 1, 1,
               1, 1, 1, 0, 0,
               1, 1, 1, 1, 0,
               1, 0, 1, 1, 1,
               1, 0, 0, 1, 1}, 0, 0);
  // strided(T 9, bs 2, s 2): n = 5, |a - c| < 2 or a - c even
  check_close(nn::strided_block_mask(9, 2, 2).to(DType::f64),
              {1, 1, 1, 0, 1,
               1, 1, 1, 1, 0,
               1, 1, 1, 1, 1,
               0, 1, 1, 1, 1,
               1, 0, 1, 1, 1}, 0, 0);
  CHECK(nn::local_global_block_mask(0, 4, 1, 1).shape() == Shape{0, 0});
  auto count = [](const Tensor& m) {
    int64_t c = 0;
    for (bool x : m.to_vector<uint8_t>()) c += x;
    return c;
  };
  for (int64_t n = 1; n <= 12; ++n) {
    for (int64_t w = 0; w <= 13; ++w)
      for (int64_t g = 0; g <= 13; ++g) {
        const int64_t gg = std::min(g, n), m = n - gg, wp = std::min(w, std::max<int64_t>(m - 1, 0));
        const int64_t want = gg * n + (n - gg) * gg + (m > 0 ? m * (2 * wp + 1) - wp * (wp + 1) : 0);
        INFO("n ", n, " w ", w, " g ", g);
        CHECK(count(nn::local_global_block_mask(3 * n - 1, 3, w, g)) == want);
      }
    for (int64_t s = 1; s <= n; ++s) {
      int64_t want = n * (2 * s - 1) - s * (s - 1);
      for (int64_t k = 1; k * s < n; ++k) want += 2 * (n - k * s);
      INFO("n ", n, " s ", s);
      CHECK(count(nn::strided_block_mask(4 * n, 4, s)) == want);
    }
  }
}

// ---- nn: MultiHeadAttention and the diagnostics -----------------------------------------------

TEST_CASE("sparse attention: MultiHeadAttention takes a pattern, and the diagnostics leave hidden keys out") {
  const int64_t B = 2, T = 24, d = 16, bs = 4;
  Generator g(2);
  nn::MultiHeadAttention mha(d, 2, {.dtype = DType::f64, .generator = &g});
  Tensor x = randn({B, T, d}, DType::f64, &g);
  nn::AttentionOptions o;
  o.causal = true, o.block_mask = nn::strided_block_mask(T, bs, 3), o.block_size = bs;
  const Tensor y = mha.forward(x, o).out;
  nn::AttentionOptions ow = o;
  ow.need_weights = true;  // the composed path: the same function
  const nn::AttentionResult rw = mha.forward(x, ow);
  check_close(y, rw.out, 1e-12, 1e-10);
  const std::vector<uint8_t> kept = o.block_mask.to_vector<uint8_t>();
  const std::vector<double> w = rw.weights.to_vector<double>();
  const int64_t n = T / bs;
  for (int64_t bh = 0; bh < B * 2; ++bh)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j)
        CHECK((w[size_t((bh * T + i) * T + j)] > 0) == (j <= i && kept[size_t((i / bs) * n + j / bs)]));
  // a capture carries the pattern with the weights
  nn::AttentionCapture capture;
  mha.forward(x, o);
  REQUIRE(capture.entries().size() == 1);
  const nn::AttentionMask& mask = capture.entries()[0].mask;
  CHECK(mask.block_mask.defined());
  CHECK(mask.block_size == bs);
  // weights uniform over the keys the pattern leaves: normalised entropy 1 with the pattern, less
  // without it (it would count the hidden keys as seen)
  std::vector<double> u(size_t(B * 2 * T * T), 0.0);
  for (int64_t bh = 0; bh < B * 2; ++bh)
    for (int64_t i = 0; i < T; ++i) {
      int64_t cnt = 0;
      for (int64_t j = 0; j <= i; ++j) cnt += kept[size_t((i / bs) * n + j / bs)];
      for (int64_t j = 0; j <= i; ++j)
        if (kept[size_t((i / bs) * n + j / bs)]) u[size_t((bh * T + i) * T + j)] = 1.0 / double(cnt);
    }
  const Tensor uniform = from_vector<double>(u, {B, 2, T, T});
  const nn::LayerAttentionStats with = nn::attention_stats(uniform, mask);
  for (const auto& h : with.heads) CHECK(h.entropy == doctest::Approx(1.0));
  nn::AttentionMask plain = mask;
  plain.block_mask = Tensor();
  const nn::LayerAttentionStats without = nn::attention_stats(uniform, plain);
  for (const auto& h : without.heads) CHECK(h.entropy < 0.99);
  // weights on a key the pattern hides do not belong to the mask
  nn::AttentionMask wrong = mask;
  std::unique_ptr<bool[]> none(new bool[size_t(n * n)]);
  for (int64_t e = 0; e < n * n; ++e) none[size_t(e)] = e != 0;
  wrong.block_mask = blocks_tensor(none.get(), n, n);
  AG_CHECK_ERROR(nn::attention_stats(uniform, wrong), "cannot see");
  nn::AttentionMask bad = mask;
  bad.block_size = 5;
  AG_CHECK_ERROR(nn::attention_stats(uniform, bad), "attention_stats", "block_mask");
}
