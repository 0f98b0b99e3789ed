#pragma once
// What apps/textclf/main.cpp does outside its main(), here so that the tests reach it:
//
//   TextTokenizer      char (codepoint or byte) or word ids for the model, 0 = padding, saved with
//                      the checkpoint as JSON ("tokenizer" in the checkpoint's extra metadata)
//   encode_dataset     every text of a split -> its ids, truncated to max_len, and with subword
//                      n-grams on, each token's hashed n-gram ids (data::hashed_ngrams)
//   load_text_data     the split, its tokenizer and its encoded texts: main's data section
//   fit_defaults_to_data  the defaults a small set of words gets, each with the line that says why
//   BucketSampler      the batches of a training step: a pure function of (seed, step) that groups
//                      texts of similar length, so a batch pads little
//   make_batch         ids -> a padded batch (tokens, lengths, labels[, ngrams]) with data::pad_batch
//   forward_backward   the gradients of one training step: what main's loop and the tests run
//   evaluate           loss, accuracy and confusion matrix over a split, longest-first batches
//   attention_heatmaps the per-head token-by-token weights of one text, one panel per head
//   CharNgramNB        the baseline to beat: multinomial naive Bayes on character 1-5-grams
//   bag_naive_bayes    the bag path's start: naive Bayes over the model's own features
//
// Shapes, with B the batch, T the longest text in it (<= max_len), K the classes:
//   tokens i64 (B, T) padded with 0, lengths i64 (B), labels i64 (B), logits f32 (B, K),
//   ngrams i64 (B, T, G) padded with 0 (G: the most n-grams of a token in the batch).
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/common/plot.h"
#include "apps/common/report.h"
#include "apps/common/run.h"
#include "apps/textclf/model.h"
#include "data/loader.h"
#include "data/text.h"
#include "data/tokenizer.h"
#include "optim/optimizer.h"

namespace ag::apps::textclf {

// ---- tokenizer ---------------------------------------------------------------------------------
// Model ids put the padding at 0, so a tokenizer's own ids are shifted where they would collide:
//   char  model id = char id + 1: 0 <pad>, 1 <unk> (codepoint mode), then the codepoints of the
//         training text in ascending order (or the 256 bytes in byte mode, ids 1..256)
//   word  model id = word id: 0 <pad>, 1 <unk>, then the words by frequency (data/tokenizer.h)
// JSON form (the checkpoint's "tokenizer" entry):
//   {"kind": "char", "tokenizer": <CharTokenizer::to_json() object>}
//   {"kind": "word", "tokenizer": <WordTokenizer::to_json() object>}
class TextTokenizer {
 public:
  enum class Kind { char_level, word_level };

  // Char: the codepoints of `train_texts`. Word: the words seen at least min_freq times, at most
  // max_words ids in all; `layout`: newlines and tabs are tokens too (data::word_split).
  static TextTokenizer build_char(const std::vector<std::string>& train_texts);
  static TextTokenizer build_word(const std::vector<std::string>& train_texts, int min_freq, int max_words,
                                  bool layout = false);

  Kind kind() const { return kind_; }
  std::string kind_name() const { return kind_ == Kind::char_level ? "char" : "word"; }
  int64_t vocab_size() const;  // model ids 0..vocab_size-1, padding included

  // The model ids of `text`, at most max_len of them (max_len > 0).
  std::vector<int64_t> encode(std::string_view text, int64_t max_len) const;
  // Word kind only: the token strings behind encode(text, max_len)'s ids (data::word_split with
  // the tokenizer's layout setting, so lower-cased), one per id; what the subword n-grams are
  // taken from. ag::Error for the char kind.
  std::vector<std::string> pieces(std::string_view text, int64_t max_len) const;
  // What a model id stands for, for plot labels: the character or the word (a space shown as "␣",
  // a newline as "↵", a tab as "→"); "<pad>", "<unk>".
  std::string label(int64_t id) const;

  std::string to_json() const;
  // Raises ag::Error starting with `what` on anything malformed.
  static TextTokenizer from_json(const std::string& json, const std::string& what = "textclf tokenizer");

