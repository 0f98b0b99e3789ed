#pragma once
// What apps/imagetext/main.cpp does outside its main(), here so that tests/apps/test_imagetext.cpp
// can run each piece on a tiny model and tiny synthetic scenes:
//
//   ImageTextRunConfig   the model, scene and split settings (saved in every checkpoint)
//   load_imagetext_data  Fashion-MNIST, split into the three scene sources (train / validation / test)
//   train_batch          the scenes of one training step (a function of seed and step: resumable)
//   forward_backward     one step's loss and gradients: THE step main's loop runs (caption_loss)
//   caption_loss         teacher-forced mean cross-entropy over the caption tokens
//   greedy_captions      generation: each image encoded once, each decoder block's image keys and
//                        values projected once, one token at a time through the KV caches
//   evaluate_captions    loss, token accuracy, exact caption match (overall and by item count)
//   retrieval            image -> text and text -> image recall@1 / @5 by caption log-likelihood
//   cross_attention      where the decoder looked for each word: per block, per head, over the patches
//   word_item_share      the share of words whose attention mass is highest on the item they name
//   attention_svg        those maps drawn over the scenes
//   test_model           all of the above on the test scenes, as main prints and reports them
//
// Shapes: B scenes, T = max_items + 1 decoder positions, V words, NH heads, N patches of a
// gh x gw grid, Tk = N + 1 image tokens (the class token first).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/common/report.h"
#include "apps/common/run.h"
#include "apps/imagetext/model.h"
#include "apps/imagetext/scene.h"
#include "data/images.h"
#include "optim/optimizer.h"

