#pragma once
// Attention diagnostics: what each head of each layer does with its weights, and the three ways
// an attention map is known to look wrong, turned into checks.
//
// For the weights p (B, H, Tq, Tk) of one layer and the keys each query could see (AttentionMask),
// per head h, averaged over the batch and the query rows r that see more than one key:
//   entropy    H_r / log n_r,   H_r = -sum_j p_rj log p_rj,  n_r = the visible keys of row r
//              1: uniform over the visible keys, 0: all weight on one key
//   diagonal   p_r,qa(r): the weight on the key at the query's own position, bottom-right aligned
//              (qa = r + Tk - Tq), what a token gives itself; uniform weights give it 1/n_r
//   similarity between heads h and g: 1 - JSD(p_h,r, p_g,r), averaged over rows, with the
//              Jensen-Shannon divergence in bits (in [0, 1]): 1 for identical maps, 0 for maps
//              with no key in common. Each head reports its largest similarity to another head.
// Rows that see one key or none (the first query of a causal map, a query at a padded position
// in self-attention, Tq == Tk) say nothing about the head and are left out.
//
// The checks (AttentionThresholds, each a named threshold), with the suspects of the usual
// troubleshooting advice for attention maps:
//   near_uniform     entropy >= uniform_entropy: every key weighted alike, the head attends to
//                    nothing in particular. Suspect the initialisation (logits too small or
//                    saturated) or a learning rate too high for the attention to form.
//   strong_diagonal  diagonal >= diagonal_mass and >= diagonal_over_uniform times what uniform
//                    weights would give: each token looks mostly at itself. Suspect the positional
//                    encoding (missing, too strong, or not reaching the attention).
//   similar_heads    two heads with similarity >= head_similarity: blocky, near-identical patterns,
//                    the heads did not differentiate (wasted heads; too many heads for the data,
//                    an identical initialisation, or a learning rate too low to break symmetry).
//                    Looked for only in pairs where at least one head passed the first two checks:
//                    two uniform heads are trivially alike, and their warning is already raised.
//
// Capturing a whole model: see AttentionCapture in nn/attention.h; diagnose_attention below runs
// one forward under a capture and names each layer from the module tree ("blocks.0.attn").
#include <functional>
#include <string>
#include <vector>

#include "nn/attention.h"

namespace ag::nn {

struct AttentionThresholds {
  double uniform_entropy = 0.9;       // near_uniform: mean normalised entropy at least this
  double diagonal_mass = 0.5;         // strong_diagonal: mean weight on the own position at least this...
  double diagonal_over_uniform = 2.0; // ...and at least this many times the uniform map's 1/n
  double head_similarity = 0.95;      // similar_heads: 1 - JSD at least this
};

struct HeadAttentionStats {
  double entropy = 0;           // mean normalised entropy in [0, 1]
  double diagonal = 0;          // mean weight on the query's own position
  double uniform_diagonal = 0;  // what uniform weights would put there: mean 1/n_r
  double max_similarity = 0;    // largest similarity to another head (0 with one head)
  int64_t most_similar = -1;    // that head (-1 with one head)
};

struct AttentionWarning {
  std::string layer;           // "blocks.0.attn"
  std::string check;           // "near_uniform", "strong_diagonal" or "similar_heads"
  std::vector<int64_t> heads;  // the heads concerned (for similar_heads: a group of alike heads)
  std::string message;         // one line: what was measured against which threshold, and the suspects
};

struct LayerAttentionStats {
  std::string layer;   // the MultiHeadAttention's name in the model ("blocks.1.attn")
  Shape shape;         // of the weights, (B, H, Tq, Tk)
  int64_t rows = 0;    // query rows (over the batch) the statistics average over, per head
  std::vector<HeadAttentionStats> heads;
  std::vector<double> similarity;  // H x H, row-major; 1 on the diagonal
};

struct AttentionReport {
  std::vector<LayerAttentionStats> layers;  // in call order
  std::vector<AttentionWarning> warnings;   // in layer order, then check order
  AttentionThresholds thresholds;

  // One line per layer and head (entropy, diagonal, most similar head), then the warnings.
  std::string to_text() const;
};

// The statistics of one layer's weights (B, H, Tq, Tk) (f32 or f64, any device); `mask` says which
// keys each query could see (a weight on a hidden key is an ag::Error: the weights and the mask do
// not belong together). Raises ag::Error for weights that are not 4-D or a mask of another batch.
LayerAttentionStats attention_stats(const Tensor& weights, const AttentionMask& mask = {},
                                    const std::string& layer = "attention");

// The checks above on one layer's statistics.
std::vector<AttentionWarning> check_attention(const LayerAttentionStats& stats,
                                              const AttentionThresholds& thresholds = {});

// Statistics and checks for every entry of a capture; each layer is named from `model`'s tree
// (named_modules); a MultiHeadAttention outside it is "attention.<i>" (i: its call index).
AttentionReport diagnose_attention(const Module& model, const AttentionCapture& capture,
                                   const AttentionThresholds& thresholds = {});
// Runs `forward` (one forward of `model` on a batch, e.g. [&] { model.forward(x); }) under a
// capture and diagnoses what it captured. The caller chooses the mode (eval() for the weights the
// model uses at test time) and whether to record (NoGradGuard saves memory).
AttentionReport diagnose_attention(const Module& model, const std::function<void()>& forward,
                                   const AttentionThresholds& thresholds = {});

}  // namespace ag::nn
