#include "apps/common/evaluate.h"

#include <algorithm>

#include "autograd/ops.h"
#include "core/error.h"
#include "dist/dist.h"

namespace ag::apps {

std::vector<int64_t> eval_part(int64_t n, int rank, int world) {
  check(world >= 1 && rank >= 0 && rank < world, "eval_part: rank {} of a world of {}", rank, world);
  std::vector<int64_t> items;
  items.reserve(size_t(std::max<int64_t>(0, (n - rank + world - 1) / world)));
  for (int64_t i = rank; i < n; i += world) items.push_back(i);
  return items;
}

void sum_over_ranks(std::vector<double>& values, ConfusionMatrix* cm) {
  if (dist::world_size() == 1) return;
  const size_t k = values.size();
  if (cm) values.insert(values.end(), cm->counts.begin(), cm->counts.end());  // counts < 2^53: exact
  dist::all_reduce_sum(values);
  if (cm)
    for (size_t i = 0; i < cm->counts.size(); ++i) cm->counts[i] = int64_t(values[k + i]);
  values.resize(k);
}

ClassifierEval evaluate_classifier(
    nn::Module& model, int64_t n, int64_t batch, bool sharded, ConfusionMatrix confusion,
    const std::function<std::pair<Tensor, Tensor>(std::span<const int64_t>)>& logits_labels) {
  check(batch >= 1, "evaluation batch must be >= 1, got {}", batch);
  check(n >= 1, "nothing to evaluate: the split is empty");
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  ClassifierEval r;
  r.confusion = std::move(confusion);
  std::vector<double> loss_sum = {0.0};
  const std::vector<int64_t> part = sharded ? eval_part(n, dist::rank(), dist::world_size()) : eval_part(n, 0, 1);
  for (size_t b0 = 0; b0 < part.size(); b0 += size_t(batch)) {
    const std::span<const int64_t> idx(part.data() + b0, std::min(part.size() - b0, size_t(batch)));
    const auto [logits, labels] = logits_labels(idx);
    loss_sum[0] += cross_entropy(logits, labels.to(logits.device()), "sum").item<double>();
    r.confusion->add(labels.to_vector<int64_t>(), argmax(logits, 1).to_vector<int64_t>());
  }
  if (sharded) sum_over_ranks(loss_sum, &*r.confusion);
  model.train(was_training);
  r.samples = n;
  r.loss = loss_sum[0] / double(n);
  r.accuracy = r.confusion->accuracy();
  return r;
}

}  // namespace ag::apps
