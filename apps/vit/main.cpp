// vit: a vision transformer learns Fashion-MNIST (or MNIST, or CIFAR-10) on the CPU in minutes,
// then reports the test accuracy with a confusion matrix and draws where its class token looks.
//
// The model (apps/vit/model.h ViT), for an S x S image of C channels, patch P, G = S / P:
//   x (B, C, S, S) -> cut into N = G*G patches of P*P*C pixels, each linearly projected to d:
//                     patches (B, N, d)                 (patch.proj: a P x P convolution, stride P)
//   h0 = [cls | patches] + pos_embed                    (B, T = N + 1, d); cls (1, 1, d) and
//                                                        pos_embed (1, T, d) are learned
//   h = h + attn(ln1(h));  h = h + mlp(ln2(h))          n_layers pre-LN blocks, n_heads heads,
//                                                        MLP d -> mlp_hidden -> d with GELU
//   logits = head(norm(h[:, 0]))                        (B, K): only the class token's state
//   loss = cross_entropy(logits, labels, label_smoothing)
// Default (28x28 Fashion-MNIST): P 7, G 4, T 17 tokens, d 64, 4 heads, 4 layers, MLP 256:
// 205k parameters. Trained with AdamW (lr 2e-3, weight decay 0.05), 5% linear warmup then cosine
// to zero, gradient clip 1.0, batch 128.
//
// The default run's accuracy: docs/benchmarks.md, "The apps' default runs".
// For a higher accuracy: the finer patch grid (49 patches + the class token = 50 tokens, more CPU
// time per step) with crop and flip augmentation, for about 64 epochs:
//   vit --patch 4 --crop-pad 2 --flip --steps 30000 --eval-every 3000 --out runs/vit-long
// Augmentation slows the early epochs and pays off only over long runs.
//
// Model selection: --val-size training images (10%, at most 5000) are held out; the evaluations
// during training run on them, best.safetensors keeps the model of the best validation accuracy,
// and the test set is evaluated once, at the end, on that model. Under 20,000 training images the
// defaults change (each said in one line): at most 100 epochs, --crop-pad 2, --dropout 0.1 and
// --patience 5 (apps/common/run.h); a flag given on the command line wins.
//
// In the run directory (default runs/vit): checkpoint.safetensors, best.safetensors, metrics.jsonl, TensorBoard
// events, curves.svg, report.json and attention.svg (the class token's attention in the last
// block, averaged over heads, over a few test images). Resume with --resume (--stop-at K stops
// after step K as Ctrl-C would); evaluate a saved model with --eval-only [--checkpoint FILE].
// --diagnose-attention adds attention_diagnostics.json: entropy, diagonal mass and head similarity
// per block and head on one test batch, with warnings (apps/common/diagnose.h); the report ends
// with forward FLOPs and MFU (--model-report prints the per-layer table at start).
//
// Data parallel: `mpirun -np N vit ...` trains on N processes, --batch images each (a global batch
// of N x --batch, the batches `vit --batch N*B` would see, augmentation included), gradients averaged
// during backward; rank 0 writes the run directory (apps/common/run.h, docs/distributed.md).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include <fmt/core.h>

#include "apps/common/diagnose.h"
#include "apps/common/run.h"
#include "apps/vit/lib.h"
#include "optim/adam.h"
#include "training/checkpoint.h"

using namespace ag;
using namespace ag::apps;

