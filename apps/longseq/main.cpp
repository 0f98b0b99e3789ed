// longseq: long-sequence classification in the spirit of Long Range Arena (Tay et al., 2020): one
// small transformer, the attention method chosen by --attention, everything else equal, on tasks
// whose sequences run to thousands of tokens:
//   --task pixels    Fashion-MNIST (or --dataset mnist | cifar10) read as 784 (1024) pixel tokens
//   --task listops   LRA's ListOps, generated from --data-seed, 500-2000 tokens, values 0-9
//   --task text      which of 8 groups of books a 2048-byte passage of the King James Bible is from
//                    (training passages at random starts between the held-out ones; --fixed-passages)
// --attention full | window (--window w) | sparse (--sparse local-global | strided, --block,
// --window-blocks, --global-blocks, --stride-blocks) | linformer (--k) | compressed (--stride) | axial (the
// pixels' grid, or a passage folded into rows of --axial-width bytes; not for ListOps, whose
// expressions vary in length). --materialise computes full, window or sparse attention as
// matmul-softmax-matmul, the T x T weights stored, to compare its memory with the fused kernel's.
// The model (apps/longseq/model.h): token + learned position embeddings, --layers pre-LN blocks,
// mean pooling over the valid tokens, a linear head. --grad-checkpointing recomputes each block's
// activations in backward instead of keeping them (docs/math/checkpointing.md). The run holds out
// a validation split from the training data, evaluates on it during training and reports the test
// split at the end.
//
// In the run directory (default runs/longseq): checkpoint.safetensors, metrics.jsonl,
// TensorBoard events, curves.svg, report.json (test accuracy, step time, peak memory), and
// attention.svg: the last block's attention averaged over heads and pooled into blocks of tokens.
// ListOps also writes its splits there (listops-{train,val,test}.tsv). --resume, --stop-at and
// --eval-only [--checkpoint FILE] work as in the other apps.
#include <CLI/CLI.hpp>

#include <filesystem>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "apps/common/diagnose.h"
#include "apps/common/run.h"
#include "apps/longseq/lib.h"
#include "data/images.h"
#include "optim/adam.h"
#include "training/checkpoint.h"

using namespace ag;
using namespace ag::apps;
using namespace ag::apps::longseq;