namespace ag::apps {

// ---- the run's config --------------------------------------------------------------------------
struct ImageTextRunConfig {
  ImageTextConfig model;    // image_h, image_w, vocab, max_len follow the scenes (fit_model_to_scenes)
  SceneConfig scenes;
  // training images held out as the validation scenes' source: -1 picks 10% of the training set,
  // at most 5000 (validation_size); a run saves the count it held out
  int64_t val_images = -1;
  int64_t val_scenes = 500;   // validation scenes (model selection); composed from those images
  int64_t test_scenes = 1000;  // test scenes, composed from the test images only
  uint64_t scene_seed = 1;     // the seed of every scene stream (the training stream included)
  double label_smoothing = 0.0;
};
nlohmann::json imagetext_config_to_json(const ImageTextRunConfig& c);
// The inverse; an ag::Error names a missing or mistyped key.
ImageTextRunConfig imagetext_config_from_json(const nlohmann::json& j);
// Sets the item size of the scenes to the side of the (square, grey) item images; an ag::Error
// when they are not square and grey or `patch` does not divide their side.
void fit_scenes_to_data(SceneConfig& s, const data::ImageDataset& items, int64_t patch);
// Sets the model's canvas size, vocabulary and positions from the scene settings.
void fit_model_to_scenes(ImageTextConfig& m, const SceneConfig& s);

// The checks of the command line, before any data is read: a UsageError naming the option and its
// value when the layout is unknown, the item counts do not fit it, --patch does not divide the
// item size 28, --heads does not divide --d-model, a size is below 1, a scene count is below 1,
// --val-images is neither -1 nor at least 1, or the label smoothing is outside [0, 1).
void validate_imagetext_config(const ImageTextRunConfig& c);

// ---- data --------------------------------------------------------------------------------------
struct ImageTextData {
  data::ImageDataset train, val, test;  // the scene sources: training images minus the held-out
                                        // ones, the held-out ones, the test images
  data::Normalization norm;             // of the training images' pixels
};
// Fashion-MNIST from `dir` (data/images.h kFashionMnistDir when empty), with `val_images` training
// images held out (data::hold_out with a fixed seed: the same split every run; -1: validation_size's
// 10%, at most 5000). Raises data::DatasetNotFound when the files are missing, a UsageError naming
// --val-images when the hold-out leaves no training image.
ImageTextData load_imagetext_data(const std::string& dir, int64_t val_images);

// The scenes of training step `step`: the global batch is scenes [step B, (step + 1) B) of the
// training stream, and this rank takes its slice data::shard(B, rank, ranks).
std::vector<Scene> train_scenes(const data::ImageDataset& train, const ImageTextRunConfig& c, int64_t global_batch,
                                int64_t step, int rank = 0, int ranks = 1);

// ---- training ----------------------------------------------------------------------------------
// logits = model(images, input) (B, T, V);  loss = cross_entropy over the (B T) positions whose
// target is not -100 (label smoothing s), summed and divided by `tokens` (0: by their count, the
// mean negative log-likelihood per caption token, words and <eos>).
// Data parallel: captions differ in length, so the ranks' slices hold different numbers of tokens,
// and the mean of the ranks' means is not the global batch's mean. Each rank divides its sum by
// the global batch's token count over the number of ranks instead (tokens = W / N, known to every
// rank from the scenes: caption_token_count), so the mean over the ranks is sum_all / W exactly.
Tensor caption_loss(ImageText& model, const SceneBatch& batch, double label_smoothing = 0.0, double tokens = 0);
// The caption tokens (words and <eos>) the loss counts in `scenes`: sum of (items + 1).
int64_t caption_token_count(std::span<const Scene> scenes);

// One training step's batch on this rank: its slice of the step's scenes (train_scenes), their
// pixels and captions, and what caption_loss divides the slice's summed loss by: the global
// batch's caption tokens over the ranks (with one rank, the slice's own count: the mean).
struct TrainBatch {
  SceneBatch batch;
  int64_t scenes = 0;
  double loss_tokens = 0;
};
TrainBatch train_batch(const ImageTextData& data, const ImageTextRunConfig& c, int64_t global_batch, int64_t step,
                       int rank = 0, int ranks = 1);
// The gradients of one training step on `b`, no update: model.train(); loss = caption_loss(model,
// b.batch, label_smoothing, b.loss_tokens); compute_gradients (zero, then backward of loss x
// loss_scale: Run::loss_scale). Returns the loss. main.cpp's training loop runs it, and so do the
// tests.
double forward_backward(ImageText& model, optim::Optimizer& opt, const TrainBatch& b, double label_smoothing,
                        double loss_scale = 1.0);

// ---- generation --------------------------------------------------------------------------------
// Greedy captions of a batch of scenes (B, 1, H, W), under NoGradGuard in eval mode (restored):
//   memory = encode(images) once; kv_l = dec_blocks.l.context_kv(memory) once per block;
//   t = 0: the <bos> column; each step decodes only the newest token (the caches hold the rest),
//   appends argmax(logits) until every sequence has made <eos> or T tokens.
// What a step reuses (bench_decode --imagetext times the three; they make the same tokens):
//   full        the self-attention caches, and each block's image keys and values projected once
//   text_only   the self-attention caches; the image keys and values projected again at every step
//   none        nothing: the whole prefix decoded again from the memory (the reference)
// Returns each scene's generated tokens up to and including its <eos> (if any).
enum class CaptionCache { none, text_only, full };
std::vector<std::vector<int64_t>> greedy_captions(ImageText& model, const Tensor& images,
                                                  CaptionCache cache = CaptionCache::full);
// The same from the encoder's output memory (B, Tk, d) = model.encode(images), for a caller that
// needs it for more than generation (evaluate_captions: the teacher-forced logits too). The caller
// sets eval mode and no recording (InferenceScope).
std::vector<std::vector<int64_t>> greedy_captions_from(ImageText& model, const Tensor& memory,
                                                       CaptionCache cache = CaptionCache::full);

struct CaptionEval {
  double loss = 0;            // mean teacher-forced cross-entropy per caption token
  double token_accuracy = 0;  // argmax == target over those tokens (teacher forcing)
  double exact_match = 0;     // greedy caption == the true caption (words and its end)
  double word_accuracy = 0;   // generated word k == true word k, over all true words
  std::vector<int64_t> scenes_by_items, exact_by_items;  // index n: scenes of n items, and exact ones
  int64_t scenes = 0;
  double exact_match_of(int64_t n) const;  // exact_by_items[n] / scenes_by_items[n]; NaN if none
};
// `scenes` of `source`, `batch` at a time, eval mode, no tape (the mode is restored). With
// `sharded` each rank evaluates its eval_part and the sums are added over the ranks.
CaptionEval evaluate_captions(ImageText& model, const data::ImageDataset& source, const SceneConfig& sc,
                              const std::vector<Scene>& scenes, const data::Normalization& norm, int64_t batch,
                              bool sharded = false);

// ---- retrieval ---------------------------------------------------------------------------------
// The scorer: s(i, j) = log p(caption j | image i) = sum over its tokens t (words and <eos>) of
// log softmax(logits)[t, c_t], the total log-likelihood under teacher forcing (not the mean per
// token: captions of different lengths compete, and the <eos> term is the model's count of items).
// With a uniform prior over the candidate images p(image i | caption j) is proportional to
// p(caption j | image i), so the same matrix ranks both ways.
// caption_scores(model, images, captions): S (B_img x B_cap, row-major) for `images` (B_img, 1, H, W)
// and `captions` (token sequences [<bos> .. <eos>]): each image encoded once and its keys and values
// projected once; all captions decoded against it in one batch (the keys and values expanded: views).
std::vector<double> caption_scores(ImageText& model, const Tensor& images, const std::vector<std::vector<int64_t>>& captions);

struct RetrievalResult {
  double i2t_r1 = 0, i2t_r5 = 0, t2i_r1 = 0, t2i_r5 = 0;
  int64_t queries = 0, candidates = 0;
};
// Recall@k of one n x n score matrix S (row i: image i, column j: caption j; item i's own caption
// is j = i): image -> text, the share of rows whose own caption ranks in the top k; text -> image,
// the share of columns whose own image does. A candidate whose caption equals the query's own
// (another scene of the same items) counts as a match too. Ranks: the number of strictly greater
// scores among non-matching candidates (ties go to the match).
RetrievalResult recall_at(const std::vector<double>& S, int64_t n, const std::vector<std::vector<int64_t>>& captions);
// Over `scenes`, cut into consecutive groups of `candidates` (the last group is dropped when
// shorter): within each group every image ranks the group's captions and every caption its images.
// The recalls are averaged over all queries.
RetrievalResult retrieval(ImageText& model, const data::ImageDataset& source, const SceneConfig& sc,
                          const std::vector<Scene>& scenes, const data::Normalization& norm, int64_t candidates);

// ---- cross-attention ---------------------------------------------------------------------------
// Each decoder block's cross-attention weights (B, NH, T, Tk) for `tokens` (B, T) over `images`:
// one teacher-forced decode under an nn::AttentionCapture, in eval mode without recording. Row t
// holds the keys that produced the word at position t + 1 of the caption (its query reads token t).
std::vector<Tensor> cross_attention(ImageText& model, const Tensor& images, const Tensor& tokens);

struct WordItemShare {
  double share = 0;                 // with the weights averaged over heads and decoder blocks
  std::vector<double> per_block;    // each block's, heads averaged
  double chance = 0;                // mean over the words of 1 / (items of its scene)
  double cls_mass = 0;              // mean weight on the class token (not a place in the image)
  int64_t words = 0;
};
// For each true word k of each scene (teacher forcing on the true caption), the attention mass of
// its query (row k - 1) on each item's patches,
//   mass_l[m] = (1/NH) sum_h sum_{patches p of slot m} w_l[b, h, k - 1, 1 + p]   (key 0: the class token)
// over the slots m < n that hold an item: the word counts when that mass is largest on slot k - 1,
// the item it names (per_block: mass_l; share: the mean of mass_l over the blocks). Blank slots are
// no candidates, so chance (uniform attention) is 1/n for a scene of n items.
// word_item_share_of: from given weights (one (B, NH, T, Tk) tensor per block) of `scenes`, with
// slot = patch_slots(sc, patch); word_item_share: the model's, over `scenes`, `batch` at a time.
WordItemShare word_item_share_of(const std::vector<Tensor>& weights, const std::vector<int64_t>& slot,
                                 std::span<const Scene> scenes);
WordItemShare word_item_share(ImageText& model, const data::ImageDataset& source, const SceneConfig& sc,
                              const std::vector<Scene>& scenes, const data::Normalization& norm, int64_t batch);

// The SVG: for each scene, its greedy caption, and for each generated word one row of panels:
// the weights averaged over heads and blocks, then each head of the last block, over the scene.
std::string attention_svg(ImageText& model, const data::ImageDataset& source, const SceneConfig& sc,
                          const std::vector<Scene>& scenes, const data::Normalization& norm);

// ---- the test scenes, once, at the end ---------------------------------------------------------
struct TestOptions {
  int64_t eval_batch = 250;            // scenes per forward when evaluating
  int64_t retrieval_candidates = 100;  // N: each query ranks N candidates
  int64_t attention_scenes = 2;        // test scenes drawn in attention.svg (each ~0.25 MB per word)
};
// What the test scenes show about a model, printed and added to the report.
struct TestFigures {
  CaptionEval captions;
  RetrievalResult retrieval;
  WordItemShare share;
};
// The c.test_scenes test scenes: evaluate_captions (each rank its part when `sharded`: every rank
// must call it), then on rank 0 alone retrieval, word_item_share and <dir>/attention.svg.
TestFigures test_model(ImageText& model, const ImageTextRunConfig& c, const ImageTextData& data, const TestOptions& t,
                       const std::string& dir, bool sharded);
// The figures as main prints them, several lines; and into the report (accuracy: the exact match).
std::string figures_text(const TestFigures& f, const SceneConfig& sc, const std::string& dir);
void fill_report(RunReport& report, const TestFigures& f, const SceneConfig& sc);
// --diagnose-attention: every attention of the model on the first `batch` test scenes.
void diagnose(ImageText& model, const ImageTextRunConfig& c, const ImageTextData& data, int64_t batch,
              const std::string& dir);
// The options whose values --eval-only takes from the checkpoint, and their keys in
// imagetext_config_to_json.
const std::vector<SavedOption>& imagetext_saved_options();

}  // namespace ag::apps
