#pragma once
// What apps/longseq/main.cpp does outside its main(), here so that the tests reach it: the three
// long-sequence tasks in the spirit of Long Range Arena (Tay et al., 2020), made from data on this
// machine, as padded token sequences with one label each; the batches, the one training step main's
// loop runs, the evaluation and the attention map; the run's config as checkpoints save it.
//
//   pixels   an image read as a sequence of pixel intensities, row by row: Fashion-MNIST (default),
//            MNIST or CIFAR-10 (grey: the mean of the channels, as LRA's "Image" task), 784 or 1024
//            tokens, 10 classes; the sequence keeps its grid (H x W) for axial attention
//   listops  LRA's ListOps: nested MAX, MIN, MED, SM (sum mod 10) over digits, to depth 10, up to
//            max_len tokens; the label is the value 0-9. Generated from a seed (make_listops),
//            written beside the run as TSV (source, target) so the exact splits can be inspected
//   text     byte-level classification of the King James Bible (Debian's bible-kjv): which of 8
//            groups of books (kjv_groups) a passage of `passage` bytes comes from; the passages are
//            consecutive and disjoint, and passage k of a group goes to test when k % 10 == 0, to
//            validation when k % 10 == 5, else to training. With random windows (the default), a
//            training passage is replaced in each batch by a window of `passage` bytes at a random
//            start inside its training region (passages 1-4 or 6-9 of ten: the bytes between a test
//            and a validation passage), so 2000 steps do not memorise a fixed set of texts; the
//            windows never reach a validation or test byte
// Token ids: 0 is padding; pixels and bytes are value + 1 (vocab 257); ListOps tokens are
// listops_vocab(). The validation split never comes from the test set: pixels holds out the last
// validation_size(val_size) images (apps/common/options.h) of a fixed permutation of the training set.
//
// Shapes, with B the batch and T the longest sequence in it:
//   tokens i64 (B, T) padded with 0, lengths i64 (B), labels i64 (B), logits f32 (B, K)
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "apps/common/report.h"
#include "apps/common/run.h"
#include "apps/longseq/model.h"
#include "core/random.h"
#include "data/loader.h"
#include "optim/optimizer.h"

namespace ag::apps::longseq {

struct SeqDataset {
  int64_t max_len = 0;      // T: no sequence is longer
  int64_t vocab = 0;        // ids 0 .. vocab - 1; 0 = padding
  int64_t num_classes = 0;
  int64_t grid_h = 0, grid_w = 0;  // pixels: every sequence is grid_h x grid_w, row by row; else 0
  std::vector<uint16_t> tokens;    // (n, max_len), padded with 0
  std::vector<int64_t> lengths, labels;  // (n)
  std::vector<std::string> class_names;
  // Random windows (text's training split; empty elsewhere): sequence i may be replaced by the
  // max_len tokens of `source` starting anywhere in [window_lo[i], window_hi[i]] (make_batch with a
  // generator). tokens[i] stays the fixed passage, for evaluation.
  std::vector<uint16_t> source;
  std::vector<int64_t> window_lo, window_hi;

