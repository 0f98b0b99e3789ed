#pragma once
// Three efficient-attention layers for long sequences, built only from differentiable ops (linear,
// reshape/permute, matmul, cat, scaled_dot_product_attention with its masks), so backward comes
// from the tape and the GPU path works wherever those ops run. Conventions as MultiHeadAttention
// (nn/attention.h): a fused qkv Linear(d, 3d) whose rows are PyTorch's in_proj (q, then k, then v),
// proj Linear(d, d) as out_proj, H heads of size hs = d / H, dropout on the attention weights in
// training only. Walkthrough and when to use which: docs/math/long-sequences.md.
// Shapes: B batch, T sequence length, d width, H heads, hs = d / H.
// Each takes its sizes in order and the rest in its Options, as MultiHeadAttention does:
//   nn::LinformerAttention(64, 4, /*max_len=*/1024, /*k=*/64, {.dropout = 0.1})
//   nn::MemoryCompressedAttention(64, 4, /*stride=*/4, {.bias = false})
//   nn::AxialAttention(64, 4, /*height=*/32, /*width=*/32, {.causal = true})
//
// ---- LinformerAttention (Wang et al. 2020, "Linformer") ---------------------------------------
//   [q | k | v] = x Wqkv^T + bqkv                        x (B, T, d), T <= max_len
//   k' = E[:, :T] k,   v' = F[:, :T] v                   E, F (k, max_len) -> k', v' (B, k, d)
//   o_h = softmax(q_h k'_h^T / sqrt(hs)) v'_h            per head, over the k projected keys
//   y   = concat_h(o_h) Wproj^T + bproj
// E and F are shared by every head ("headwise sharing" in the paper), separate from each other (no
// key-value sharing). A sequence shorter than max_len uses the first T columns of E and F, with
// no renormalisation. Key padding (lengths or mask): the padded positions' k and v (after the qkv
// projection, bias included) are zeroed before the projection, so they contribute nothing to k'
// and v'; the k projected keys themselves are never masked. Init: E and F ~ U(-1/sqrt(max_len),
// 1/sqrt(max_len)), nn.Linear's weight init for a (k, max_len) weight.
// Not causal by construction (each projected key mixes every position): causal is refused.
// Cost: time O(T k d) for the scores (plus O(T d^2) projections), memory O(T k) for the weights
// (O(T d + k d) with the fused kernel): linear in T. An approximation of full attention (exact
// only when the rank of the attention matrix is at most k and E, F are chosen for it; learned).
//
// ---- MemoryCompressedAttention (Liu et al. 2018, "Generating Wikipedia ...") ------------------
//   [q | k | v] = x Wqkv^T + bqkv                         (B, T, d)
//   k, v zero-padded at the end to Tc s positions,        Tc = ceil(T / s)
//   kc = reshape(k, (B, Tc, s d)) Wck^T + bck             compress_k: Linear(s d, d), the same for
//   vc = reshape(v, (B, Tc, s d)) Wcv^T + bcv             compress_v: every block (a strided conv)
//   o_h = softmax(q_h kc_h^T / sqrt(hs) + mask) vc_h      T queries over Tc compressed keys
//   y   = concat_h(o_h) Wproj^T + bproj
// Block j holds positions [j s, (j + 1) s). T not a multiple of s: the missing positions of the
// last block enter compress_k/compress_v as k = v = 0 (zeros after the qkv projection, bias
// included), exactly as if they were padded keys (below); a causal query never sees that block.
// Key padding: padded positions' k and v are zeroed before the compression; a block whose
// positions are all padding (or past T) is masked. Causal: query i sees block j only when the
// block ends at or before i, (j + 1) s - 1 <= i, so the first s - 1 queries see no block: their
// attention output is zeros (the fused kernel's rule), so y_i = bproj. Query i's receptive field is
// positions [0, floor((i + 1) / s) s), which misses up to s - 1 of the most recent positions (i
// itself included, unless (i + 1) % s == 0).
// Implemented by folding: the T queries shifted by one (i -> i + 1) fall into Tc + 1 groups of s,
// the s members of a group go to the batch (heads) dim and a hidden dummy key is put first, so
// the fused kernel's causal mask over (Tc + 1) x (Tc + 1) is exactly "group g sees blocks j < g".
// Cost: time O(T (T / s) d) for the scores plus O(T d^2) for the compression, memory O(T^2 / s) for
// the weights (O(T d) with the fused kernel; causal copies the compressed k, v s times: O(T d)).
// An approximation of full attention (exact for s = 1 with compress_k = compress_v = identity).
//
// ---- AxialAttention (Ho et al. 2019, "Axial Attention in Multidimensional Transformers") ------
//   x (B, Hh Ww, d): a grid of Hh rows and Ww columns in raster order (token r Ww + c is (r, c)),
//   the grid fixed at construction.
//   z = row(x):  each row's Ww tokens attend among themselves  (B Hh sequences of Ww)
//   y = col(z):  each column's Hh tokens attend among themselves (B Ww sequences of Hh)
// row and col are two MultiHeadAttention submodules (own qkv and proj each), composed
// sequentially, row then column, with no residual in between (a block adds its own). Parameter
// names: row.qkv.weight, row.qkv.bias, row.proj.weight, ..., col.proj.bias.
// causal: row attention causal along the row, column attention causal along the column, so no
// token sees a later token in raster order. The receptive field of (r, c) after both is then the
// rectangle {(r', c'): r' <= r, c' <= c}, not the whole raster past: (r' < r, c' > c) is not seen.
// (The Axial Transformer's full causal field needs an extra unmasked pass over the rows above and a
// shift; not done here.) Non-causal: every token sees the whole grid in two hops.
// Cost: time O(T (Hh + Ww) d) = O(T sqrt(T) d) for a square grid, plus O(T d^2) projections; memory
// O(T (Hh + Ww)) for the weights (O(T d) fused). Exact attention along each axis; as a
// replacement for full attention over the grid, an approximation (a two-hop factorisation).
#include "nn/attention.h"

