#pragma once
// What apps/vit/main.cpp does outside its main(): the run's config as JSON (saved in checkpoints),
// the datasets it knows, the seeded training batches, the evaluation on the test set and the class
// token's attention over the patch grid; and one training step as main's loop writes it out. Kept
// here so tests/apps/test_vit.cpp can run each piece on a tiny model and synthetic data.
//
// Shapes: B images in a batch, C channels, S x S pixels, patch P, grid G = S / P, N = G*G patches,
// T = N + 1 tokens (the class token first), H heads, K classes.
//   images  f32 (B, C, S, S)    labels i64 (B)    logits f32 (B, K)
//   attention weights of a block   (B, H, T, T)   row 0 = what the class token looks at
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/common/report.h"
#include "apps/common/run.h"
#include "apps/vit/model.h"
#include "data/images.h"
#include "data/loader.h"
#include "optim/optimizer.h"

namespace ag::apps {

// ---- the run's config --------------------------------------------------------------------------
// Everything needed to rebuild the model and its data; saved with every checkpoint (so that
// --eval-only needs nothing but the checkpoint) and in the report.
struct VitRunConfig {
  ViTConfig model;                        // image_size, channels, classes follow the dataset
  std::string dataset = "fashion-mnist";  // fashion-mnist | mnist | cifar10
  double label_smoothing = 0.1;           // of the training loss (the test loss uses none)
  data::Augment augment;                  // training only: random crop (pad) and flip
  // training images held out for validation (model selection and early stopping; the test set is
  // only evaluated at the end): -1 picks 10% of the training set, at most 5000 (validation_size);
  // 0 validates on nothing (then the last model is tested). Checkpoints written before the split
  // existed read as 0.
  int64_t val_size = -1;
};
nlohmann::json vit_config_to_json(const VitRunConfig& c);
// The inverse of vit_config_to_json; an ag::Error names a missing or mistyped key.
VitRunConfig vit_config_from_json(const nlohmann::json& j);

// ---- data --------------------------------------------------------------------------------------
// The datasets --dataset accepts and where each is looked for when --data-dir is not given.
const std::vector<std::string>& vit_datasets();  // {"fashion-mnist", "mnist", "cifar10"}
std::string default_data_dir(const std::string& dataset);
// The side of the dataset's square images, known without reading them: 28 for fashion-mnist and
// mnist, 32 for cifar10 (ag::Error for another name).
int64_t vit_image_size(const std::string& dataset);

// The checks of the command line, before any data is read: a UsageError ("vit: --heads 3 does not
// divide --d-model 64", naming the options and values) when --patch does not divide the dataset's
// image size, --heads does not divide --d-model, a size (--patch, --d-model, --heads, --layers,
// --mlp) is below 1, --crop-pad is negative or not below the image size, or the label smoothing is
// outside [0, 1).
void validate_vit_config(const VitRunConfig& c);

struct VitData {
  data::ImageSplits splits;   // train (without the validation images), test
  data::ImageDataset val;     // held out of the training files (data::hold_out, a fixed seed)
  data::Normalization norm;   // the training set's per-channel statistics
};
// Reads the dataset's files from `dir` (default_data_dir when empty) and holds `val_size` training
// images out for validation (validation_size for -1). Raises data::DatasetNotFound (saying which
// package or download to get) when they are missing, ag::Error for an unknown dataset name,
// non-square images or a --val-size that leaves no training image.
VitData load_vit_data(const std::string& dataset, const std::string& dir = "", int64_t val_size = 0);
// Sets the model's image_size, channels and classes from the images of `ds`.
void fit_model_to_data(ViTConfig& model, const data::ImageDataset& ds);

// The training batches of a run: a DataLoader over `train` (seeded shuffling, drop_last, the next
// `prefetch` batches made on a background thread) positioned at `start_step`, so a resumed run
// sees the batches an uninterrupted one would have. The augmentation of the batch of step s
// draws from Generator(seed + 1) at offset s * batch (image b: Philox block s * batch + b), a
// function of the step alone, so it resumes exactly too, whatever `prefetch` is.
// Data parallel: `batch` is the global batch and each batch holds only rank shard_rank's slice of
// it (data::shard: images [begin, end) of the global batch), augmented with the draws of those
// images (Philox blocks s * batch + begin + b), so the ranks' slices together are exactly the
// batch one process makes.
std::unique_ptr<data::DataLoader<data::Batch>> make_train_loader(const data::ImageDataset& train,
                                                                 const data::Normalization& norm,
                                                                 const data::Augment& augment, int64_t batch,
                                                                 uint64_t seed, int64_t start_step, int prefetch = 2,
                                                                 int shard_rank = 0, int shard_count = 1);

// ---- training and evaluation -------------------------------------------------------------------
// The gradients of one training step on `batch`, no update: model.train(); the logits (B, K);
// loss = cross_entropy(logits, labels, label_smoothing); compute_gradients (zero, then backward
// of loss x loss_scale: Run::loss_scale). Returns the loss. main.cpp's training loop runs it, and
// so do the tests, which then call Run::update or Run::optimizer_step.
double forward_backward(ViT& model, optim::Optimizer& opt, const data::Batch& batch, double label_smoothing,
                        double loss_scale = 1.0);

// ---- the run's defaults and pictures -----------------------------------------------------------
// The defaults that depend on the training set's size, each with the line that says what was
// chosen and why. Under kSmallTrainSet images (apps/common/options.h) the plain defaults
// memorise: the training loss reaches its floor while the validation loss rises. Crops with
// dropout help but need a long schedule (docs/benchmarks.md, "Small data"). So a small set gets at
// most 100 epochs, --crop-pad 2, --dropout 0.1 and --patience 5; an option given on the command
// line wins.
std::vector<std::string> fit_defaults_to_data(RunOptions& o, VitRunConfig& cfg, int64_t n_train);
// <out>/attention.svg: the class token's attention over the first `n` test images; returns its path.
std::string write_attention(ViT& model, const VitData& data, int64_t n, const std::string& dir);
// --diagnose-attention: attention_diagnostics.json for every block on the first `batch` test images.
void diagnose(ViT& model, const VitData& data, int64_t batch, const std::string& dir);
// The options whose values --eval-only takes from the checkpoint, and their keys in vit_config_to_json.
const std::vector<SavedOption>& vit_saved_options();

using EvalResult = ClassifierEval;  // apps/common/evaluate.h
// The model on the first `limit` images of `ds` (0: all), `batch` at a time, in eval mode and
// without recording; the model's mode is restored afterwards. `sharded`: in a data-parallel job
// each rank evaluates its eval_part of the images and every rank returns the whole result (every
// rank must call it; apps/common/run.h evaluate_classifier).
EvalResult evaluate(ViT& model, const data::ImageDataset& ds, const data::Normalization& norm, int64_t batch,
                    int64_t limit = 0, bool sharded = false);

// ---- attention ---------------------------------------------------------------------------------
// From the weights of one block, (B, H, T, T) with T = grid_h * grid_w + 1: for each image b, what
// the class token attends to, averaged over the heads and laid out as the patch grid:
//   grid_b[i * grid_w + j] = (1/H) sum_h weights[b, h, 0, 1 + i * grid_w + j]
// (row 0 is the class token's query; column 0, the class token's own key, is left out).
std::vector<std::vector<double>> class_token_attention(const Tensor& weights, int64_t grid_h, int64_t grid_w);

// Runs the model on images `indices` of `ds` with need_weights, and draws each image with the
// class token's attention in the LAST block over it (svg_image_overlay), titled with the true and
// predicted class, `columns` images per row, in one SVG.
std::string attention_overlay_svg(ViT& model, const data::ImageDataset& ds, const data::Normalization& norm,
                                  std::span<const int64_t> indices, int columns = 2);

}  // namespace ag::apps
