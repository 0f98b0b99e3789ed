#pragma once
// Evaluation in the apps: inference mode, a classifier's loss and accuracy over a split, and the
// split of that work over the ranks of a data-parallel job.
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "apps/common/report.h"  // ConfusionMatrix
#include "autograd/tape.h"
#include "core/tensor.h"
#include "nn/module.h"

namespace ag::apps {


// Sharded evaluation in a data-parallel job: each rank evaluates a part of the split and the
// partial sums are added over the ranks, so every rank returns the whole split's result in 1/N of
// the time. eval_part(n, r, N) = the items {r, r + N, r + 2N, ...} of [0, n): strided, so that a
// split sorted by length gives every rank the same mix. sum_over_ranks adds `values` (loss sums,
// counts) and `cm`'s counts (may be null) over the job's ranks (dist::all_reduce_sum; nothing in
// a job of one). Every rank must call it, the same number of times.
std::vector<int64_t> eval_part(int64_t n, int rank, int world);
void sum_over_ranks(std::vector<double>& values, ConfusionMatrix* cm = nullptr);

// Eval mode and no recording for its lifetime (inference: generation, evaluation, scoring); the
// model's previous mode is restored after.
struct InferenceScope {
  nn::Module& m;
  bool was_training;
  NoGradGuard no_grad;
  explicit InferenceScope(nn::Module& mod) : m(mod), was_training(mod.is_training()) { m.eval(); }
  ~InferenceScope() { m.train(was_training); }
  InferenceScope(const InferenceScope&) = delete;
  InferenceScope& operator=(const InferenceScope&) = delete;
};

// A classifier's evaluation on items [0, n) of a split, `batch` items per forward, in eval mode
// and without recording (the model's mode is restored): `logits_labels(indices)` runs the model on
// those items and returns their logits (B, K) and labels (B). With `sharded`, each rank evaluates
// its eval_part and the sums are added over the ranks (every rank must call it). Returns the mean
// cross-entropy, the accuracy and `confusion` filled with every item.
struct ClassifierEval {
  double loss = 0;      // mean cross-entropy (no label smoothing)
  double accuracy = 0;  // fraction of argmax == label
  int64_t samples = 0;
  std::optional<ConfusionMatrix> confusion;  // rows: true class, columns: predicted
};
ClassifierEval evaluate_classifier(
    nn::Module& model, int64_t n, int64_t batch, bool sharded, ConfusionMatrix confusion,
    const std::function<std::pair<Tensor, Tensor>(std::span<const int64_t>)>& logits_labels);

}  // namespace ag::apps