 private:
  Kind kind_ = Kind::char_level;
  data::CharTokenizer chars_;
  data::WordTokenizer words_;
};

// ---- the model's config in checkpoints ------------------------------------------------------
nlohmann::json config_to_json(const TextClassifierConfig& c);
// Every field is required and checked, except the n-gram ones (absent in checkpoints made before
// them: then off, with the struct's defaults); ag::Error "textclf config: ..." otherwise.
TextClassifierConfig config_from_json(const nlohmann::json& j);
// The model's n-gram settings as data::hashed_ngrams takes them (buckets 0 when off).
data::NgramSpec ngram_spec(const TextClassifierConfig& c);

// ---- data ----------------------------------------------------------------------------------------
// With n-grams on, each distinct token string ("form") of the set is hashed once: forms[i][t] is
// the row of form_ngrams holding the n-gram ids of token t of text i. Row 0 has no n-grams (the
// <unk> that stands for an empty text). make_batch gathers them into the batch's (B, T, G) ids.
struct EncodedSet {
  std::vector<std::vector<int64_t>> ids;  // per text, 1..max_len model ids (an empty text: one <unk>)
  std::vector<int64_t> labels;            // per text, in [0, K)
  std::vector<std::vector<int32_t>> forms;         // per text, per token: a row of form_ngrams; empty: off
  std::vector<std::vector<int64_t>> form_ngrams;   // per distinct token string: data::hashed_ngrams
  int64_t size() const { return int64_t(ids.size()); }
  int64_t tokens() const;                 // sum of the lengths
  std::vector<int64_t> lengths() const;   // per text, its number of ids (what BucketSampler sorts by)
  bool has_ngrams() const { return !forms.empty(); }
};
// `ngrams.buckets` > 0 (word tokenizer only; ag::Error for the char one) fills forms and form_ngrams.
EncodedSet encode_dataset(const data::TextDataset& ds, const TextTokenizer& tok, int64_t max_len,
                          const data::NgramSpec& ngrams = {});

// The most tokens a text keeps (--max-len's bound).
inline constexpr int64_t kMaxTextLen = 4096;

// The bag path's starting values (TextClassifierConfig::bag): multinomial naive Bayes over the
// model's own features of `train` (fitted on it alone), with add-alpha smoothing: for the words
// (every id a training token has) and, with n-grams, for the n-gram ids of those tokens, two
// families of features f with their own counts,
//   theta_{c,f} = (count_c(f) + alpha) / (total_c + alpha F)   F = the table's rows but padding
//   bag[f, c]   = log theta_{c,f} - mean_c' log theta_{c',f}
// where count_c(f) is how often f occurs in the training texts of class c and total_c the sum over
// the family. The centring subtracts from each row a number that is the same for every class: it
// keeps the rows small and changes no difference between classes. Padding rows stay zero.
// The path's logits of a text of n tokens are the mean of its rows:
//   L_c = (1/n) sum_f n_f bag[f, c] = (1/n) LL_c - (a constant of the text)
//   LL_c = sum_f n_f log theta_{c,f}        naive Bayes' log-likelihood of the text under class c
// so the path predicts what naive Bayes with a uniform prior predicts. Naive Bayes' prior log P(c)
// is left out, because the path cannot hold it: naive Bayes adds it once per text, so the path
// would need log P(c) / n. A number b_c added to every row of class c (or the head's bias) adds b_c
// to L_c, which is n b_c in naive Bayes' units: the prior counted n times. With balanced classes
// the start is naive Bayes exactly; otherwise it differs only on texts whose log-likelihood margin
// between two classes is below |log P(c) - log P(c')| (docs/math/text-classification.md, "The bag
// path").
struct BagTables {
  int64_t classes = 0;
  std::vector<float> words;   // (vocab, classes) row-major
  std::vector<float> ngrams;  // (ngram_buckets + 1, classes), or empty without n-grams
};
// ag::Error when alpha <= 0 or `train`'s ids or labels do not fit the sizes.
BagTables bag_naive_bayes(const EncodedSet& train, int64_t vocab, int64_t ngram_buckets, int64_t classes,
                          double alpha);
// The accuracy over `set` of the tables alone (the argmax of the summed rows, the first class on a
// tie): how good a start they are, measured on validation before any training.
double bag_accuracy(const BagTables& t, const EncodedSet& set);
// The model's bag tables set to `t` (ag::Error when the model has no bag path or the sizes differ).
void init_bag_from_naive_bayes(TextClassifier& model, const BagTables& t);

// Which data and how it becomes ids; saved in the checkpoint's config ("data"), so that
// --eval-only rebuilds the same split. Every split is stratified (data::split_dataset, by
// split_seed): each class gives its share, rounded, so the validation size may differ from the
// count below by up to half the number of classes.
//   fortunes  language identification on data::load_fortunes(root): 10% test, validation_size's
//             count (10%, at most 5000) validation, the rest training
//   imdb      <root>/train and <root>/test of an aclImdb folder; validation: validation_size's
//             count of train (10%, at most 5000; apps/common/options.h)
//   tsv       tsv_file for train and validation (validation_size's count of it) and tsv_test for
//             test; without tsv_test, 10% of tsv_file is the test set and validation_size's count
//             of tsv_file (10% up to 50,000 texts) the validation set
struct DataOptions {
  std::string dataset = "fortunes";  // fortunes | imdb | tsv
  std::string root;                  // fortunes: data::kFortuneRoot; imdb: the aclImdb folder
  std::string tsv_file, tsv_test;
  uint64_t split_seed = 1;
  std::string tokenizer = "auto";    // char | word | auto (word for fortunes and imdb; for tsv, by its texts)
  int64_t max_len = 128;             // tokens per text; longer texts keep their beginning
  int min_freq = 2, max_words = 30000;  // word tokenizer
  bool layout = false;                  // word tokenizer: newline and tab tokens (data::word_split)
};
nlohmann::json data_to_json(const DataOptions& d);
DataOptions data_from_json(const nlohmann::json& j);  // ag::Error "textclf config: ..." when malformed
// "char" or "word": what `auto` means for the dataset, "" for a TSV file before its texts are read
// (choose_tsv_tokenizer decides then); ag::Error on an unknown value.
std::string resolve_tokenizer(const DataOptions& d);
// --tokenizer auto on a TSV file: "word" when its training texts read as natural language written
// with spaces (at least 80% of them hold 3 or more space-separated words, on average at most 20
// bytes long), else "char" (codes, names, languages without spaces, where words would be too rare).
// `why` (may be null) gets the line that says which and why.
std::string choose_tsv_tokenizer(const std::vector<std::string>& texts, std::string* why = nullptr);
// Empty when the data is there; otherwise what to install or where to put it (the app exits 2).
std::string missing_data(const DataOptions& d);
// The subword n-gram buckets of a word model unless --ngram-buckets says otherwise.
inline constexpr int64_t kWordNgramBuckets = 262144;
// The command line's settings that the model and data config do not hold (apps/textclf/main.cpp).
struct TrainSettings {
  double label_smoothing = 0.0;
  double word_dropout = 0.0;         // --word-dropout: WordDropout's p for the training batches
  int64_t bucket_window = 16;        // batches sorted by length together
  int64_t eval_samples = 2000;       // validation texts per evaluation during training (0: all)
  int64_t eval_batch_tokens = 16384; // padded tokens per evaluation batch
  int64_t ngram_buckets = -1;        // -1: auto (kWordNgramBuckets with the word tokenizer, 0 with the char one)
  std::string ngram_range = "2-6";   // --ngrams MIN-MAX
  double nb_alpha = 0.1;             // the baseline's add-alpha smoothing
  std::string baseline = "auto";     // --baseline on | off | auto: the naive Bayes baseline
  std::string bag_path = "auto";     // --bag-path on | off | auto (fit_defaults_to_data)
};
// --ngrams "MIN-MAX": two integers around one dash, nothing else, 1 <= MIN <= MAX <= 64; a
// UsageError naming the text otherwise.
std::pair<int64_t, int64_t> parse_ngram_range(const std::string& text);
// The checks of the command line, before any data is read: a UsageError naming the option and
// value when --max-len is outside [1, 4096], --min-freq < 1, --max-words < 3 (<pad>, <unk> and a
// word), --tsv-file/--tsv-test without --dataset tsv, a model size < 1, --heads not dividing
// --d-model, --label-smoothing outside [0, 1), --word-dropout outside [0, 0.9], --bucket-window or
// --eval-batch-tokens < 1, --eval-samples < 0, --ngram-buckets outside [0, 2^26] (or > 0 with the char tokenizer),
// --ngrams malformed, --ngrams-per-token < 1, --nb-alpha <= 0, --layout-tokens with the char
// tokenizer.
void validate_config(const DataOptions& d, const TextClassifierConfig& mc, const TrainSettings& t);

// The train / valid / test split the options describe (ag::Error on malformed data).
data::TextSplit load_split(const DataOptions& d);

// The Debian packages of the fortune table (data/text.h fortune_sources) whose files are missing
// under `root`, each once, in table order. Empty when everything is installed.
std::vector<std::string> missing_fortune_packages(const std::string& root);

// A training batch: data::pad_batch's tokens and lengths, plus the labels, and when the set has
// n-grams, their ids (B, T, G): G the most of any token in the batch, padded with 0.
struct Batch {
  Tensor tokens, lengths, labels;  // i64 (B, T), (B), (B)
  Tensor ngrams;                   // i64 (B, T, G), or undefined when the set has no n-grams
  int64_t num_tokens = 0;          // valid tokens (sum of lengths)
};
// Word dropout (a training augmentation, as random crops are for images): each token of text r of
// the batch of step `step` is left out with probability p, decided by
//   data::philox_below(seed, kWordDropoutStream + step, (first + r) * kMaxTextLen + t, 2^24) < p 2^24
// (first: the slice's offset in the global batch), so a batch is a pure function of the step on
// every rank and thread count, and a resumed run sees what an unbroken one would. A text whose
// every token would go keeps them all. p = 0 draws nothing.
struct WordDropout {
  double p = 0;
  uint64_t seed = 0;
  int64_t step = 0, first = 0;
};
inline constexpr uint64_t kWordDropoutStream = uint64_t(1) << 40, kWordDropoutDraws = uint64_t(1) << 24;
Batch make_batch(const EncodedSet& set, std::span<const int64_t> indices, int64_t max_len,
                 const WordDropout& drop = {});

// Length bucketing without giving up randomness. Epoch e of step s = e * num_batches() + b:
//   1. order = data::epoch_permutation(N, seed, e)               a fresh shuffle
//   2. cut order into windows of `window` batches (window * batch_size texts); sort each window
//      by length (stable: ties keep the shuffled order)           neighbours have similar lengths
//   3. cut into batches of batch_size; the last partial batch is dropped
//   4. shuffle the batches of the epoch (Fisher-Yates, draws data::philox_below(seed, 1 + e, i, k))
//                                                                  so lengths do not come in runs
// batch(s) is a pure function of (lengths, batch_size, window, seed, s): the same on every
// machine and thread count, which makes a resumed run see exactly what an unbroken one would.
// window = 1 is plain shuffled batching. Thread-safe (one epoch's plan is cached under a mutex).
class BucketSampler {
 public:
  BucketSampler(std::vector<int64_t> lengths, int64_t batch_size, int64_t window, uint64_t seed);
  int64_t num_batches() const { return num_batches_; }  // per epoch: N / batch_size
  std::vector<int64_t> batch(int64_t step) const;
  std::vector<std::vector<int64_t>> epoch_batches(uint64_t epoch) const;  // the plan of one epoch

