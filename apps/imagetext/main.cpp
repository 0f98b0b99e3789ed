// imagetext: cross-attention between two modalities at toy scale. Scenes of 2-4 Fashion-MNIST items
// side by side (or in a 2x2 grid) get captions naming the items in order ("sneaker, bag, dress");
// a ViT encoder reads the scene, a causal decoder writes the caption and looks at the image through
// cross-attention (queries from the text, keys and values from the image patches).
//
// The model (apps/imagetext/model.h ImageText), for a 28 x 112 canvas (layout row, 4 slots), patch 7:
//   images (B, 1, 28, 112) -> 4 x 16 = 64 patches + class token: memory (B, Tk = 65, d)
//   caption tokens (B, T = 5): <bos> w_1 .. w_n <eos> <pad>..   (n = 2..4; T = max items + 1)
//   h = wte(tokens) + wpe                                        (B, T, d)
//   per decoder block: causal self-attention, cross-attention over the memory, MLP (pre-LN)
//     cross-attention weights (B, NH, T, Tk): for each text position, where in the image it looks
//   logits = head(ln_f(h))                                       (B, T, V = 13)
//   loss = mean cross-entropy over the caption's words and its <eos> (teacher forcing)
// Default: d 64, 4 heads, 2 encoder + 2 decoder blocks, MLP 256: 243k parameters.
//
// Data (apps/imagetext/scene.h): every training step composes fresh scenes from the training
// images (a function of --scene-seed and the step: resumable, and the same under mpirun); the
// validation scenes come from --val-images training images held out (-1: 10% of the training set,
// at most 5000), the test scenes only from the test images. Model selection uses the validation
// scenes' exact caption match (best.safetensors); the test scenes are evaluated once, at the end,
// on that model:
//   exact match     greedy captions (each image encoded once, the image keys and values projected
//                   once per decoder block, the text through the self-attention's KV caches),
//                   overall and by item count
//   retrieval       recall@1 and @5, image -> text and text -> image, among --retrieval-candidates
//                   scenes, scored by the caption's log-likelihood (apps/imagetext/lib.h caption_scores)
//   word-to-item    the share of words whose cross-attention mass is highest on the item they name
//   attention.svg   for a few test scenes and each generated word, where the decoder looked
//
// The default run's figures: docs/math/cross-attention.md, "What the trained decoder does". The
// exact match is bounded by recognising each item: with a share a of the words right and
// independent errors, a 3-item caption is all right a^3 of the time, so 90% exact on 3-item scenes
// needs a = 0.9^(1/3) = 96.5% per item, more than apps/vit reaches on single items.
//
// In the run directory (default runs/imagetext): checkpoint.safetensors, best.safetensors,
// metrics.jsonl, TensorBoard events, curves.svg, report.json, attention.svg. --resume continues a
// run, --eval-only [--checkpoint FILE] evaluates a saved model, `mpirun -np N imagetext ...` trains
// data-parallel (a global batch of N x --batch), --device cuda on a GPU build.
#include <limits>

#include <fmt/core.h>

#include "apps/common/app.h"
#include "apps/common/diagnose.h"
#include "apps/common/run.h"
#include "apps/imagetext/lib.h"
#include "optim/adam.h"
#include "training/checkpoint.h"

using namespace ag;
using namespace ag::apps;