namespace {

struct AppOptions {
  int64_t axial_width = 0;     // text + axial: bytes per row of the grid (0: the divisor of --passage nearest its root)
  int64_t eval_batch = 64;     // sequences per forward pass when evaluating
  int64_t eval_limit = 1000;   // intermediate evaluations on the first this many validation sequences
  int64_t heatmap_seqs = 8;    // validation sequences averaged in attention.svg
};

// The divisor of n nearest sqrt(n) from above: the row length of a near-square grid.
int64_t axial_width_for(int64_t n) {
  int64_t w = 1;
  while (w * w < n) ++w;
  while (n % w != 0) ++w;
  return w;
}

std::string method_text(const LongSeqConfig& c) {
  std::string s;
  if (c.attention == "window") s = fmt::format(" (+-{} tokens)", c.window);
  if (c.attention == "sparse" && c.sparse == "strided")
    s = fmt::format(" (strided, blocks of {}, stride {} blocks)", c.block, c.stride_blocks);
  else if (c.attention == "sparse")
    s = fmt::format(" (local-global, blocks of {}, +-{} blocks, {} global)", c.block, c.window_blocks,
                    c.global_blocks);
  if (c.attention == "linformer") s = fmt::format(" (k {})", c.k);
  if (c.attention == "compressed") s = fmt::format(" (stride {})", c.stride);
  if (c.attention == "axial") s = fmt::format(" ({} x {} grid)", c.grid_h, c.grid_w);
  return c.materialise ? s + ", materialised (T x T weights stored)" : s;
}

nlohmann::json run_config(const LongSeqConfig& m, const TaskOptions& t) {
  nlohmann::json j = m;
  j["task"] = {{"task", t.task},
               {"dataset", t.dataset},
               {"val_size", t.val_size},
               {"data_seed", t.data_seed},
               {"listops", {t.listops_train, t.listops_val, t.listops_test, t.listops_min_len, t.listops_max_len}},
               {"passage", t.passage},
               {"random_windows", t.random_windows}};
  return j;
}

TaskOptions task_from_json(const nlohmann::json& j, const std::string& data_dir) {
  TaskOptions t;
  try {
    const nlohmann::json& k = j.at("task");
    t.task = k.at("task").get<std::string>();
    t.dataset = k.at("dataset").get<std::string>();
    t.val_size = k.at("val_size").get<int64_t>();
    t.data_seed = k.at("data_seed").get<uint64_t>();
    const auto l = k.at("listops").get<std::vector<int64_t>>();
    check(l.size() == 5, "longseq: the checkpoint's listops entry has {} values, expected 5", l.size());
    t.listops_train = l[0], t.listops_val = l[1], t.listops_test = l[2], t.listops_min_len = l[3];
    t.listops_max_len = l[4];
    t.passage = k.at("passage").get<int64_t>();
    t.random_windows = k.value("random_windows", false);  // checkpoints from before the option: fixed passages
  } catch (const nlohmann::json::exception& e) {
    fail("longseq: the checkpoint's config has no valid task entry ({}): {}", e.what(), j.dump());
  }
  t.data_dir = data_dir;
  validate_task_options(t);
  return t;
}

void write_heatmap(LongSeqClassifier& model, const SeqDataset& ds, int64_t n, const std::string& dir) {
  if (auto svg = attention_heatmap_svg(model, ds, n)) {
    write_file_atomic(dir + "/attention.svg", *svg);
    fmt::print("attention of the last block: {}/attention.svg\n", dir);
  }
}

// The options whose values --eval-only takes from the checkpoint, and their keys in run_config.
const std::vector<SavedOption>& saved_options() {
  static const std::vector<SavedOption> options = {
      {"--task", "/task/task"},          {"--attention", "/attention"},
      {"--window", "/window"},           {"--sparse", "/sparse"},
      {"--block", "/block"},             {"--window-blocks", "/window_blocks"},
      {"--global-blocks", "/global_blocks"}, {"--stride-blocks", "/stride_blocks"},
      {"--materialise", "/materialise"}, {"--k", "/k"},
      {"--stride", "/stride"},           {"--dataset", "/task/dataset"},
      {"--val-size", "/task/val_size"},  {"--data-seed", "/task/data_seed"},
      {"--listops-train", "/task/listops/0"}, {"--listops-val", "/task/listops/1"},
      {"--listops-test", "/task/listops/2"}, {"--listops-min-len", "/task/listops/3"},
      {"--listops-max-len", "/task/listops/4"}, {"--passage", "/task/passage"},
      {"--fixed-passages", "/task/random_windows"}, {"--d-model", "/d_model"},
      {"--heads", "/n_heads"},           {"--layers", "/n_layers"},
      {"--mlp", "/mlp_hidden"}};
  return options;
}

// given: run_config of the command line's model and task, for check_eval_only_options
int evaluate_checkpoint(const RunOptions& o, const AppOptions& a, const nlohmann::json& given) {
  if (!dist::is_main()) return 0;
  const CheckpointInfo info = read_checkpoint_info(o.checkpoint);
  check_eval_only_options(o, info.config, given, saved_options(), "longseq");
  LongSeqConfig cfg;
  try {
    cfg = info.config.get<LongSeqConfig>();
  } catch (const nlohmann::json::exception& e) {
    fail("longseq: {} holds no longseq config ({})", o.checkpoint, e.what());
  }
  check_config(cfg);
  const TaskOptions t = task_from_json(info.config, o.data_dir);
  const SeqSplits data = load_task(t);
  LongSeqClassifier model(cfg);
  model.to(training_device(o));
  training::load_checkpoint(o.checkpoint, model, nullptr, nullptr);
  fmt::print("longseq: {} trained {} steps ({} attention) on {}: evaluating on its {} test sequences\n", o.checkpoint,
             info.step, cfg.attention, t.task, data.test.size());
  const EvalResult r = evaluate(model, data.test, a.eval_batch);
  fmt::print("{}\ntest accuracy {:.2f}%  test loss {:.4f}\n", r.confusion->to_text(), 100 * r.accuracy, r.loss);
  std::filesystem::create_directories(o.out_dir);
  write_heatmap(model, data.test, a.heatmap_seqs, o.out_dir);
  return 0;
}

int train(RunOptions o, LongSeqConfig cfg, const TaskOptions& t, const AppOptions& a, const DiagnoseOptions& dg,
          bool grad_checkpointing) {
  const SeqSplits data = load_task(t, dist::is_main() ? o.out_dir : "");
  const std::string patience_line = resolve_patience(
      o, data.train.size() < kSmallTrainSet,
      fmt::format("{} training sequences{}", data.train.size(),
                  data.train.size() < kSmallTrainSet ? fmt::format(" (< {}: a small set)", kSmallTrainSet) : ""));
  cfg.vocab = data.train.vocab;
  cfg.max_len = data.train.max_len;
  cfg.classes = data.train.num_classes;
  cfg.dropout = o.dropout;
  if (cfg.attention == "axial") {
    if (data.train.grid_h > 0) {
      cfg.grid_h = data.train.grid_h, cfg.grid_w = data.train.grid_w;
    } else {
      cfg.grid_w = a.axial_width > 0 ? a.axial_width : axial_width_for(cfg.max_len);
      cfg.grid_h = cfg.max_len / cfg.grid_w;
    }
  }
  check_config(cfg);

  Generator gen(o.seed);
  LongSeqClassifier model(cfg, &gen);
  model.grad_checkpointing = grad_checkpointing;
  model.to(training_device(o));
  optim::AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  const auto schedule = make_schedule(o);
  nlohmann::json config = run_config(cfg, t);
  config["train"] = {{"batch", global_batch(o)}, {"seed", o.seed}};
  if (grad_checkpointing) config["train"]["grad_checkpointing"] = true;  // absent when off, as in older runs
  Run run("longseq", o, model, opt, gen, config);
  run.select_by("val_accuracy", true, "val_loss");
  if (!patience_line.empty()) run.print("longseq: " + patience_line);
  if (grad_checkpointing)
    run.print("longseq: --grad-checkpointing: each block's activations are recomputed in backward");
  run.print(fmt::format("longseq: {}{} ({} train / {} validation / {} test sequences, up to {} tokens, {} classes), "
                        "{} attention{}, d_model {}, {} heads, {} layers, MLP {}",
                        t.task, t.task == "pixels" ? " " + t.dataset : "", data.train.size(), data.val.size(),
                        data.test.size(), cfg.max_len, cfg.classes, cfg.attention,
                        method_text(cfg), cfg.d_model,
                        cfg.n_heads, cfg.n_layers, cfg.mlp_hidden));
  if (!data.train.source.empty())
    run.print("longseq: each training passage is drawn at a random start inside its run of training bytes "
              "(--fixed-passages: off)");
  std::string compute_text;
  const SeqBatch probe = make_batch(data.train, std::vector<int64_t>(size_t(std::min(o.batch, data.train.size())), 0));
  const ComputeProfile compute = profile_model(
      model, [&] { return model.forward(probe.tokens, probe.lengths); }, probe.tokens.size(0), cfg.max_len, dg,
      &compute_text);
  run.print(compute_text);

  EvalResult last_val;
  run.evaluate_with([&](int64_t s) {
    last_val = evaluate(model, data.val, a.eval_batch, s == o.steps ? 0 : a.eval_limit, /*sharded=*/true);
    run.log_eval(s, {{"val_loss", last_val.loss}, {"val_accuracy", last_val.accuracy}});
  });
  int64_t step = run.resume();
  auto loader = make_train_loader(data.train, global_batch(o), o.seed, step, 2, dist::rank(), dist::world_size());
  for (; step < o.steps && !run.stop_requested(); ++step) {
    schedule->set_lr(opt, step);
    const SeqBatch batch = loader->next_step();
    double loss = 0;
    {
      const Tensor logits = model.forward(batch.tokens, batch.lengths);
      const Tensor mean_loss = cross_entropy(logits, batch.labels.to(logits.device()));
      opt.zero_grad();
      (run.loss_scale() == 1.0 ? mean_loss : mul(mean_loss, run.loss_scale())).backward();
      loss = mean_loss.item<double>();
    }
    const Run::StepTotals tot =
        run.reduce_step(loss, batch.labels.size(0), sum(batch.lengths).item<int64_t>());
    run.optimizer_step(step + 1, tot.loss);
    run.step_done(step + 1, tot.loss, tot.samples, tot.tokens);
    run.end_step(step + 1);  // saves, then evaluates: a crash in the evaluation loses nothing
  }
  run.save(step);
  run.load_best();  // the model of the best validation accuracy
  const EvalResult test = evaluate(model, data.test, a.eval_batch, 0, /*sharded=*/true);

  RunReport report;
  report.accuracy = test.accuracy;
  report.confusion = test.confusion;
  report.extra = {{"test_loss", test.loss}, {"test_sequences", double(test.samples)}};
  if (run.best().step >= 0) report.extra.push_back({"val_accuracy", run.best().value});
  compute.fill(report);
  run.finish(report);
  if (!dist::is_main()) return 0;
  write_heatmap(model, data.val, a.heatmap_seqs, run.dir());
  fmt::print("test accuracy {:.2f}% ({} after {} steps; {} attention, {})\n", 100 * test.accuracy,
             run.best().step >= 0 ? fmt::format("the best model by validation, step {}", run.best().step)
                                  : std::string("the last model"),
             step, cfg.attention, t.task);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"longseq: long-sequence classification (pixels, ListOps, bible text) with a chosen attention method"};
  RunOptions o;
  o.steps = 2000;
  o.batch = 32;
  o.lr = 1e-3;
  o.weight_decay = 0.05;
  o.warmup = 0.05;
  o.clip = 1.0;
  LongSeqConfig cfg;
  TaskOptions t;
  AppOptions a;
  DiagnoseOptions dg;
  add_run_options(cli, o);
  add_diagnose_options(cli, dg);
  cli.add_option("--task", t.task, "pixels, listops or text")->capture_default_str()->check(CLI::IsMember(longseq_tasks()));
  cli.add_option("--attention", cfg.attention, "attention method: " + fmt::format("{}", fmt::join(attention_methods(), ", ")))
      ->capture_default_str()
      ->check(CLI::IsMember(attention_methods()));
  cli.add_option("--window", cfg.window, "--attention window: each token sees the tokens within +-this many")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--sparse", cfg.sparse, "--attention sparse: the pattern, local-global or strided")
      ->capture_default_str()
      ->check(CLI::IsMember({"local-global", "strided"}));
  cli.add_option("--block", cfg.block, "--attention sparse: tokens per block")->capture_default_str()->check(positive());
  cli.add_option("--window-blocks", cfg.window_blocks, "--sparse local-global: blocks on each side of the diagonal")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--global-blocks", cfg.global_blocks, "--sparse local-global: leading blocks that are global")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--stride-blocks", cfg.stride_blocks, "--sparse strided: the stride in blocks")
      ->capture_default_str()
      ->check(positive());
  cli.add_flag("--materialise", cfg.materialise,
               "--attention full, window or sparse: compute it as matmul, softmax, matmul, storing the T x T weights "
               "(the same function as the fused kernel, O(T^2) memory: to measure what fusing saves)");
  cli.add_option("--k", cfg.k, "--attention linformer: the projected length of keys and values")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--stride", cfg.stride, "--attention compressed: positions per compressed key")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--axial-width", a.axial_width,
                 "--attention axial on text: bytes per row of the grid (0: the divisor of --passage nearest its square "
                 "root); pixels use the image's grid")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--dataset", t.dataset, std::string("pixels: fashion-mnist, mnist or cifar10 (default --data-dir: ") +
                                             data::kFashionMnistDir + ", data/mnist, data/cifar10)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fashion-mnist", "mnist", "cifar10"}));
  cli.add_option("--val-size", t.val_size, "pixels: training images held out for validation")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--data-seed", t.data_seed, "listops: the seed of the generated splits")->capture_default_str();
  cli.add_option("--listops-train", t.listops_train, "listops: training expressions")->capture_default_str()->check(positive());
  cli.add_option("--listops-val", t.listops_val, "listops: validation expressions")->capture_default_str()->check(positive());
  cli.add_option("--listops-test", t.listops_test, "listops: test expressions")->capture_default_str()->check(positive());
  cli.add_option("--listops-min-len", t.listops_min_len, "listops: shortest expression in tokens")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--listops-max-len", t.listops_max_len, "listops: longest expression in tokens")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--passage", t.passage, "text: bytes per passage")->capture_default_str()->check(positive());
  bool fixed_passages = false;
  cli.add_flag("--fixed-passages", fixed_passages,
               "text: train on the fixed passages; by default each batch draws every training passage at a random "
               "start inside its run of training bytes (never reaching a validation or test byte)");
  cli.add_option("--d-model", cfg.d_model, "token width")->capture_default_str()->check(positive());
  cli.add_option("--heads", cfg.n_heads, "attention heads (must divide d-model)")->capture_default_str()->check(positive());
  cli.add_option("--layers", cfg.n_layers, "transformer blocks")->capture_default_str()->check(positive());
  cli.add_option("--mlp", cfg.mlp_hidden, "hidden width of each block's MLP")->capture_default_str()->check(positive());
  bool grad_checkpointing = false;
  cli.add_flag("--grad-checkpointing", grad_checkpointing,
               "recompute each block's activations in backward instead of keeping them: less memory, about a third "
               "more compute per step, the same gradients (docs/math/checkpointing.md)");
  cli.add_option("--eval-batch", a.eval_batch, "sequences per forward pass when evaluating")
      ->capture_default_str()
      ->check(positive());
  cli.add_option("--eval-limit", a.eval_limit,
                 "evaluate on the first N validation sequences during training (0: all); the last evaluation uses all")
      ->capture_default_str()
      ->check(non_negative());
  cli.add_option("--heatmap-seqs", a.heatmap_seqs, "validation sequences averaged in attention.svg")
      ->capture_default_str()
      ->check(positive());
  if (const int rc = apps::parse_command_line(cli, argc, argv, "longseq"); rc >= 0) return rc;
  o.command_line.assign(argv, argv + argc);
  o.given = given_options(cli);
  t.random_windows = !fixed_passages;

  try {
    apply_run_options(o, "longseq");
    validate_task_options(t);
    t.data_dir = o.data_dir;
    usage_check(cfg.d_model % cfg.n_heads == 0, "longseq: --heads {} does not divide --d-model {}", cfg.n_heads,
                cfg.d_model);
    usage_check(!cfg.materialise || cfg.attention == "full" || cfg.attention == "window" || cfg.attention == "sparse",
                "longseq: --materialise applies to --attention full, window or sparse, not {}", cfg.attention);
    usage_check(cfg.attention != "axial" || t.task != "listops",
                "longseq: --attention axial needs sequences that fill a grid; ListOps expressions vary in length");
    usage_check(cfg.attention != "axial" || t.task != "text" || a.axial_width == 0 || t.passage % a.axial_width == 0,
                "longseq: --axial-width {} does not divide --passage {}", a.axial_width, t.passage);
    usage_check(!grad_checkpointing || !o.eval_only,
                "longseq: --grad-checkpointing: recomputes activations in backward; --eval-only trains nothing");
  } catch (const UsageError& e) {
    apps::print_usage_error("longseq", e.what());
    return kExitUsage;
  }
  try {
    return o.eval_only ? evaluate_checkpoint(o, a, run_config(cfg, t)) : train(o, cfg, t, a, dg, grad_checkpointing);
  } catch (const UsageError& e) {  // an option --eval-only would ignore
    apps::print_usage_error("longseq", e.what());
    return kExitUsage;
  } catch (const data::DatasetNotFound& e) {
    apps::print_error("longseq", e.what());
    return apps::error_exit(kExitNoData);
  } catch (const Error& e) {
    apps::print_error("longseq", e.what());
    return apps::error_exit(kExitError);
  }
}