 private:
  std::vector<int64_t> lengths_;
  int64_t batch_size_, window_, num_batches_;
  uint64_t seed_;
  mutable std::mutex mu_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<std::vector<int64_t>> cached_;
};

// The training batches of steps 0..steps-1 as a prefetching DataLoader: item s of its one
// unshuffled epoch is the batch of step s (sampler.batch(s)), so loader.seek(start) resumes a run
// at `start`. `set` and `sampler` must outlive the loader. Data parallel: the sampler plans the
// global batch, and each batch holds rank shard_rank's slice of it (data::shard of its texts),
// padded to that slice's longest text.
std::unique_ptr<data::DataLoader<Batch>> make_train_loader(const EncodedSet& set, const BucketSampler& sampler,
                                                           int64_t steps, int64_t max_len, int prefetch = 2,
                                                           int shard_rank = 0, int shard_count = 1,
                                                           WordDropout drop = {});

// ---- training and evaluation --------------------------------------------------------------------
// The gradients of one training step on `b`, no update: model.train(); the logits (B, K);
// loss = cross_entropy(logits, labels, label_smoothing), the batch's mean; compute_gradients (zero,
// then backward of loss x loss_scale: Run::loss_scale). Returns the loss. main.cpp's training loop
// runs it, and so do the tests, which then call Run::optimizer_step. The logits and the graph are
// freed when it returns, before the update and any evaluation.
double forward_backward(TextClassifier& model, optim::Optimizer& opt, const Batch& b, double label_smoothing = 0.0,
                        double loss_scale = 1.0);

struct EvalResult {
  double loss = 0;      // mean cross-entropy (no smoothing)
  double accuracy = 0;  // in [0, 1]
  ConfusionMatrix confusion;
  std::vector<int64_t> predicted;  // per text evaluated (the set's first `limit`, or all): the class
  explicit EvalResult(std::vector<std::string> classes) : confusion(std::move(classes)) {}
};
// In eval mode under NoGradGuard (the model's train/eval state is restored afterwards); batches
// of texts of similar length (sorted, longest first), at most `batch_tokens` padded tokens each.
// `limit` > 0 evaluates only the first `limit` texts. `sharded`: in a data-parallel job each rank
// evaluates its eval_part of the length-sorted texts and every rank returns the whole result,
// predictions included (every rank must call it; apps/common/run.h).
EvalResult evaluate(TextClassifier& model, const EncodedSet& set, const std::vector<std::string>& classes,
                    int64_t batch_tokens = 16384, int64_t limit = 0, bool sharded = false);

// The texts of `ds` that the model or the baseline got wrong, as TSV (test_errors.tsv):
//   index  true  model  baseline  text
// one row per such text in the set's order, classes by name, the baseline column "-" when
// `baseline` is null; tab, newline, carriage return and backslash in the text written as \t \n
// \r \\. `counts` (if given) gets {model errors, baseline errors, errors of both}. ag::Error when
// a prediction list's length differs from the set's.
std::string errors_tsv(const data::TextDataset& ds, const std::vector<int64_t>& model,
                       const std::vector<int64_t>* baseline = nullptr, std::array<int64_t, 3>* counts = nullptr);

// Per-head attention weights of text i of `set`: one panel per (layer, head) titled "layer l,
// head h", rows = queries, columns = keys, both labelled by the tokens. `predicted` gets the
// model's class.
std::vector<Heatmap> attention_heatmaps(TextClassifier& model, const TextTokenizer& tok, const EncodedSet& set,
                                        int64_t i, int64_t* predicted = nullptr);

// A test text for the heatmap: the first of `set` whose length lies in [lo, hi] (so that a
// person can read the labels), else the shortest. -1 when the set is empty.
int64_t pick_heatmap_sample(const EncodedSet& set, int64_t lo = 24, int64_t hi = 48);

// ---- the baseline: character n-gram naive Bayes ---------------------------------------------------
// Features: every substring of n consecutive codepoints of the text, n = min_n..max_n (the bytes of
// valid UTF-8, identified by a 64-bit FNV-1a hash; a collision among the ~10^6 distinct n-grams of
// the fortunes has probability ~10^-7). Multinomial naive Bayes with add-alpha smoothing, in log space:
//   log P(c | x)  =  log prior_c + sum_g n_g(x) log theta_{c,g}  - log Z(x)
//   prior_c       = docs of class c / docs
//   theta_{c,g}   = (count_c(g) + alpha) / (total_c + alpha V)      V = distinct n-grams in training
// where count_c(g) is how often g occurs in the training texts of class c and total_c = sum_g count_c(g).
// n-grams never seen in training are left out (as scikit-learn's vectorizer does).
struct NaiveBayesOptions {
  int min_n = 1, max_n = 5;
  double alpha = 0.1;
};

class CharNgramNB {
 public:
  explicit CharNgramNB(NaiveBayesOptions o = {}) : o_(o) {}
  void fit(const data::TextDataset& train);
  // Normalised log posteriors log P(c | text), K values (their exps sum to 1).
  std::vector<double> log_posterior(std::string_view text) const;
  int predict(std::string_view text) const;  // argmax (the lowest class on a tie)
  // Accuracy and confusion matrix over `ds` (its classes must be the training set's).
  EvalResult evaluate(const data::TextDataset& ds) const;