namespace {

// --eval-only: the model and its scenes as the checkpoint saved them, on the test scenes.
// given: the config of the command line, for check_eval_only_options
int evaluate_checkpoint(const RunOptions& o, const TestOptions& t, const DiagnoseOptions& dg,
                        const ImageTextRunConfig& given) {
  if (!dist::is_main()) return 0;  // under mpirun rank 0 evaluates alone
  const CheckpointInfo info = read_checkpoint_info(o.checkpoint, "imagetext");
  check_eval_only_options(o, info.config, imagetext_config_to_json(given), imagetext_saved_options(),
                          "imagetext");
  const ImageTextRunConfig cfg = imagetext_config_from_json(info.config);
  const ImageTextData data = load_imagetext_data(o.data_dir, cfg.val_images);
  ImageText model(cfg.model);
  model.to(training_device(o));
  training::load_checkpoint(o.checkpoint, model, nullptr, nullptr);
  fmt::print("imagetext: {} trained {} steps: evaluating on {} test scenes\n", o.checkpoint, info.step,
             cfg.test_scenes);
  const TestFigures f = test_model(model, cfg, data, t, o.out_dir, false);
  fmt::print("{}\n", figures_text(f, cfg.scenes, o.out_dir));
  if (dg.attention) diagnose(model, cfg, data, o.batch, o.out_dir);
  return 0;
}

int train(RunOptions o, ImageTextRunConfig cfg, const TestOptions& t, const DiagnoseOptions& dg) {
  // ---- data: the three scene sources, and the model's size from the scenes ---------------------
  const ImageTextData data = load_imagetext_data(o.data_dir, cfg.val_images);
  cfg.val_images = data.val.size();  // the count held out, saved in the checkpoint
  fit_scenes_to_data(cfg.scenes, data.train, cfg.model.patch);
  fit_model_to_scenes(cfg.model, cfg.scenes);
  cfg.model.dropout = o.dropout;
  const std::vector<Scene> val =
      compose_scenes(data.val, cfg.scenes, cfg.scene_seed, SceneSplit::val, 0, cfg.val_scenes);
  // the training scenes are composed afresh at every step: no small set to memorise
  const std::string patience =
      resolve_patience(o, false, "fresh training scenes are composed at every step, so there is no set to memorise");

  // ---- model, optimizer, schedule, and the run directory ---------------------------------------
  Generator gen(o.seed);
  ImageText model(cfg.model, &gen);  // initialised on the CPU (the same numbers on every device)
  model.to(training_device(o));
  optim::AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  const auto schedule = make_schedule(o);
  nlohmann::json config = imagetext_config_to_json(cfg);
  // what fixes the scenes of each step too, so --resume refuses another global batch
  config["train"] = {{"batch", global_batch(o)}, {"seed", o.seed}};
  Run run("imagetext", o, model, opt, gen, config);
  run.select_by("val_exact_match", true, "val_loss");
  if (!patience.empty()) run.print("imagetext: " + patience);
  const ImageTextConfig& m = cfg.model;
  run.print(fmt::format(
      "imagetext: scenes of {}-{} Fashion-MNIST items ({} layout, {}x{} pixels), training images {} (scenes "
      "composed per step), validation {} scenes of {} held-out images, test {} scenes of {} test images; patch {} "
      "-> {} patches + class token, d_model {}, {} heads, {} encoder + {} decoder blocks, MLP {}",
      cfg.scenes.min_items, cfg.scenes.max_items, cfg.scenes.layout, m.image_h, m.image_w, data.train.size(),
      val.size(), data.val.size(), cfg.test_scenes, data.test.size(), m.patch, m.patches(), m.d_model, m.n_heads,
      m.enc_layers, m.dec_layers, m.mlp_hidden));
  std::string compute_text;
  const SceneBatch probe = train_batch(data, cfg, o.batch, 0).batch;
  const ComputeProfile compute = profile_model(model, [&] { return model.forward(probe.images, probe.input); },
                                               o.batch, m.patches() + 1 + m.max_len, dg, &compute_text);
  run.print(compute_text);

  // ---- the training loop: the validation scenes pick the best model; the test scenes wait ------
  run.evaluate_with([&](int64_t s) {
    const CaptionEval v = evaluate_captions(model, data.val, cfg.scenes, val, data.norm, t.eval_batch, true);
    run.log_eval(s, {{"val_loss", v.loss},
                     {"val_token_accuracy", v.token_accuracy},
                     {"val_exact_match", v.exact_match},
                     {"val_word_accuracy", v.word_accuracy}});
  });
  int64_t step = run.resume();
  for (; step < o.steps && !run.stop_requested(); ++step) {
    schedule->set_lr(opt, step);
    // the global batch of scenes of this step, planned as one process would; this rank's slice
    const TrainBatch b = train_batch(data, cfg, global_batch(o), step, dist::rank(), dist::world_size());
    const double loss = forward_backward(model, opt, b, cfg.label_smoothing, run.loss_scale());
    run.update(step + 1, loss, b.scenes, b.batch.words);  // over the ranks: clip, step, log, save, evaluate
  }
  run.save(step);   // also after Ctrl-C: nothing trained is lost

  // ---- the test scenes, once, on the model of the best validation exact match ------------------
  run.load_best();
  const TestFigures f = test_model(model, cfg, data, t, run.dir(), /*sharded=*/true);
  RunReport report;
  fill_report(report, f, cfg.scenes);
  compute.fill(report);
  run.finish(report);
  if (!dist::is_main()) return 0;
  fmt::print("{}\n({} after {} steps)\n", figures_text(f, cfg.scenes, run.dir()),
             run.best().step >= 0 ? fmt::format("the best model by validation, step {}", run.best().step)
                                  : std::string("the last model"),
             step);
  if (dg.attention) diagnose(model, cfg, data, o.batch, run.dir());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  App app("imagetext",
          "an image-captioning transformer on scenes of Fashion-MNIST items, with image-text retrieval and "
          "cross-attention maps");
  // The default recipe: 6000 steps of 32 fresh scenes (192k scenes, ~580k item views), a few
  // minutes on one core (docs/math/cross-attention.md, "What the trained decoder does").
  app.o = {.steps = 6000, .batch = 32, .lr = 3e-3, .warmup = 0.05, .weight_decay = 0.05, .clip = 1.0};
  app.add_run_options();
  ImageTextRunConfig cfg;
  TestOptions t;
  DiagnoseOptions dg;
  add_diagnose_options(app.cli, dg);
  CLI::App& cli = app.cli;
  cli.add_option("--layout", cfg.scenes.layout, "row (items side by side) or grid (2x2)")
      ->check(CLI::IsMember(scene_layouts()));
  cli.add_option("--min-items", cfg.scenes.min_items, "fewest items in a scene")->check(positive());
  cli.add_option("--max-items", cfg.scenes.max_items, "most items in a scene (row: up to 8, grid: up to 4)")
      ->check(positive());
  cli.add_option("--patch", cfg.model.patch, "patch size in pixels (must divide the 28-pixel items)")
      ->check(positive());
  cli.add_option("--d-model", cfg.model.d_model, "token width")->check(positive());
  cli.add_option("--heads", cfg.model.n_heads, "attention heads (must divide d-model)")->check(positive());
  cli.add_option("--enc-layers", cfg.model.enc_layers, "encoder blocks")->check(positive());
  cli.add_option("--dec-layers", cfg.model.dec_layers, "decoder blocks")->check(positive());
  cli.add_option("--mlp", cfg.model.mlp_hidden, "hidden width of each block's MLP")->check(positive());
  cli.add_option("--label-smoothing", cfg.label_smoothing, "label smoothing of the training loss")
      ->check(CLI::Range(0.0, 0.99));
  cli.add_option("--val-images", cfg.val_images,
                 fmt::format("training images held out as the validation scenes' source (-1: {}% of the training "
                             "set, at most {})",
                             kValPercent, kValCap))
      ->check(CLI::Range(int64_t(-1), std::numeric_limits<int64_t>::max()));
  cli.add_option("--val-scenes", cfg.val_scenes, "validation scenes (model selection)")->check(positive());
  cli.add_option("--test-scenes", cfg.test_scenes, "test scenes, composed from the test images only")
      ->check(positive());
  cli.add_option("--scene-seed", cfg.scene_seed, "seed of the scene compositions (training, validation, test)");
  cli.add_option("--eval-batch", t.eval_batch, "scenes per forward pass when evaluating")->check(positive());
  cli.add_option("--retrieval-candidates", t.retrieval_candidates,
                 "retrieval: each image ranks this many captions and each caption this many images (groups of the "
                 "test scenes)")
      ->check(CLI::Range(int64_t(2), std::numeric_limits<int64_t>::max()));
  cli.add_option("--attention-scenes", t.attention_scenes, "test scenes drawn in attention.svg")->check(positive());
  const auto check_options = [&] {
    validate_imagetext_config(cfg);
    usage_check(t.retrieval_candidates <= cfg.test_scenes,
                "imagetext: --retrieval-candidates {} is more than the --test-scenes {}", t.retrieval_candidates,
                cfg.test_scenes);
  };
  return app.main(argc, argv, check_options,
                  [&] { return app.o.eval_only ? evaluate_checkpoint(app.o, t, dg, cfg) : train(app.o, cfg, t, dg); });
}