  int64_t size() const { return int64_t(labels.size()); }
  // appends one sequence (ids in [1, vocab), at most max_len of them) with its label
  void add(std::span<const uint16_t> ids, int64_t label);
};

struct SeqSplits {
  SeqDataset train, val, test;
};

// ---- the tasks ---------------------------------------------------------------------------------
const std::vector<std::string>& longseq_tasks();  // {"pixels", "listops", "text"}

struct TaskOptions {
  std::string task = "pixels";
  std::string dataset = "fashion-mnist";  // pixels: fashion-mnist | mnist | cifar10
  std::string data_dir;      // pixels: the images (default: vit's); text: the cache of the bible's text
  // pixels: training images held out for validation (validation_size: -1 holds out 10% of the
  // training set, at most 5000; 0 none, then the last model is tested)
  int64_t val_size = -1;
  // listops
  uint64_t data_seed = 0;
  int64_t listops_train = 20000, listops_val = 2000, listops_test = 2000;
  int64_t listops_min_len = 500, listops_max_len = 2000;
  // text
  int64_t passage = 2048;    // bytes per passage
  bool random_windows = true;  // training passages at random starts inside their region (text_splits)
};
// The checks of the command line, before any data is read: a UsageError naming the option and its
// value for an unknown task or dataset, val_size < -1, ListOps sizes < 1 or min_len > max_len or
// max_len < 5, passage < 16.
void validate_task_options(const TaskOptions& t);
// The checks of the whole command line, in this order: validate_task_options, then a UsageError
// for --heads not dividing --d-model, --materialise with a method other than full, window or
// sparse, axial attention on ListOps (whose expressions vary in length), an --axial-width that does
// not divide --passage.
void validate_command_line(const LongSeqConfig& cfg, const TaskOptions& t, int64_t axial_width);

// Reads or makes the splits of t.task. `out_dir` (ListOps only): where the TSV files are written
// (nothing written when empty). Raises data::DatasetNotFound naming the Debian package when the
// data is missing.
SeqSplits load_task(const TaskOptions& t, const std::string& out_dir = "");

// pixels: `val_size` as --val-size (validation_size); a UsageError when it leaves no training image.
SeqSplits pixel_splits(const std::string& dataset, const std::string& dir, int64_t val_size);

// ListOps. Tokens: 0 <pad>, 1-10 the digits 0-9, 11 [MAX, 12 [MIN, 13 [MED, 14 [SM, 15 ].
const std::vector<std::string>& listops_vocab();
struct ListOpsExample {
  std::vector<uint16_t> ids;
  int value = 0;  // 0-9
};
// One expression of LRA's grammar drawn from `rng` (a node above depth max_depth is an operator
// with probability 0.25, with 2 to max_args arguments, else a digit; at max_depth a digit), drawn
// again until its length is within [min_len, max_len]. The draws are plain modulo reductions of
// std::mt19937_64, so a seed gives the same expressions on every platform.
ListOpsExample draw_listops(std::mt19937_64& rng, int64_t min_len, int64_t max_len, int max_depth = 10,
                            int max_args = 10);
// The value of an expression given as tokens (for the tests and as a check of the generator):
// MAX, MIN, MED (the median; for an even count the mean of the two middle digits rounded down, as
// LRA's int(np.median(...))), SM (the sum mod 10). Raises ag::Error for a malformed expression.
int listops_value(std::span<const uint16_t> ids);
std::string listops_text(std::span<const uint16_t> ids);  // "[MAX 2 9 [MIN 4 7 ] 0 ]"
SeqSplits make_listops(const TaskOptions& t);
// The splits as <dir>/listops-{train,val,test}.tsv, "source<TAB>target" per line (atomic writes).
void write_listops_tsv(const SeqSplits& s, const std::string& dir);

// text
// The 8 groups of books: law (Genesis-Deuteronomy), history (Joshua-Esther), wisdom (Job-Song of
// Solomon), major prophets (Isaiah-Daniel), minor prophets (Hosea-Malachi), gospels and Acts,
// Paul's letters (Romans-Philemon), the other letters and Revelation (Hebrews-Revelation).
const std::vector<std::string>& kjv_groups();
// The verses of the pretty-printed bible text (data::load_bible_kjv) without headings and verse
// numbers, one string per book in canonical order (66). Raises ag::Error when the text does not
// have 66 books.
std::vector<std::string> kjv_books(const std::string& pretty_text);
// The group of the book with canonical index `book` (0-65).
int kjv_group_of(int book);
// random_windows: fill train.source and the window ranges (see SeqDataset).
SeqSplits text_splits(const std::vector<std::string>& books, int64_t passage, bool random_windows = true);

// ---- batches, training, evaluation -------------------------------------------------------------
struct SeqBatch {
  Tensor tokens, lengths, labels;  // i64 (B, T), (B), (B) on the host; T = the longest in the batch
};
// With `gen` and a dataset with random windows, sequence b of the batch is the window whose start is
// drawn from Philox block gen->offset() + b (the generator advances by the batch size); otherwise
// the fixed sequences.
SeqBatch make_batch(const SeqDataset& ds, std::span<const int64_t> indices, Generator* gen = nullptr);

// The training batches: a seeded DataLoader (drop_last, `prefetch` batches ahead) positioned at
// `start_step`, this rank's slice of each global batch under mpirun (as vit's). The windows of the
// batch of step s come from generator seed + 1 at offset s * batch + this rank's first position, so
// a resumed run sees the batches an uninterrupted one would have, on any number of ranks.
std::unique_ptr<data::DataLoader<SeqBatch>> make_train_loader(const SeqDataset& train, int64_t batch, uint64_t seed,
                                                              int64_t start_step, int prefetch = 2,
                                                              int shard_rank = 0, int shard_count = 1);

// The gradients of one training step on `batch`, no update: model.train(); logits (B, K) =
// model(tokens, lengths); loss = cross_entropy(logits, labels), the mean over the batch;
// compute_gradients (zero, then backward of loss x loss_scale: Run::loss_scale). Returns the loss.
// main.cpp's training loop runs it, and so do the tests.
double forward_backward(LongSeqClassifier& model, optim::Optimizer& opt, const SeqBatch& batch,
                        double loss_scale = 1.0);

using EvalResult = ClassifierEval;  // apps/common/evaluate.h
// The model on the first `limit` sequences of `ds` (0: all), `batch` at a time, in eval mode and
// without recording (the mode is restored); `sharded`: each rank evaluates its eval_part and the
// sums are added over the ranks (apps/common/evaluate.h evaluate_classifier).
EvalResult evaluate(LongSeqClassifier& model, const SeqDataset& ds, int64_t batch, int64_t limit = 0,
                    bool sharded = false);

// The attention of the last block for the first `n` sequences of `ds`, averaged over the heads and
// the sequences and pooled into at most `cells` x `cells` blocks (each cell the mean of its block),
// so a map over thousands of tokens stays readable: an SVG heatmap of queries by keys (tokens for
// full and window, the k projected keys for linformer, the compressed blocks for compressed);
// nullopt for axial, whose two passes have no single map.
std::optional<std::string> attention_heatmap_svg(LongSeqClassifier& model, const SeqDataset& ds, int64_t n,
                                                 int64_t cells = 64);
// The pooling alone: (T, T) weights -> (c, c) block means, c = min(cells, T).
Tensor block_means(const Tensor& weights, int64_t cells);
// <dir>/attention.svg from the first `n` sequences of `ds` (attention_heatmap_svg), and one line
// saying where; nothing for axial.
void write_heatmap(LongSeqClassifier& model, const SeqDataset& ds, int64_t n, const std::string& dir);

// ---- the run -----------------------------------------------------------------------------------
// The run's config, saved with every checkpoint: the model's LongSeqConfig with the task's options
// under "task" ({"task", "dataset", "val_size", "data_seed", "listops": [train, val, test, min_len,
// max_len], "passage", "random_windows"}).
nlohmann::json run_config(const LongSeqConfig& model, const TaskOptions& t);
// The model's and the task's parts of a saved run_config, each checked (check_config,
// validate_task_options); an ag::Error names `file` or the missing entry. The task reads its data
// from `data_dir`.
LongSeqConfig model_from_json(const nlohmann::json& j, const std::string& file);
TaskOptions task_from_json(const nlohmann::json& j, const std::string& data_dir);
// The options whose values --eval-only takes from the checkpoint, and their keys in run_config.
const std::vector<SavedOption>& longseq_saved_options();

// The model's sizes from the training split: vocab, max_len, classes, and for axial attention the
// grid: the pixels' own, or rows of `axial_width` tokens (0: axial_width_for(max_len)). Then
// check_config.
void fit_model_to_data(LongSeqConfig& cfg, const SeqDataset& train, int64_t axial_width);
// The divisor of n nearest sqrt(n) from above: the row length of a near-square grid.
int64_t axial_width_for(int64_t n);
// --patience -1 (the default): 5 evaluations for a training set under kSmallTrainSet sequences,
// else off (resolve_patience). Returns the line that says what was chosen ("" when given).
std::string fit_patience_to_data(RunOptions& o, int64_t n_train);
// The run's line: the task, its splits, the sequence length, the model and its attention method.
std::string describe_run(const LongSeqConfig& cfg, const TaskOptions& t, const SeqSplits& data);

}  // namespace ag::apps::longseq