  void set_alpha(double alpha);  // refit-free: only theta's smoothing changes
  double alpha() const { return o_.alpha; }
  int64_t vocabulary() const { return int64_t(id_.size()); }
  const std::vector<std::string>& classes() const { return classes_; }

  // The n-gram hashes of a text, with repeats (exposed for the tests).
  std::vector<uint64_t> ngrams(std::string_view text) const;

 private:
  NaiveBayesOptions o_;
  std::vector<std::string> classes_;
  std::unordered_map<uint64_t, uint32_t> id_;  // n-gram hash -> row of counts_
  std::vector<uint32_t> counts_;               // (V, K) row-major: count_c(g)
  std::vector<double> total_, log_prior_;      // (K)
};

// ---- the run: main's data, its defaults, --eval-only, the baseline, the pictures ------------------
// Word models with subword n-grams fit their training set (loss ~0.002) and gain from dropout;
// character models underfit and do not: the default --dropout depends on the tokenizer.
inline constexpr double kWordDropout = 0.1;
// --word-dropout for a small set of words (< kSmallTrainSet texts): the best of the rates tried by
// validation accuracy over seeds on two small fortune sets (docs/benchmarks.md, "Small data").
inline constexpr double kSmallSetWordDropout = 0.3;
// --bag-path auto compares the path's start with the character n-gram naive Bayes on the same n
// validation texts. A gap within kBagTieStandardErrors standard errors of an accuracy there,
// sqrt(p (1 - p) / n) at the baseline's p, is a tie, and a tie takes the path: the path starts
// where naive Bayes ends, so it is the safer choice. Two, not one: on the tuning sets one standard
// error still turned the path off where it gained the most, and two kept it off only where it
// lost (docs/math/text-classification.md, "Measured: the bag path").
inline constexpr double kBagTieStandardErrors = 2.0;
struct BagDecision {
  bool on = true;
  double standard_error = 0;  // of the baseline's validation accuracy; 0 without validation texts
};
// start, chars: the path's start's and the baseline's validation accuracies on n_valid texts;
// without validation texts nothing speaks against the path: on.
BagDecision decide_bag_path(double start, double chars, int64_t n_valid);

// The data of a run: its texts and the same texts as the model's ids.
struct TextData {
  data::TextSplit split;          // train, validation, test (load_split)
  TextTokenizer tok;
  EncodedSet train, valid, test;  // the split's texts encoded by tok (and their n-grams)
  const std::vector<std::string>& classes() const { return split.train.classes; }
};
// main's data section. Sets d.root (--data-dir `data_dir` when given; "aclImdb" for imdb without
// one), raises data::DatasetNotFound with missing_data's message (what to install) when the data
// is not there, reads the split and encodes it, printing on stderr one line on the split and one
// on the tokens. `saved`: the tokenizer of a checkpoint (--eval-only), with `mc` the model it
// saved. Without it (training), the tokenizer is fitted on the training texts: --tokenizer auto on
// a TSV file is decided by them (choose_tsv_tokenizer, its line added to `chosen`, and
// validate_config again: a UsageError for options that need words), and mc's n-gram settings come
// from `s` (--ngram-buckets -1: kWordNgramBuckets for words, 0 for characters).
TextData load_text_data(DataOptions& d, TextClassifierConfig& mc, const TrainSettings& s, const std::string& data_dir,
                        const TextTokenizer* saved = nullptr, std::vector<std::string>* chosen = nullptr);

// The defaults that depend on the data, each with the line that says what was chosen and why; an
// option given on the command line wins (was_given). A small set (< kSmallTrainSet training
// texts) is memorised long before the default schedule ends. In this order:
//   --word-dropout  kSmallSetWordDropout for a small set of words, else as given (0)
//   --bag-path auto on for a small set of words unless the path's start (bag_naive_bayes) trails
//                   the character n-gram naive Bayes on validation by more than a tie
//                   (decide_bag_path); where it trails further, a poor start held the model below
//                   the encoder alone. `bag_start` gets the tables when the path is on.
//   --dropout       kWordDropout for words, 0 for characters
//   --steps         for a small set, at most 20 epochs of the global batch (set_steps)
//   --patience      resolve_patience: 5 for a small set, else 0
// Also fills the model's sizes from the data: mc.vocab, max_len, classes and bag.
std::vector<std::string> fit_defaults_to_data(RunOptions& o, TextClassifierConfig& mc, TrainSettings& s,
                                              const DataOptions& d, const TextData& data,
                                              std::optional<BagTables>& bag_start);
// The run's config, saved with every checkpoint and compared whole by --resume: the model, the
// data, and what fixes the batches (label smoothing, bucket window, global batch, seed, and word
// dropout when on, so that the configs of runs without it name no such key).
nlohmann::json run_config(const TextClassifierConfig& mc, const DataOptions& d, const TrainSettings& s,
                          const RunOptions& o);

// --eval-only: what the checkpoint `info` (of o.checkpoint) saved to rebuild its model and data.
struct SavedRun {
  TextClassifierConfig model;
  DataOptions data;
  TextTokenizer tok;
};
// An option that sets the model or its data (--dataset, --d-model, --ngrams, ...), given on the
// command line (mc, d, s as parsed) with another value than the checkpoint's, is a UsageError
// naming both (check_eval_only_options; --tokenizer auto and --ngram-buckets -1 stand for what
// the data chose then). ag::Error when the checkpoint holds no textclf config or tokenizer, or
// when the model's vocabulary differs from its tokenizer's.
SavedRun saved_run(const CheckpointInfo& info, const RunOptions& o, const TextClassifierConfig& mc,
                   const DataOptions& d, const TrainSettings& s);

// The baseline: the character 1-5-gram naive Bayes fitted on the training texts; and that fit
// measured on validation and test, with one line on stderr (its accuracies and the seconds taken).
CharNgramNB fitted_baseline(const data::TextSplit& split, double alpha);
std::pair<EvalResult, EvalResult> naive_bayes_baseline(const data::TextSplit& split, double alpha);
// The last line of a run with the baseline: "test accuracy A% vs the naive Bayes baseline's B%:
// <who wins> (model errors against baseline errors, how many of them made by both)"; `wrong` as
// errors_tsv counts them.
std::string versus_baseline(const EvalResult& model, const EvalResult& baseline, const std::array<int64_t, 3>& wrong);

// attention.svg: every head of every layer on one test text (pick_heatmap_sample), tokens on both
// axes; nothing when the test set is empty.
void write_attention_svg(TextClassifier& model, const TextData& data, const std::string& path);
// The first min(batch, |set|) texts of `set`, padded to their longest (at most max_len).
Batch first_texts(const EncodedSet& set, int64_t batch, int64_t max_len);
// --diagnose-attention: attention_diagnostics.json in `dir` for every block on the first `batch`
// test texts (padded keys and queries left out of the statistics), and its summary printed.
void diagnose(TextClassifier& model, const EncodedSet& test, int64_t batch, int64_t max_len, const std::string& dir);

}  // namespace ag::apps::textclf
