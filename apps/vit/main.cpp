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
// --patience 5 (apps/common/options.h); a flag given on the command line wins.
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
#include <filesystem>

#include <fmt/core.h>

#include "apps/common/app.h"
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
};

// --eval-only: the model and its data as the checkpoint saved them, on the test set.
// given: the config of the command line, for check_eval_only_options
int evaluate_checkpoint(const RunOptions& o, const AppOptions& a, const DiagnoseOptions& dg,
                        const VitRunConfig& given) {
  if (!dist::is_main()) return 0;  // under mpirun rank 0 evaluates alone
  const CheckpointInfo info = read_checkpoint_info(o.checkpoint, "vit");
  check_eval_only_options(o, info.config, vit_config_to_json(given), vit_saved_options(), "vit");
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
  // ---- data: train / validation / test images, and the defaults that depend on their number ----
  const VitData data = load_vit_data(cfg.dataset, o.data_dir, cfg.val_size);
  const data::ImageDataset &train_set = data.splits.train, &val_set = data.val, &test_set = data.splits.test;
  cfg.val_size = val_set.size();
  fit_model_to_data(cfg.model, train_set);
  const std::vector<std::string> chosen = fit_defaults_to_data(o, cfg, train_set.size());
  cfg.model.dropout = o.dropout;

  // ---- model, optimizer, schedule, and the run directory ---------------------------------------
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
  const int64_t grid = cfg.model.image_size / cfg.model.patch, tokens = grid * grid + 1;
  run.print(fmt::format("vit: {} ({} train / {} validation / {} test images of {}x{}x{}), patch {} -> {}x{} grid + "
                        "class token = {} tokens, d_model {}, {} heads, {} layers, MLP {}",
                        cfg.dataset, train_set.size(), val_set.size(), test_set.size(), cfg.model.channels,
                        cfg.model.image_size, cfg.model.image_size, cfg.model.patch, grid, grid, tokens,
                        cfg.model.d_model, cfg.model.n_heads, cfg.model.n_layers, cfg.model.mlp_hidden));
  std::string compute_text;
  const Tensor probe = zeros({o.batch, cfg.model.channels, cfg.model.image_size, cfg.model.image_size});
  const ComputeProfile compute =
      profile_model(model, [&] { return model.forward(probe); }, o.batch, tokens, dg, &compute_text);
  run.print(compute_text);

  // ---- the training loop: the validation images pick the best model; the test set waits -------
  run.evaluate_with([&](int64_t s) {
    if (val_set.size() == 0) return run.log_eval(s, {});
    const EvalResult v = evaluate(model, val_set, data.norm, a.eval_batch, a.eval_limit, /*sharded=*/true);
    run.log_eval(s, {{"val_loss", v.loss}, {"val_accuracy", v.accuracy}});
  });
  int64_t step = run.resume();
  // the global batch of N x --batch images, planned as one process would; this rank makes its slice
  auto loader = make_train_loader(train_set, data.norm, cfg.augment, global_batch(o), o.seed, step, 2,
                                  dist::rank(), dist::world_size());
  for (; step < o.steps && !run.stop_requested(); ++step) {
    schedule->set_lr(opt, step);
    const data::Batch batch = loader->next_step();
    const double loss = forward_backward(model, opt, batch, cfg.label_smoothing, run.loss_scale());
    run.update(step + 1, loss, batch.labels.size(0));  // over the ranks: clip, step, log, save, evaluate
  }
  run.save(step);  // also after Ctrl-C: nothing trained is lost

  // ---- the test set, once, on the model of the best validation accuracy ------------------------
  run.load_best();
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
  App app("vit", "a vision transformer on Fashion-MNIST (default), MNIST or CIFAR-10");
  // The default recipe: 6000 steps (docs/benchmarks.md, "The apps' default runs").
  app.o = {.steps = 6000, .batch = 128, .lr = 2e-3, .warmup = 0.05, .weight_decay = 0.05, .clip = 1.0};
  app.add_run_options();
  VitRunConfig cfg;
  AppOptions a;
  DiagnoseOptions dg;
  add_diagnose_options(app.cli, dg);
  CLI::App& cli = app.cli;
  cli.add_option("--dataset", cfg.dataset, "fashion-mnist, mnist or cifar10 (default --data-dir: " +
                                               default_data_dir("fashion-mnist") + ", data/mnist, data/cifar10)")
      ->check(CLI::IsMember(vit_datasets()));
  cli.add_option("--patch", cfg.model.patch, "patch size in pixels (must divide the image size)")->check(positive());
  cli.add_option("--d-model", cfg.model.d_model, "token width")->check(positive());
  cli.add_option("--heads", cfg.model.n_heads, "attention heads (must divide d-model)")->check(positive());
  cli.add_option("--layers", cfg.model.n_layers, "transformer blocks")->check(positive());
  cli.add_option("--mlp", cfg.model.mlp_hidden, "hidden width of each block's MLP")->check(positive());
  cli.add_option("--label-smoothing", cfg.label_smoothing, "label smoothing of the training loss")
      ->check(CLI::Range(0.0, 0.99));
  cli.add_option("--crop-pad", cfg.augment.pad, "augmentation: random crop after padding this many pixels (0: off)")
      ->check(non_negative());
  cli.add_flag("--flip", cfg.augment.flip, "augmentation: random left-right flips (not for digits)");
  app.add_val_size_option(cfg.val_size, "images");
  cli.add_option("--eval-batch", a.eval_batch, "images per forward pass when evaluating")->check(positive());
  cli.add_option("--eval-limit", a.eval_limit,
                 "evaluate on the first N validation images during training (0: all); the final test uses all")
      ->check(non_negative());
  cli.add_option("--attention-images", a.attention_images, "test images drawn in attention.svg")->check(positive());
  return app.main(
      argc, argv, [&] { validate_vit_config(cfg); },
      [&] { return app.o.eval_only ? evaluate_checkpoint(app.o, a, dg, cfg) : train(app.o, cfg, a, dg); });
}
