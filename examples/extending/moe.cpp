#include "moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/ops.h"
#include "autograd/tape.h"
#include "nn/init.h"

namespace ext {

using ag::Tensor;

namespace {

// snippet-begin: route
// Which experts each token gets, decided on the host: the choice, and so how many tokens each
// expert runs on, depends on the data.
struct Routing {
  std::vector<double> chosen;                // (N, E): 1 where e is in S_t, else 0
  std::vector<std::vector<int64_t>> tokens;  // for each expert, the tokens it serves (ascending)
  std::vector<int64_t> slot;                 // (N, k): the row of token t's j-th result once the
                                             // experts' outputs are concatenated, expert by expert
  std::vector<double> count;                 // (E): |tokens[e]|
};

Routing route(const std::vector<double>& logits, int64_t N, int64_t E, int64_t k) {
  Routing r{std::vector<double>(size_t(N * E), 0.0), std::vector<std::vector<int64_t>>(size_t(E)),
            std::vector<int64_t>(size_t(N * k)), std::vector<double>(size_t(E), 0.0)};
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    const double* l = &logits[size_t(t * E)];
    for (int64_t e = 0; e < E; ++e)
      ag::check(std::isfinite(l[e]), "[MoE] router logit {} of token {} is {}: the input is not finite", e, t, l[e]);
    std::iota(order.begin(), order.end(), int64_t(0));
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [l](int64_t a, int64_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (int64_t j = 0; j < k; ++j) r.chosen[size_t(t * E + order[size_t(j)])] = 1.0;
  }
  std::vector<int64_t> filled(static_cast<size_t>(N), 0);  // results of token t placed so far
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t t = 0; t < N; ++t)
      if (r.chosen[size_t(t * E + e)] != 0) {
        r.tokens[size_t(e)].push_back(t);
        r.slot[size_t(t * k + filled[size_t(t)]++)] = row++;
      }
  for (int64_t e = 0; e < E; ++e) r.count[size_t(e)] = double(r.tokens[size_t(e)].size());
  return r;
}
// snippet-end: route

}  // namespace

// snippet-begin: moe_cpp
MoE::MoE(int64_t dim, int64_t hidden, int64_t num_experts, const MoEOptions& o)
    : dim(dim), hidden(hidden), num_experts(num_experts), top_k(o.top_k), renormalize(o.renormalize),
      dropout(o.dropout), gen(o.generator) {
  ag::check(dim > 0 && hidden > 0, "[MoE] expected dim > 0 and hidden > 0, got dim = {}, hidden = {}", dim, hidden);
  ag::check(num_experts > 0 && o.top_k >= 1 && o.top_k <= num_experts,
            "[MoE] expected 1 <= top_k <= num_experts, got top_k = {}, num_experts = {}", o.top_k, num_experts);
  ag::check(o.dropout >= 0 && o.dropout < 1, "[MoE] expected 0 <= dropout < 1, got {}", o.dropout);
  // a parameter of the layer itself: its initial value here (as a bias-free nn::Linear(dim, E)
  // would draw it), then trained: register_parameter sets requires_grad
  router = register_parameter("router",
                              ag::nn::init::kaiming_uniform({num_experts, dim}, std::sqrt(5.0), o.dtype, o.generator));
  // children: attograd's own SwiGLU, E times, named experts.0, experts.1, ... as torch.nn.ModuleList
  experts = register_module("experts", std::make_shared<ag::nn::ModuleList<ag::nn::SwiGLU>>());
  for (int64_t e = 0; e < num_experts; ++e)
    experts->push_back(std::make_shared<ag::nn::SwiGLU>(
        dim, hidden, ag::nn::SwiGLU::Options{.dtype = o.dtype, .generator = o.generator}));
  // a buffer: state that state_dict() saves and to() moves, but no optimizer sees
  load = register_buffer("load", ag::zeros({num_experts}, ag::DType::f64));
}

Tensor MoE::forward(const Tensor& x) {
  ag::nn::ModuleScope scope(this);  // lets nn::summarize attribute the ops below to this layer
  ag::check(x.ndim() >= 1 && x.size(-1) == dim, "[MoE] expected input of shape [..., {}], got {}", dim, x.shape());
  const int64_t N = x.numel() / dim, E = num_experts, k = top_k;
  ag::check(N > 0, "[MoE] expected at least one token, got input of shape {}", x.shape());
  const ag::Device device = x.device();
  const Tensor tokens = ag::reshape(x, {N, dim});
  const Tensor logits = ag::linear(tokens, router);  // (N, E)
  const Routing r = route(logits.to_vector<double>(), N, E, k);

  // the router's probabilities p (N, E), 0 outside each token's k experts
  const Tensor chosen = ag::from_vector(r.chosen, {N, E}, device).to(x.dtype());
  const Tensor probs = ag::softmax(logits, -1);
  const Tensor p = renormalize ? ag::softmax(ag::masked_fill(logits, ag::eq(chosen, 0.0), -INFINITY), -1)
                               : probs * chosen;

  // each expert on its own tokens, its output weighted by their p
  std::vector<Tensor> outputs;
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int64_t>& mine = r.tokens[size_t(e)];
    if (mine.empty()) continue;  // no token chose it: it runs on nothing
    const Tensor index = ag::from_vector(mine, {int64_t(mine.size())}, device);
    const Tensor weight = ag::index_select(ag::narrow(p, 1, e, 1), 0, index);  // (n_e, 1)
    outputs.push_back((*experts)[size_t(e)].forward(ag::index_select(tokens, 0, index)) * weight);
  }
  // back in token order: token t's k results are rows slot[t k .. t k + k) of the concatenation
  const Tensor gathered = ag::index_select(ag::cat(outputs, 0), 0, ag::from_vector(r.slot, {N * k}, device));
  const Tensor y = ag::sum(ag::reshape(gathered, {N, k, dim}), {1});

  // Switch's load-balancing loss; the load buffer counts this batch's routing while training
  const Tensor share = ag::from_vector(r.count, {E}, device).to(x.dtype()) * (1.0 / double(N * k));
  aux_loss = ag::sum(ag::mean(probs, {0}) * share) * double(E);
  if (is_training()) {
    ag::NoGradGuard no_grad;
    load.copy_(load + ag::from_vector(r.count, {E}, load.device()));
  }
  // is_training() is what train() / eval() set (on this module and every descendant): dropout
  // zeroes and rescales in training only, and is the identity in eval
  return ag::reshape(ag::dropout(y, dropout, is_training(), gen), x.shape());
}
// snippet-end: moe_cpp

}  // namespace ext
