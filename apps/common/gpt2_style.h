#pragma once
// What the transformer apps (apps/gpt, apps/vit, apps/textclf, apps/imagetext, apps/longseq)
// share: a stack of pre-LN transformer blocks, and GPT-2's initialisation of it.
//
// Initialisation, as GPT-2 / timm: Linear and embedding weights ~ N(0, 0.02), biases zero,
// LayerNorm (1, 0), and the two projections that write into the residual stream (attn.proj,
// mlp.fc2) ~ N(0, 0.02 / sqrt(2 n_layers)), so the stream's variance does not grow with depth.
// ViT's class token and pos_embed ~ N(0, 0.02) too (they are 2-D or more, so the same rule).
// longseq then redraws its attention's q, k, v projections at N(0, 1 / d): over thousands of
// keys GPT-2's scale leaves the weights uniform (apps/longseq/model.h, "Initialisation").
#include <cstdint>
#include <functional>
#include <memory>

#include "core/random.h"
#include "nn/sequential.h"
#include "nn/transformer.h"

namespace ag::apps {

// n_layers blocks (children "0", "1", ...) of width d and `heads` heads, each built with `options`
// (mlp_hidden, dropout, causal, norm, ...: nn::TransformerBlock::Options).
std::shared_ptr<nn::ModuleList<nn::TransformerBlock>> make_blocks(int64_t n_layers, int64_t d, int64_t heads,
                                                                  const nn::TransformerBlock::Options& options);

// One block's forward y = f(x), or, with `recompute` (the apps' --grad-checkpointing), the same
// through ag::checkpoint (autograd/recompute.h): between forward and backward only x and y are
// kept, and backward runs f again. Every parameter of `block` is passed, so each gets its
// gradient, and `gen` (null: the default generator), the one its dropout draws from, is rewound,
// so the recomputation draws the same masks: the gradients equal the plain run's bit for bit.
// Checkpoints only where a backward can follow: grad mode on and `block` in training mode (an
// evaluation, a sample or nn::summarize runs f plainly).
Tensor block_forward(nn::Module& block, const std::function<Tensor(const Tensor&)>& f, const Tensor& x, bool recompute,
                     Generator* gen);

// GPT-2 / timm initialisation of a model built from nn/ parts (see the comment at the top):
// every Linear and Embedding weight N(0, 0.02) (bias 0), LayerNorms (1, 0), and the weights of
// parameters whose name ends in "attn.proj.weight", "mlp.fc2.weight" or "mlp.w2.weight" (SwiGLU's
// output) N(0, 0.02 / sqrt(2 n_layers)).
void init_gpt2_style(nn::Module& model, int64_t n_layers, Generator* gen = nullptr);

}  // namespace ag::apps