namespace {

struct AppOptions {
  int64_t eval_batch = 500;      // images per forward pass when evaluating
  int64_t eval_limit = 0;        // intermediate evaluations on the first this many validation images (0: all)
  int64_t attention_images = 8;  // images in attention.svg
  // which of the options that the data-size defaults set were given on the command line (those win)
  bool steps_given = false, dropout_given = false, crop_given = false;
};

// Below kSmallTrainSet (apps/common/run.h) the defaults change, each printed with its reason: on a
// few thousand images the plain defaults memorise (the training loss at its floor, the validation
// loss rising), and crops with dropout help but need a long schedule (docs/benchmarks.md, "Small
// data"), so the cap is 100 epochs and patience ends a run sooner when validation stops improving.

// The defaults that depend on the data: one line each for what was chosen and why.
std::vector<std::string> fit_defaults_to_data(RunOptions& o, VitRunConfig& cfg, const AppOptions& a, int64_t n_train) {
  std::vector<std::string> lines;
  const bool small = n_train < kSmallTrainSet;
  const std::string size = fmt::format("{} training images{}", n_train,
                                       small ? fmt::format(" (< {}: a small set)", kSmallTrainSet) : "");
  if (small && !a.steps_given) {
    // 100 epochs at most: with the crops and dropout below a small set still gains up to about
    // 100 epochs, past that it only memorises (and early stopping ends the run sooner when
    // validation stops improving)
    const int64_t epochs100 = (100 * n_train + o.batch - 1) / o.batch;
    if (epochs100 < o.steps) {
      lines.push_back(fmt::format("--steps {}: 100 epochs of {} at batch {} (the default {} would be {:.0f} epochs)",
                                  epochs100, size, o.batch, o.steps, double(o.steps) * o.batch / n_train));
      set_steps(o, epochs100);
    }
  }
  if (small && !a.crop_given && cfg.augment.pad == 0) {
    cfg.augment.pad = 2;
    lines.push_back(fmt::format("--crop-pad 2: {}: random crops against memorising (--crop-pad 0: off)", size));
  }
  if (small && !a.dropout_given && o.dropout == 0) {
    o.dropout = 0.1;
    lines.push_back(fmt::format("--dropout 0.1: {}: dropout against memorising (--dropout 0: off)", size));
  }
  if (const std::string p = resolve_patience(o, small, size); !p.empty()) lines.push_back(p);
  return lines;
}

// <out>/attention.svg for the first `n` test images; returns its path.
std::string write_attention(ViT& model, const VitData& data, int64_t n, const std::string& dir) {
  std::vector<int64_t> indices(size_t(std::clamp<int64_t>(n, 1, data.splits.test.size())));
  std::iota(indices.begin(), indices.end(), int64_t(0));
  const std::string path = dir + "/attention.svg";
  write_file_atomic(path, attention_overlay_svg(model, data.splits.test, data.norm, indices, 4));
  return path;
}

// --diagnose-attention: the attention of every block on the first `batch` test images.
void diagnose(ViT& model, const VitData& data, int64_t batch, const std::string& dir) {
  std::vector<int64_t> indices(size_t(std::clamp<int64_t>(batch, 1, data.splits.test.size())));
  std::iota(indices.begin(), indices.end(), int64_t(0));
  const data::Batch b = data::make_batch(data.splits.test, indices, data.norm);
  std::string path;
  const nn::AttentionReport r = write_attention_diagnostics(model, [&] { model.forward(b.images); }, dir, &path);
  fmt::print("attention diagnostics on {} test images:\n{}written to {}\n", indices.size(), r.to_text(), path);
}

// The options whose values --eval-only takes from the checkpoint, and their keys in vit_config_to_json.
const std::vector<SavedOption>& saved_options() {
  static const std::vector<SavedOption> options = {{"--dataset", "/dataset"}, {"--patch", "/patch"},
                                                   {"--d-model", "/d_model"}, {"--heads", "/n_heads"},
                                                   {"--layers", "/n_layers"}, {"--mlp", "/mlp_hidden"}};
  return options;
}

// given: the config of the command line, for check_eval_only_options
int evaluate_checkpoint(const RunOptions& o, const AppOptions& a, const DiagnoseOptions& dg,
                        const VitRunConfig& given) {
  if (!dist::is_main()) return 0;  // under mpirun rank 0 evaluates alone
  const CheckpointInfo info = read_checkpoint_info(o.checkpoint);
  check_eval_only_options(o, info.config, vit_config_to_json(given), saved_options(), "vit");
  const VitRunConfig cfg = vit_config_from_json(info.config);
  const VitData data = load_vit_data(cfg.dataset, o.data_dir);
  ViT model(cfg.model);
  model.to(training_device(o));  // --device: the checkpoint's tensors are copied there
  training::load_checkpoint(o.checkpoint, model, nullptr, nullptr);
  fmt::print("vit: {} trained {} steps on {}: evaluating on its {} test images\n", o.checkpoint, info.step,
             cfg.dataset, data.splits.test.size());
  const EvalResult r = evaluate(model, data.splits.test, data.norm, a.eval_batch);
  fmt::print("{}\ntest accuracy {:.2f}%  test loss {:.4f}\n", r.confusion->to_text(), 100 * r.accuracy, r.loss);
  std::filesystem::create_directories(o.out_dir);
  fmt::print("attention of the class token: {}\n", write_attention(model, data, a.attention_images, o.out_dir));
  if (dg.attention) diagnose(model, data, o.batch, o.out_dir);
  return 0;
}

int train(RunOptions o, VitRunConfig cfg, const AppOptions& a, const DiagnoseOptions& dg) {
  const VitData data = load_vit_data(cfg.dataset, o.data_dir, cfg.val_size);
  const data::ImageDataset &train_set = data.splits.train, &val_set = data.val, &test_set = data.splits.test;
  cfg.val_size = val_set.size();
  fit_model_to_data(cfg.model, train_set);
  const std::vector<std::string> chosen = fit_defaults_to_data(o, cfg, a, train_set.size());
  cfg.model.dropout = o.dropout;

  Generator gen(o.seed);
  ViT model(cfg.model, &gen);  // initialised on the CPU (the same numbers on every device)
  model.to(training_device(o));  // --device; the optimizer's state is made beside each parameter
  optim::AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  const auto schedule = make_schedule(o);
  nlohmann::json config = vit_config_to_json(cfg);
  // what fixes the batches too, so --resume refuses another global batch (N x --batch under mpirun)
  config["train"] = {{"batch", global_batch(o)}, {"seed", o.seed}};
  Run run("vit", o, model, opt, gen, config);
  run.select_by("val_accuracy", true, "val_loss");
  for (const std::string& line : chosen) run.print("vit: " + line);
  const int64_t grid = cfg.model.image_size / cfg.model.patch;
  run.print(fmt::format("vit: {} ({} train / {} validation / {} test images of {}x{}x{}), patch {} -> {}x{} grid + "
                        "class token = {} tokens, d_model {}, {} heads, {} layers, MLP {}",
                        cfg.dataset, train_set.size(), val_set.size(), test_set.size(), cfg.model.channels,
                        cfg.model.image_size,
                        cfg.model.image_size, cfg.model.patch, grid, grid, grid * grid + 1, cfg.model.d_model,
                        cfg.model.n_heads, cfg.model.n_layers, cfg.model.mlp_hidden));
  std::string compute_text;
  const Tensor probe = zeros({o.batch, cfg.model.channels, cfg.model.image_size, cfg.model.image_size});
  const ComputeProfile compute =
      profile_model(model, [&] { return model.forward(probe); }, o.batch, grid * grid + 1, dg, &compute_text);
  run.print(compute_text);

  run.evaluate_with([&](int64_t s) {  // on the validation images: the test set waits for the end
    if (val_set.size() > 0) {
      const EvalResult v = evaluate(model, val_set, data.norm, a.eval_batch, a.eval_limit, /*sharded=*/true);
      run.log_eval(s, {{"val_loss", v.loss}, {"val_accuracy", v.accuracy}});
    } else {
      run.log_eval(s, {});
    }
  });
  int64_t step = run.resume();
  // the global batch of N x --batch images, planned as one process would; this rank makes its slice
  auto loader = make_train_loader(train_set, data.norm, cfg.augment, global_batch(o), o.seed, step, 2,
                                  dist::rank(), dist::world_size());
  for (; step < o.steps && !run.stop_requested(); ++step) {
    schedule->set_lr(opt, step);
    const data::Batch batch = loader->next_step();
    double loss = 0;
    {  // the gradients of the batch; its logits and loss are freed at the brace, before update and evaluation
      const Tensor logits = model.forward(batch.images);  // (B, K)
      const Tensor mean_loss =
          cross_entropy(logits, batch.labels.to(logits.device()), "mean", -100, cfg.label_smoothing);
      opt.zero_grad();
      (run.loss_scale() == 1.0 ? mean_loss : mul(mean_loss, run.loss_scale())).backward();  // fp16: scaled
      loss = mean_loss.item<double>();
    }
    const Run::StepTotals t = run.reduce_step(loss, batch.labels.size(0));  // over the ranks
    run.optimizer_step(step + 1, t.loss);  // clip, and a non-finite loss or norm skips the update
    run.step_done(step + 1, t.loss, t.samples);
    run.end_step(step + 1);  // saves, then evaluates: a crash in the evaluation loses nothing
  }
  run.save(step);  // also after Ctrl-C: nothing trained is lost
  run.load_best();  // the model of the best validation accuracy, when there was a validation split
  const EvalResult last = evaluate(model, test_set, data.norm, a.eval_batch, 0, /*sharded=*/true);

  RunReport report;
  report.accuracy = last.accuracy;
  report.confusion = last.confusion;
  report.extra = {{"test_loss", last.loss}, {"test_images", double(last.samples)}};
  compute.fill(report);
  run.finish(report);
  if (!dist::is_main()) return 0;  // the plots are rank 0's
  fmt::print("attention of the class token: {}\n", write_attention(model, data, a.attention_images, run.dir()));
  fmt::print("test accuracy {:.2f}% ({} after {} steps)\n", 100 * last.accuracy,
             run.best().step >= 0 ? fmt::format("the best model by validation, step {}", run.best().step)
                                  : std::string("the last model"),
             step);
  if (dg.attention) diagnose(model, data, o.batch, run.dir());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"vit: a vision transformer on Fashion-MNIST (default), MNIST or CIFAR-10"};
  RunOptions o;
  // The default recipe: 6000 steps (docs/benchmarks.md, "The apps' default runs").
  o.steps = 6000;
  o.batch = 128;
  o.lr = 2e-3;
  o.weight_decay = 0.05;
  o.warmup = 0.05;
  o.clip = 1.0;
  VitRunConfig cfg;
  AppOptions a;
  DiagnoseOptions dg;
  add_run_options(cli, o);
  add_diagnose_options(cli, dg);
  cli.add_option("--dataset", cfg.dataset, "fashion-mnist, mnist or cifar10 (default --data-dir: " +
                                               default_data_dir("fashion-mnist") + ", data/mnist, data/cifar10)")
      ->capture_default_str()
      ->check(CLI::IsMember(vit_datasets()));
  cli.add_option("--patch", cfg.model.patch, "patch size in pixels (must divide the image size)")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--d-model", cfg.model.d_model, "token width")->capture_default_str()->check(positive());
  cli.add_option("--heads", cfg.model.n_heads, "attention heads (must divide d-model)")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--layers", cfg.model.n_layers, "transformer blocks")->capture_default_str()->check(positive());
  cli.add_option("--mlp", cfg.model.mlp_hidden, "hidden width of each block's MLP")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--label-smoothing", cfg.label_smoothing, "label smoothing of the training loss")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  cli.add_option("--crop-pad", cfg.augment.pad, "augmentation: random crop after padding this many pixels (0: off)")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_flag("--flip", cfg.augment.flip, "augmentation: random left-right flips (not for digits)");
  cli.add_option("--val-size", cfg.val_size,
                 "training images held out for validation, which picks the best model (best.safetensors) and "
                 "stops early (--patience); the test set is evaluated once, at the end, on that model (-1: 10% "
                 "of the training set, at most 5000; 0: none, the last model is tested)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(-1), std::numeric_limits<int64_t>::max()));
  cli.add_option("--eval-batch", a.eval_batch, "images per forward pass when evaluating")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--eval-limit", a.eval_limit,
                 "evaluate on the first N validation images during training (0: all); the final test uses all")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--attention-images", a.attention_images, "test images drawn in attention.svg")
      ->capture_default_str()
      ->check(positive());
  if (const int rc = apps::parse_command_line(cli, argc, argv, "vit"); rc >= 0) return rc;
  o.command_line.assign(argv, argv + argc);
  o.given = given_options(cli);
  a.steps_given = cli.count("--steps") > 0, a.dropout_given = cli.count("--dropout") > 0;
  a.crop_given = cli.count("--crop-pad") > 0;

  try {  // every option is checked before any data is read
    apply_run_options(o, "vit");
    validate_vit_config(cfg);
  } catch (const UsageError& e) {
    apps::print_usage_error("vit", e.what());
    return kExitUsage;
  }
  try {
    return o.eval_only ? evaluate_checkpoint(o, a, dg, cfg) : train(o, cfg, a, dg);
  } catch (const UsageError& e) {  // an option --eval-only would ignore
    apps::print_usage_error("vit", e.what());
    return kExitUsage;
  } catch (const data::DatasetNotFound& e) {
    apps::print_error("vit", e.what());
    return apps::error_exit(kExitNoData);
  } catch (const Error& e) {
    apps::print_error("vit", e.what());
    return apps::error_exit(kExitError);
  }
}
