#include "apps/vit/lib.h"

#include <algorithm>
#include <numeric>

#include <fmt/core.h>

#include "apps/common/diagnose.h"
#include "apps/common/plot.h"
#include "apps/common/run.h"
#include "autograd/ops.h"
#include "autograd/tape.h"
#include "core/error.h"
#include "dist/dist.h"
#include "optim/clip.h"

namespace ag::apps {

// ---- the run's config --------------------------------------------------------------------------

nlohmann::json vit_config_to_json(const VitRunConfig& c) {
  const ViTConfig& m = c.model;
  return {{"dataset", c.dataset},       {"image_size", m.image_size}, {"channels", m.channels},
          {"patch", m.patch},           {"classes", m.classes},       {"d_model", m.d_model},
          {"n_heads", m.n_heads},       {"n_layers", m.n_layers},     {"mlp_hidden", m.mlp_hidden},
          {"dropout", m.dropout},       {"label_smoothing", c.label_smoothing},
          {"crop_pad", c.augment.pad},  {"flip", c.augment.flip},       {"val_size", c.val_size}};
}

VitRunConfig vit_config_from_json(const nlohmann::json& j) {
  VitRunConfig c;
  c.dataset = config_value<std::string>(j, "dataset", "vit");
  c.model.image_size = config_value<int64_t>(j, "image_size", "vit");
  c.model.channels = config_value<int64_t>(j, "channels", "vit");
  c.model.patch = config_value<int64_t>(j, "patch", "vit");
  c.model.classes = config_value<int64_t>(j, "classes", "vit");
  c.model.d_model = config_value<int64_t>(j, "d_model", "vit");
  c.model.n_heads = config_value<int64_t>(j, "n_heads", "vit");
  c.model.n_layers = config_value<int64_t>(j, "n_layers", "vit");
  c.model.mlp_hidden = config_value<int64_t>(j, "mlp_hidden", "vit");
  c.model.dropout = config_value<double>(j, "dropout", "vit");
  c.label_smoothing = config_value<double>(j, "label_smoothing", "vit");
  c.augment.pad = config_value<int>(j, "crop_pad", "vit");
  c.augment.flip = config_value<bool>(j, "flip", "vit");
  c.val_size = j.is_object() && j.contains("val_size") ? config_value<int64_t>(j, "val_size", "vit") : 0;
  return c;
}

// ---- data --------------------------------------------------------------------------------------

const std::vector<std::string>& vit_datasets() {
  static const std::vector<std::string> names = {"fashion-mnist", "mnist", "cifar10"};
  return names;
}

std::string default_data_dir(const std::string& dataset) {
  if (dataset == "fashion-mnist") return data::kFashionMnistDir;
  if (dataset == "mnist") return "data/mnist";
  if (dataset == "cifar10") return "data/cifar10";
  throw Error(fmt::format("vit: unknown dataset '{}' (expected fashion-mnist, mnist or cifar10)", dataset));
}

int64_t vit_image_size(const std::string& dataset) {
  default_data_dir(dataset);  // raises the unknown-dataset error
  return dataset == "cifar10" ? 32 : 28;
}

void validate_vit_config(const VitRunConfig& c) {
  const ViTConfig& m = c.model;
  usage_check(m.patch >= 1 && m.d_model >= 1 && m.n_heads >= 1 && m.n_layers >= 1 && m.mlp_hidden >= 1,
              "vit: --patch {}, --d-model {}, --heads {}, --layers {}, --mlp {}: every size must be at least 1",
              m.patch, m.d_model, m.n_heads, m.n_layers, m.mlp_hidden);
  usage_check(m.d_model % m.n_heads == 0, "vit: --heads {} does not divide --d-model {} (each head gets d-model/heads)",
              m.n_heads, m.d_model);
  const int64_t S = vit_image_size(c.dataset);
  usage_check(S % m.patch == 0, "vit: --patch {} does not divide the {}x{} images of {} (try a divisor of {})",
              m.patch, S, S, c.dataset, S);
  usage_check(c.augment.pad >= 0 && c.augment.pad < S, "vit: --crop-pad {}: expected 0 <= pad < the image size {}",
              c.augment.pad, S);
  usage_check(c.label_smoothing >= 0 && c.label_smoothing < 1, "vit: --label-smoothing {}: expected a value in [0, 1)",
              c.label_smoothing);
}

VitData load_vit_data(const std::string& dataset, const std::string& dir, int64_t val_size) {
  const std::string d = dir.empty() ? default_data_dir(dataset) : dir;
  VitData v;
  if (dataset == "fashion-mnist")
    v.splits = data::load_fashion_mnist(d);
  else if (dataset == "mnist")
    v.splits = data::load_mnist(d);
  else if (dataset == "cifar10")
    v.splits = data::load_cifar10(d);
  else
    default_data_dir(dataset);  // raises the unknown-dataset error
  val_size = validation_size(val_size, v.splits.train.size());
  if (val_size > 0) {
    data::HeldOut h = data::hold_out(v.splits.train, val_size, 20201108);  // fixed: the same split every run
    v.splits.train = std::move(h.rest);
    v.val = std::move(h.held);
  }
  // The training set's own statistics (for the real datasets these are the published constants
  // up to rounding); the validation and test sets are normalised with the same numbers.
  v.norm = data::channel_stats(v.splits.train);
  return v;
}

void fit_model_to_data(ViTConfig& model, const data::ImageDataset& ds) {
  check(ds.height == ds.width, "vit: images of {}x{} pixels are not square", ds.height, ds.width);
  model.image_size = ds.height;
  model.channels = ds.channels;
  model.classes = ds.num_classes;
}

std::unique_ptr<data::DataLoader<data::Batch>> make_train_loader(const data::ImageDataset& train,
                                                                 const data::Normalization& norm,
                                                                 const data::Augment& augment, int64_t batch,
                                                                 uint64_t seed, int64_t start_step, int prefetch,
                                                                 int shard_rank, int shard_count) {
  check(batch >= 1 && batch <= train.size(), "vit: batch {} must be in [1, {}] (the training set's size)", batch,
        train.size());
  data::LoaderOptions lo;
  lo.batch_size = batch;
  lo.seed = seed;
  lo.drop_last = true;  // every step sees a full batch
  lo.prefetch = prefetch;
  lo.shard_rank = shard_rank, lo.shard_count = shard_count;
  // the augmentation draws of each step's batch, this rank's images' part of them (data::StepDraws)
  auto make = [&train, norm, augment,
               draws = data::StepDraws(seed + 1, batch, data::shard(batch, shard_rank, shard_count).begin,
                                       start_step)](std::span<const int64_t> indices) mutable {
    Generator gen = draws.next();
    return data::make_batch(train, indices, norm, augment, &gen);
  };
  auto loader = std::make_unique<data::DataLoader<data::Batch>>(train.size(), lo, make);
  loader->seek(start_step);
  return loader;
}

// ---- training and evaluation -------------------------------------------------------------------

double forward_backward(ViT& model, optim::Optimizer& opt, const data::Batch& batch, double label_smoothing,
                        double loss_scale) {
  model.train();
  const Tensor logits = model.forward(batch.images);  // (B, K)
  const Tensor loss = cross_entropy(logits, batch.labels.to(logits.device()), "mean", -100, label_smoothing);
  return compute_gradients(opt, loss, loss_scale);
}

EvalResult evaluate(ViT& model, const data::ImageDataset& ds, const data::Normalization& norm, int64_t batch,
                    int64_t limit, bool sharded) {
  check(batch >= 1, "vit: evaluation batch must be >= 1, got {}", batch);
  const int64_t n = limit > 0 ? std::min(limit, ds.size()) : ds.size();
  check(n >= 1, "vit: nothing to evaluate: the dataset is empty");
  ConfusionMatrix cm = int64_t(ds.class_names.size()) == ds.num_classes ? ConfusionMatrix(ds.class_names)
                                                                         : ConfusionMatrix(ds.num_classes);
  return evaluate_classifier(model, n, batch, sharded, std::move(cm), [&](std::span<const int64_t> indices) {
    const data::Batch b = data::make_batch(ds, indices, norm);
    return std::pair{model.forward(b.images), b.labels};
  });
}

// ---- attention ---------------------------------------------------------------------------------

std::vector<std::vector<double>> class_token_attention(const Tensor& weights, int64_t grid_h, int64_t grid_w) {
  const int64_t N = grid_h * grid_w;
  check(grid_h >= 1 && grid_w >= 1 && weights.ndim() == 4 && weights.size(2) == N + 1 && weights.size(3) == N + 1,
        "vit: expected attention weights (B, H, {}, {}) for a {}x{} patch grid and the class token, got {}", N + 1,
        N + 1, grid_h, grid_w, weights.shape());
  NoGradGuard no_grad;
  // (B, H, T, T) -> row 0, the class token's query: (B, H, T) -> keys 1..N: (B, H, N) -> mean over H
  Tensor cls = mean(weights.select(2, 0).narrow(2, 1, N), {1});  // (B, N)
  const std::vector<double> v = cls.to(DType::f64).to_vector<double>();
  std::vector<std::vector<double>> grids;
  for (int64_t b = 0; b < cls.size(0); ++b) grids.emplace_back(v.begin() + b * N, v.begin() + (b + 1) * N);
  return grids;
}

namespace {

std::string class_name(const data::ImageDataset& ds, int64_t c) {
  return c >= 0 && c < int64_t(ds.class_names.size()) ? ds.class_names[size_t(c)] : std::to_string(c);
}

}  // namespace

std::string attention_overlay_svg(ViT& model, const data::ImageDataset& ds, const data::Normalization& norm,
                                  std::span<const int64_t> indices, int columns) {
  check(!indices.empty() && columns >= 1, "vit: attention overlay needs images and columns >= 1, got {} and {}",
        indices.size(), columns);
  const bool was_training = model.is_training();
  model.eval();
  model.need_weights = true;
  NoGradGuard no_grad;
  data::Batch b = data::make_batch(ds, indices, norm);
  Tensor probs = softmax(model.forward(b.images), 1);  // (B, K)
  model.need_weights = false;
  model.train(was_training);
  const int64_t G = model.cfg.image_size / model.cfg.patch;
  const auto grids = class_token_attention((*model.blocks)[model.blocks->size() - 1].attn_weights, G, G);
  for (const auto& block : *model.blocks) block->attn_weights = Tensor();  // (B, H, T, T) each: free them

  const std::vector<int64_t> pred = argmax(probs, 1).to_vector<int64_t>();
  const std::vector<float> p = probs.to_vector<float>();
  const int64_t K = probs.size(1);
  std::vector<std::string> parts;
  for (size_t k = 0; k < indices.size(); ++k) {
    const int64_t i = indices[k], truth = ds.labels[size_t(i)];
    OverlayOptions o;
    o.title = fmt::format("#{} {}: predicted {} ({:.0f}%)", i, class_name(ds, truth), class_name(ds, pred[k]),
                          100.0 * p[k * size_t(K) + size_t(pred[k])]);
    o.scale = ds.height <= 32 ? 8 : 2;
    parts.push_back(svg_image_overlay(image_from_u8(ds.image(i), ds.channels, ds.height, ds.width), grids[k],
                                      int(G), int(G), o));
  }
  return svg_grid(parts, columns);
}

// ---- the run's defaults and pictures -----------------------------------------------------------

std::vector<std::string> fit_defaults_to_data(RunOptions& o, VitRunConfig& cfg, int64_t n_train) {
  std::vector<std::string> lines;
  const bool small = n_train < kSmallTrainSet;
  const std::string size = fmt::format("{} training images{}", n_train,
                                       small ? fmt::format(" (< {}: a small set)", kSmallTrainSet) : "");
  if (small && !was_given(o, "--steps")) {
    // with the crops and dropout below a small set still gains up to about 100 epochs; past that
    // it only memorises (and early stopping ends the run sooner when validation stops improving)
    const int64_t epochs100 = (100 * n_train + o.batch - 1) / o.batch;
    if (epochs100 < o.steps) {
      lines.push_back(fmt::format("--steps {}: 100 epochs of {} at batch {} (the default {} would be {:.0f} epochs)",
                                  epochs100, size, o.batch, o.steps, double(o.steps) * o.batch / n_train));
      set_steps(o, epochs100);
    }
  }
  if (small && !was_given(o, "--crop-pad") && cfg.augment.pad == 0) {
    cfg.augment.pad = 2;
    lines.push_back(fmt::format("--crop-pad 2: {}: random crops against memorising (--crop-pad 0: off)", size));
  }
  if (small && !was_given(o, "--dropout") && o.dropout == 0) {
    o.dropout = 0.1;
    lines.push_back(fmt::format("--dropout 0.1: {}: dropout against memorising (--dropout 0: off)", size));
  }
  if (const std::string p = resolve_patience(o, small, size); !p.empty()) lines.push_back(p);
  return lines;
}

namespace {

// the first n test images (at least one, at most the whole test set)
std::vector<int64_t> first_test_images(const VitData& data, int64_t n) {
  std::vector<int64_t> indices(size_t(std::clamp<int64_t>(n, 1, data.splits.test.size())));
  std::iota(indices.begin(), indices.end(), int64_t(0));
  return indices;
}

}  // namespace

std::string write_attention(ViT& model, const VitData& data, int64_t n, const std::string& dir) {
  const std::string path = dir + "/attention.svg";
  write_file_atomic(path, attention_overlay_svg(model, data.splits.test, data.norm, first_test_images(data, n), 4));
  return path;
}

void diagnose(ViT& model, const VitData& data, int64_t batch, const std::string& dir) {
  const std::vector<int64_t> indices = first_test_images(data, batch);
  const data::Batch b = data::make_batch(data.splits.test, indices, data.norm);
  std::string path;
  const nn::AttentionReport r = write_attention_diagnostics(model, [&] { model.forward(b.images); }, dir, &path);
  fmt::print("attention diagnostics on {} test images:\n{}written to {}\n", indices.size(), r.to_text(), path);
}

const std::vector<SavedOption>& vit_saved_options() {
  static const std::vector<SavedOption> options = {{"--dataset", "/dataset"}, {"--patch", "/patch"},
                                                   {"--d-model", "/d_model"}, {"--heads", "/n_heads"},
                                                   {"--layers", "/n_layers"}, {"--mlp", "/mlp_hidden"}};
  return options;
}

}  // namespace ag::apps
