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
// validation scenes come from --val-images training images held out, the test scenes only from the
// test images. Model selection uses the validation scenes' exact caption match (best.safetensors);
// the test scenes are evaluated once, at the end, on that model:
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
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/core.h>

#include "apps/common/diagnose.h"
#include "apps/common/run.h"
#include "apps/imagetext/lib.h"
#include "optim/adam.h"
#include "training/checkpoint.h"

using namespace ag;
using namespace ag::apps;

namespace {

struct AppOptions {
  int64_t eval_batch = 250;             // scenes per forward when evaluating
  int64_t retrieval_candidates = 100;   // N: each query ranks N candidates
  int64_t attention_scenes = 2;         // test scenes drawn in attention.svg (each ~0.25 MB per word)
};

// What the test scenes show about a model, printed and added to the report.
struct TestFigures {
  CaptionEval captions;
  RetrievalResult retrieval;
  WordItemShare share;
};

TestFigures test_model(ImageText& model, const ImageTextRunConfig& cfg, const ImageTextData& data,
                       const AppOptions& a, const std::string& dir, bool sharded) {
  const std::vector<Scene> test =
      compose_scenes(data.test, cfg.scenes, cfg.scene_seed, SceneSplit::test, 0, cfg.test_scenes);
  TestFigures f;
  f.captions = evaluate_captions(model, data.test, cfg.scenes, test, data.norm, a.eval_batch, sharded);
  if (!dist::is_main()) return f;  // the rest is rank 0's (no collectives)
  f.retrieval = retrieval(model, data.test, cfg.scenes, test, data.norm,
                          std::min<int64_t>(a.retrieval_candidates, int64_t(test.size())));
  f.share = word_item_share(model, data.test, cfg.scenes, test, data.norm, a.eval_batch);
  std::filesystem::create_directories(dir);
  const std::vector<Scene> drawn(test.begin(), test.begin() + std::min<int64_t>(a.attention_scenes, int64_t(test.size())));
  write_file_atomic(dir + "/attention.svg", attention_svg(model, data.test, cfg.scenes, drawn, data.norm));
  return f;
}

std::string figures_text(const TestFigures& f, const SceneConfig& sc, const std::string& dir) {
  std::string by;
  for (int64_t n = sc.min_items; n <= sc.max_items; ++n)
    by += fmt::format("{}{} items {:.1f}% ({})", by.empty() ? "" : ", ", n, 100 * f.captions.exact_match_of(n),
                      f.captions.scenes_by_items[size_t(n)]);
  std::string blocks;
  for (size_t l = 0; l < f.share.per_block.size(); ++l)
    blocks += fmt::format("{}block {} {:.1f}%", l ? ", " : "", l, 100 * f.share.per_block[l]);
  return fmt::format(
      "test scenes: {}\n"
      "  exact caption match {:.2f}% ({}); word accuracy {:.2f}%; token accuracy {:.2f}%; loss {:.4f}\n"
      "  retrieval among {} candidates, by caption log-likelihood: image->text R@1 {:.2f}% R@5 {:.2f}%, "
      "text->image R@1 {:.2f}% R@5 {:.2f}%\n"
      "  word-to-item cross-attention: {:.1f}% of {} words look most at the item they name (chance {:.1f}%; "
      "{}; class token mass {:.2f})\n"
      "  attention maps: {}/attention.svg",
      f.captions.scenes, 100 * f.captions.exact_match, by, 100 * f.captions.word_accuracy,
      100 * f.captions.token_accuracy, f.captions.loss, f.retrieval.candidates, 100 * f.retrieval.i2t_r1,
      100 * f.retrieval.i2t_r5, 100 * f.retrieval.t2i_r1, 100 * f.retrieval.t2i_r5, 100 * f.share.share,
      f.share.words, 100 * f.share.chance, blocks, f.share.cls_mass, dir);
}

void fill_report(RunReport& report, const TestFigures& f, const SceneConfig& sc) {
  report.accuracy = f.captions.exact_match;
  report.extra = {{"test_exact_match", f.captions.exact_match},
                  {"test_word_accuracy", f.captions.word_accuracy},
                  {"test_token_accuracy", f.captions.token_accuracy},
                  {"test_loss", f.captions.loss},
                  {"test_scenes", double(f.captions.scenes)}};
  for (int64_t n = sc.min_items; n <= sc.max_items; ++n)
    report.extra.emplace_back(fmt::format("test_exact_match_{}_items", n), f.captions.exact_match_of(n));
  if (!dist::is_main()) return;
  report.extra.insert(report.extra.end(), {{"retrieval_candidates", double(f.retrieval.candidates)},
                                           {"image_to_text_r1", f.retrieval.i2t_r1},
                                           {"image_to_text_r5", f.retrieval.i2t_r5},
                                           {"text_to_image_r1", f.retrieval.t2i_r1},
                                           {"text_to_image_r5", f.retrieval.t2i_r5},
                                           {"word_item_share", f.share.share},
                                           {"word_item_share_chance", f.share.chance},
                                           {"cross_attention_class_token_mass", f.share.cls_mass}});
  for (size_t l = 0; l < f.share.per_block.size(); ++l)
    report.extra.emplace_back(fmt::format("word_item_share_block_{}", l), f.share.per_block[l]);
}

// --diagnose-attention: every attention of the model on the first --batch test scenes.
void diagnose(ImageText& model, const ImageTextRunConfig& cfg, const ImageTextData& data, int64_t batch,
              const std::string& dir) {
  const std::vector<Scene> scenes = compose_scenes(data.test, cfg.scenes, cfg.scene_seed, SceneSplit::test, 0,
                                                   std::min<int64_t>(batch, cfg.test_scenes));
  const SceneBatch b = make_scene_batch(data.test, cfg.scenes, scenes, data.norm);
  std::string path;
  const nn::AttentionReport r =
      write_attention_diagnostics(model, [&] { model.forward(b.images, b.input); }, dir, &path);
  fmt::print("attention diagnostics on {} test scenes:\n{}written to {}\n", scenes.size(), r.to_text(), path);
}

// The options whose values --eval-only takes from the checkpoint, and their keys in
// imagetext_config_to_json.
const std::vector<SavedOption>& saved_options() {
  static const std::vector<SavedOption> options = {
      {"--layout", "/layout"},         {"--min-items", "/min_items"},     {"--max-items", "/max_items"},
      {"--patch", "/patch"},           {"--d-model", "/d_model"},         {"--heads", "/n_heads"},
      {"--enc-layers", "/enc_layers"}, {"--dec-layers", "/dec_layers"},   {"--mlp", "/mlp_hidden"},
      {"--val-images", "/val_images"}, {"--val-scenes", "/val_scenes"},   {"--test-scenes", "/test_scenes"},
      {"--scene-seed", "/scene_seed"}};
  return options;
}

// given: the config of the command line, for check_eval_only_options
int evaluate_checkpoint(const RunOptions& o, const AppOptions& a, const DiagnoseOptions& dg,
                        const ImageTextRunConfig& given) {
  if (!dist::is_main()) return 0;  // under mpirun rank 0 evaluates alone
  const CheckpointInfo info = read_checkpoint_info(o.checkpoint);
  check_eval_only_options(o, info.config, imagetext_config_to_json(given), saved_options(), "imagetext");
  const ImageTextRunConfig cfg = imagetext_config_from_json(info.config);
  const ImageTextData data = load_imagetext_data(o.data_dir, cfg.val_images);
  ImageText model(cfg.model);
  model.to(training_device(o));
  training::load_checkpoint(o.checkpoint, model, nullptr, nullptr);
  fmt::print("imagetext: {} trained {} steps: evaluating on {} test scenes\n", o.checkpoint, info.step,
             cfg.test_scenes);
  const TestFigures f = test_model(model, cfg, data, a, o.out_dir, false);
  fmt::print("{}\n", figures_text(f, cfg.scenes, o.out_dir));
  if (dg.attention) diagnose(model, cfg, data, o.batch, o.out_dir);
  return 0;
}

int train(RunOptions o, ImageTextRunConfig cfg, const AppOptions& a, const DiagnoseOptions& dg) {
  const ImageTextData data = load_imagetext_data(o.data_dir, cfg.val_images);
  fit_scenes_to_data(cfg.scenes, data.train, cfg.model.patch);
  fit_model_to_scenes(cfg.model, cfg.scenes);
  cfg.model.dropout = o.dropout;
  const std::vector<Scene> val =
      compose_scenes(data.val, cfg.scenes, cfg.scene_seed, SceneSplit::val, 0, cfg.val_scenes);

  // the training scenes are composed afresh at every step: no small set to memorise
  const std::string patience =
      resolve_patience(o, false, "fresh training scenes are composed at every step, so there is no set to memorise");

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
  const SceneBatch probe = make_scene_batch(
      data.train, cfg.scenes, compose_scenes(data.train, cfg.scenes, cfg.scene_seed, SceneSplit::train, 0, o.batch),
      data.norm);
  const ComputeProfile compute = profile_model(model, [&] { return model.forward(probe.images, probe.input); },
                                               o.batch, m.patches() + 1 + m.max_len, dg, &compute_text);
  run.print(compute_text);

  run.evaluate_with([&](int64_t s) {  // on the validation scenes: the test scenes wait for the end
    const CaptionEval v = evaluate_captions(model, data.val, cfg.scenes, val, data.norm, a.eval_batch, true);
    run.log_eval(s, {{"val_loss", v.loss},
                     {"val_token_accuracy", v.token_accuracy},
                     {"val_exact_match", v.exact_match},
                     {"val_word_accuracy", v.word_accuracy}});
  });
  int64_t step = run.resume();
  for (; step < o.steps && !run.stop_requested(); ++step) {
    schedule->set_lr(opt, step);
    // the global batch of scenes of this step, planned as one process would; this rank's slice
    const std::vector<Scene> scenes =
        train_scenes(data.train, cfg, global_batch(o), step, dist::rank(), dist::world_size());
    const SceneBatch batch = make_scene_batch(data.train, cfg.scenes, scenes, data.norm);
    // the global batch's caption tokens over the ranks: every rank divides its slice's summed loss
    // by this, so the ranks' mean gradient is the global mean per token (caption_loss)
    const double tokens =
        dist::world_size() == 1
            ? double(batch.words)
            : double(caption_token_count(train_scenes(data.train, cfg, global_batch(o), step))) / dist::world_size();
    double loss = 0;
    {  // the gradients of the batch; its activations are freed at the brace
      const Tensor mean_loss = caption_loss(model, batch, cfg.label_smoothing, tokens);
      opt.zero_grad();
      (run.loss_scale() == 1.0 ? mean_loss : mul(mean_loss, run.loss_scale())).backward();  // fp16: scaled
      loss = mean_loss.item<double>();
    }
    const Run::StepTotals t = run.reduce_step(loss, int64_t(scenes.size()), batch.words);
    run.optimizer_step(step + 1, t.loss);
    run.step_done(step + 1, t.loss, t.samples, t.tokens);
    run.end_step(step + 1);  // saves, then evaluates: a crash in the evaluation loses nothing
  }
  run.save(step);   // also after Ctrl-C: nothing trained is lost
  run.load_best();  // the model of the best validation exact match
  const TestFigures f = test_model(model, cfg, data, a, run.dir(), /*sharded=*/true);

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
  CLI::App cli{"imagetext: an image-captioning transformer on scenes of Fashion-MNIST items, with image-text "
               "retrieval and cross-attention maps"};
  RunOptions o;
  // The default recipe: 6000 steps of 32 fresh scenes (192k scenes, ~580k item views), a few
  // minutes on one core (docs/math/cross-attention.md, "What the trained decoder does").
  o.steps = 6000;
  o.batch = 32;
  o.lr = 3e-3;
  o.weight_decay = 0.05;
  o.warmup = 0.05;
  o.clip = 1.0;
  ImageTextRunConfig cfg;
  AppOptions a;
  DiagnoseOptions dg;
  add_run_options(cli, o);
  add_diagnose_options(cli, dg);
  cli.add_option("--layout", cfg.scenes.layout, "row (items side by side) or grid (2x2)")
      ->capture_default_str()
      ->check(CLI::IsMember(scene_layouts()));
  cli.add_option("--min-items", cfg.scenes.min_items, "fewest items in a scene")->capture_default_str()->check(positive());
  cli.add_option("--max-items", cfg.scenes.max_items, "most items in a scene (row: up to 8, grid: up to 4)")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--patch", cfg.model.patch, "patch size in pixels (must divide the 28-pixel items)")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--d-model", cfg.model.d_model, "token width")->capture_default_str()->check(positive());
  cli.add_option("--heads", cfg.model.n_heads, "attention heads (must divide d-model)")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--enc-layers", cfg.model.enc_layers, "encoder blocks")->capture_default_str()->check(positive());
  cli.add_option("--dec-layers", cfg.model.dec_layers, "decoder blocks")->capture_default_str()->check(positive());
  cli.add_option("--mlp", cfg.model.mlp_hidden, "hidden width of each block's MLP")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--label-smoothing", cfg.label_smoothing, "label smoothing of the training loss")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  cli.add_option("--val-images", cfg.val_images, "training images held out as the validation scenes' source")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--val-scenes", cfg.val_scenes, "validation scenes (model selection)")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--test-scenes", cfg.test_scenes, "test scenes, composed from the test images only")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--scene-seed", cfg.scene_seed, "seed of the scene compositions (training, validation, test)")
      ->capture_default_str();
  cli.add_option("--eval-batch", a.eval_batch, "scenes per forward pass when evaluating")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--retrieval-candidates", a.retrieval_candidates,
                 "retrieval: each image ranks this many captions and each caption this many images (groups of the "
                 "test scenes)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(2), std::numeric_limits<int64_t>::max()));
  cli.add_option("--attention-scenes", a.attention_scenes, "test scenes drawn in attention.svg")
      ->capture_default_str()
      ->check(positive());
  if (const int rc = apps::parse_command_line(cli, argc, argv, "imagetext"); rc >= 0) return rc;
  o.command_line.assign(argv, argv + argc);
  o.given = given_options(cli);

  try {  // every option is checked before any data is read
    apply_run_options(o, "imagetext");
    validate_imagetext_config(cfg);
    usage_check(a.retrieval_candidates <= cfg.test_scenes,
                "imagetext: --retrieval-candidates {} is more than the --test-scenes {}", a.retrieval_candidates,
                cfg.test_scenes);
  } catch (const UsageError& e) {
    apps::print_usage_error("imagetext", e.what());
    return kExitUsage;
  }
  try {
    return o.eval_only ? evaluate_checkpoint(o, a, dg, cfg) : train(o, cfg, a, dg);
  } catch (const UsageError& e) {  // an option --eval-only would ignore
    apps::print_usage_error("imagetext", e.what());
    return kExitUsage;
  } catch (const data::DatasetNotFound& e) {
    apps::print_error("imagetext", e.what());
    return apps::error_exit(kExitNoData);
  } catch (const Error& e) {
    apps::print_error("imagetext", e.what());
    return apps::error_exit(kExitError);
  }
}
