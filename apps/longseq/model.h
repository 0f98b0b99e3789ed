#pragma once
// The model of apps/longseq: one small transformer classifier whose attention is chosen by name,
// everything else equal, so the methods can be compared on the same task (Long Range Arena's
// protocol).
//
// LongSeqClassifier:                                       tokens (B, T), lengths (B) -> logits (B, K)
//   h = embed(tokens) + pos_embed[:T]          Embedding(vocab, d, padding 0); pos_embed (1, max_len, d)
//   h = blocks.i(h)                            pre-LN: h += attn(ln1(h)); h += mlp(ln2(h))
//   logits = head(norm(mean of h over the valid tokens of each sequence))
// The attention of every block (LongSeqConfig::attention):
//   full     nn::MultiHeadAttention over all T keys (the fused kernel: O(T) memory, T^2 time)
//   window      the same with SdpaOptions::window = w: each token sees the tokens within +-w
//               (the fused kernel skips the tiles outside the band: O(T w) time)
//   sparse      the same with a block-sparse pattern (nn/sparse_patterns.h) of `block`-token blocks:
//               local-global (a band of +-window_blocks blocks and the first global_blocks blocks
//               global, Longformer/BigBird) or strided (Sparse Transformer: blocks within
//               stride_blocks of the diagonal and every stride_blocks-th one); the fused kernel
//               skips the dropped blocks' tiles, so the cost grows with the kept blocks
//   linformer   nn::LinformerAttention: keys and values projected along the sequence to k rows
//               (O(T k) time and memory)
//   compressed  nn::MemoryCompressedAttention: keys and values compressed by a Linear over blocks of
//               `stride` positions, full attention over the T / stride compressed keys
//   (materialise: full, window and sparse computed on the composed path of
//   scaled_dot_product_attention, matmul-softmax-matmul, which stores the (B, H, T, T) scores and
//   weights, as the articles' "full attention" does; the same function, O(T^2) memory: to measure
//   what the fused kernel saves)
//   axial       nn::AxialAttention over the grid_h x grid_w grid of the sequence: along the rows,
//               then along the columns (O(T (grid_h + grid_w)) time). Needs sequences of exactly
//               grid_h x grid_w tokens: the pixels' own grid, or a 1-D sequence folded into rows.
// Padding keys are hidden from every query (key_padding_lengths), except under axial, which takes
// no padding (the app refuses it for sequences of varying length).
//
// Initialisation: GPT-2's (apps/common/gpt2_style.h), except each attention's q, k, v projection
// (the parameters named "...qkv.weight"), drawn N(0, 1 / d_model). On LayerNorm'd inputs, whose
// elements have variance 1, q and k elements then have variance d sigma^2 = 1, and so does a score
// q.k / sqrt(d_head). GPT-2's sigma = 0.02 gives the scores variance (d sigma^2)^2 = 0.0007 at
// d 64: each query's weights start uniform over up to 2,000 keys, and the gradient that would
// sharpen them carries the same small factor. On ListOps full attention then learnt next to
// nothing (docs/math/long-sequences.md, "ListOps and the initialisation").
// docs/math/long-sequences.md gives each method's formula and cost.
#include <nlohmann/json.hpp>

#include "nn/attention.h"
#include "nn/efficient_attention.h"
#include "nn/embedding.h"
#include "nn/mlp.h"
#include "nn/norm.h"
#include "nn/sequential.h"
#include "nn/sparse_patterns.h"

namespace ag::apps::longseq {

// {"full", "window", "sparse", "linformer", "compressed", "axial"}
const std::vector<std::string>& attention_methods();

struct LongSeqConfig {
  int64_t vocab = 257, max_len = 784, classes = 10;
  int64_t d_model = 64, n_heads = 4, n_layers = 2, mlp_hidden = 128;
  double dropout = 0.0;
  std::string attention = "full";
  int64_t window = 64;   // window: keys within +-window of the query
  std::string sparse = "local-global";  // sparse: local-global | strided
  int64_t block = 32;                   // sparse: tokens per block
  int64_t window_blocks = 1, global_blocks = 1;  // sparse local-global
  int64_t stride_blocks = 4;            // sparse strided
  int64_t k = 128;       // linformer: the projected length
  int64_t stride = 4;    // compressed: positions per compressed key
  int64_t grid_h = 0, grid_w = 0;  // axial: the grid (grid_h * grid_w = max_len)
  bool materialise = false;        // full, window, sparse: the composed path (T x T weights stored)
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(LongSeqConfig, vocab, max_len, classes, d_model, n_heads, n_layers,
                                                mlp_hidden, dropout, attention, window, sparse, block, window_blocks,
                                                global_blocks, stride_blocks, k, stride, grid_h, grid_w, materialise)
// The checks of a config: ag::Error naming the field and value (a size below 1, heads not dividing
// d_model, an unknown attention method or sparse pattern, window, window_blocks or global_blocks
// < 0, block, stride_blocks, k or stride < 1, an axial grid that does not hold max_len tokens,
// materialise with linformer, compressed or axial).
void check_config(const LongSeqConfig& c);

struct LongSeqBlock : nn::Module {
  LongSeqConfig cfg;  // the attention method and its settings
  std::shared_ptr<nn::LayerNorm> ln1, ln2;
  // the attention, registered as "attn": one of these, by method
  std::shared_ptr<nn::MultiHeadAttention> attn;                // full, window
  std::shared_ptr<nn::LinformerAttention> linformer;          // linformer
  std::shared_ptr<nn::MemoryCompressedAttention> compressed;  // compressed
  std::shared_ptr<nn::AxialAttention> axial;                  // axial
  std::shared_ptr<nn::MLP> mlp;
  bool need_weights = false;
  // of the last forward, kept only with need_weights: (B, H, T, keys), keys = T (full, window), k
  // (linformer) or ceil(T / stride) (compressed); undefined for axial
  Tensor attn_weights;

  LongSeqBlock(const LongSeqConfig& c, Generator* gen);
  // sparse: the block mask of a sequence of T tokens on `device` (made once per T and device)
  const Tensor& block_mask(int64_t T, Device device);
  Tensor forward(const Tensor& x, const Tensor& lengths);  // x (B, T, d), lengths i64 (B) or undefined

 private:
  Tensor mask_;
};

struct LongSeqClassifier : nn::Module {
  LongSeqConfig cfg;
  std::shared_ptr<nn::Embedding> embed;
  Tensor pos_embed;  // (1, max_len, d)
  std::shared_ptr<nn::ModuleList<LongSeqBlock>> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> head;

  // --grad-checkpointing: each block's activations are recomputed in backward instead of kept
  // (apps/common/gpt2_style.h block_forward); the same gradients, less memory, one more forward
  // of the blocks per step (docs/math/checkpointing.md).
  bool grad_checkpointing = false;
  Generator* dropout_gen = nullptr;  // the generator given to the constructor, which dropout draws from

  explicit LongSeqClassifier(const LongSeqConfig& cfg, Generator* gen = nullptr);
  // tokens i64 (B, T <= max_len), lengths i64 (B) in [1, T] (undefined: every sequence is T long)
  Tensor forward(const Tensor& tokens, const Tensor& lengths = Tensor());
};

}  // namespace ag::apps::longseq
