#pragma once
// MoE: a new layer written outside attograd, from attograd's ops and layers only.
#include "nn/mlp.h"
#include "nn/sequential.h"

namespace ext {

// snippet-begin: moe_h
// A sparse mixture-of-experts feed-forward (Shazeer et al. 2017; the Switch Transformer, Fedus et
// al. 2021; Mixtral, Jiang et al. 2024): a router sends each token to k of its E experts, and the
// token's output is the sum of those k experts' outputs weighted by the router's probabilities.
// The leading dims of x are flattened into N tokens x_t of width dim:
//   l_t  = router x_t                      (E logits; router (E, dim))
//   S_t  = the k experts with the largest l_t (ties: the lower index)
//   p_te = exp(l_te) / sum_{j in S_t} exp(l_tj)   for e in S_t, 0 otherwise   (renormalize, Mixtral)
//          softmax(l_t)_e                         for e in S_t, 0 otherwise   (not, Switch)
//   y_t  = drop( sum_{e in S_t} p_te expert_e(x_t) )          x (..., dim) -> y (..., dim)
// Each expert is attograd's nn::SwiGLU(dim, hidden) and runs on its own tokens only: the cost is
// that of k SwiGLUs per token, whatever E (no capacity limit: no token is dropped).
// With k = 1 and renormalize, p is 1 and the output gives the router no gradient: Switch's
// unrenormalized p is what top-1 routing trains with.
// After each forward, aux_loss holds the Switch Transformer's load-balancing loss
//   aux = E sum_e f_e P_e,  f_e: the share of the N k routing slots that went to e (no gradient),
//                           P_e: the mean over tokens of softmax(l_t)_e
// 1 when the load is even, up to E when one expert takes every token: add alpha aux_loss to the
// training loss (Switch: alpha = 0.01) to teach the router to spread the tokens.
// Parameters: router (E, dim); experts.<e>.w1.weight (hidden, dim), experts.<e>.w2.weight
// (dim, hidden), experts.<e>.w3.weight (hidden, dim). Buffer: load (E), f64, the routing slots each
// expert received while training (not in eval()): saved with the weights, it shows dead experts.
// Which experts a token gets is a discrete choice with no gradient; the gradient reaches the
// router through p and aux_loss, and the experts through their outputs. The backward is that of
// the ops used (linear, masked_fill, softmax, index_select, narrow, mul, cat, sum, dropout).
struct MoEOptions {
  int64_t top_k = 2;
  bool renormalize = true;
  double dropout = 0.0;
  ag::DType dtype = ag::DType::f32;
  ag::Generator* generator = nullptr;  // draws the weights and the dropout masks; null: the default one
};

struct MoE : ag::nn::UnaryModule {
  int64_t dim, hidden, num_experts, top_k;
  bool renormalize;
  double dropout;
  ag::Generator* gen;
  ag::Tensor router;                                                  // (E, dim), trained
  std::shared_ptr<ag::nn::ModuleList<ag::nn::SwiGLU>> experts;        // E children "experts.<e>"
  ag::Tensor load;                                                    // (E) f64, not trained
  ag::Tensor aux_loss;                                                // 0-dim, set by forward

  MoE(int64_t dim, int64_t hidden, int64_t num_experts, const MoEOptions& options = {});
  ag::Tensor forward(const ag::Tensor& x) override;
};
// snippet-end: moe_h

}  // namespace ext