namespace ag::nn {

struct LinformerAttention : Module {
  struct Options {
    double dropout = 0.0;  // on the attention weights, in training only
    bool bias = true;      // qkv and proj have biases
    DType dtype = DType::f32;
    Generator* generator = nullptr;  // init and attention dropout (null: the default generator)
  };

  int64_t d_model, n_heads, head_size, max_len, k;
  Options options;
  std::shared_ptr<Linear> qkv;   // d -> 3d, PyTorch's in_proj
  std::shared_ptr<Linear> proj;  // d -> d, out_proj
  Tensor E, F;                   // (k, max_len): projections of the keys and of the values

  // k: the projected length, the number of key and value mixtures each query attends over.
  LinformerAttention(int64_t d_model, int64_t n_heads, int64_t max_len, int64_t k, const Options& options);
  LinformerAttention(int64_t d_model, int64_t n_heads, int64_t max_len, int64_t k)
      : LinformerAttention(d_model, n_heads, max_len, k, Options{}) {}

  // x (B, T, d), T <= max_len -> out (B, T, d); weights (B, H, T, k) with need_weights.
  // `call`: key_padding_lengths or key_padding_mask, need_weights, generator. causal, window and
  // cache are refused.
  AttentionResult forward(const Tensor& x, const AttentionOptions& call = {});
};

struct MemoryCompressedAttention : Module {
  struct Options {
    double dropout = 0.0;  // on the attention weights, in training only
    bool bias = true;      // qkv, compress_k, compress_v and proj have biases
    DType dtype = DType::f32;
    Generator* generator = nullptr;  // init and attention dropout (null: the default generator)
  };

  int64_t d_model, n_heads, head_size, stride;
  Options options;
  std::shared_ptr<Linear> qkv;         // d -> 3d
  std::shared_ptr<Linear> compress_k;  // s d -> d, one block of s keys -> one key
  std::shared_ptr<Linear> compress_v;  // s d -> d
  std::shared_ptr<Linear> proj;        // d -> d

  // stride s: the positions each compressed key and value summarises.
  MemoryCompressedAttention(int64_t d_model, int64_t n_heads, int64_t stride, const Options& options);
  MemoryCompressedAttention(int64_t d_model, int64_t n_heads, int64_t stride)
      : MemoryCompressedAttention(d_model, n_heads, stride, Options{}) {}

  // x (B, T, d) -> out (B, T, d); weights (B, H, T, ceil(T / s)) with need_weights.
  // `call`: causal, key_padding_lengths or key_padding_mask (over the T positions), need_weights,
  // generator. window and cache are refused.
  AttentionResult forward(const Tensor& x, const AttentionOptions& call = {});
};

struct AxialAttention : Module {
  struct Options {
    double dropout = 0.0;  // on each axis' attention weights, in training only
    bool causal = false;   // no token sees a later one along its row, nor along its column
    bool bias = true;      // the projections of row and col have biases
    DType dtype = DType::f32;
    Generator* generator = nullptr;  // init and attention dropout (null: the default generator)
  };

  int64_t d_model, n_heads, height, width;
  Options options;
  std::shared_ptr<MultiHeadAttention> row;  // along each row: sequences of width tokens
  std::shared_ptr<MultiHeadAttention> col;  // along each column: sequences of height tokens

  AxialAttention(int64_t d_model, int64_t n_heads, int64_t height, int64_t width, const Options& options);
  AxialAttention(int64_t d_model, int64_t n_heads, int64_t height, int64_t width)
      : AxialAttention(d_model, n_heads, height, width, Options{}) {}

  // x (B, height * width, d), raster order -> (B, height * width, d)
  Tensor forward(const Tensor& x);
};

}  // namespace ag::nn
