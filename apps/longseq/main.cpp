// longseq: long-sequence classification in the spirit of Long Range Arena (Tay et al., 2020): one
// small transformer, the attention method chosen by --attention, everything else equal, on tasks
// whose sequences run to thousands of tokens:
//   --task pixels    Fashion-MNIST (or --dataset mnist | cifar10) read as 784 (1024) pixel tokens
//   --task listops   LRA's ListOps, generated from --data-seed, 500-2000 tokens, values 0-9
//   --task text      which of 8 groups of books a 2048-byte passage of the King James Bible is from
//                    (training passages at random starts between the held-out ones; --fixed-passages)
//
// The model (apps/longseq/model.h LongSeqClassifier), for tokens (B, T) with lengths (B):
//   h0 = embed(tokens) + pos_embed[:T]             (B, T, d); pos_embed (1, max_len, d) is learned
//   h = h + attn(ln1(h));  h = h + mlp(ln2(h))     n_layers pre-LN blocks, MLP d -> mlp_hidden -> d
//   logits = head(norm(mean of h over the valid tokens of each sequence))      (B, K)
//   loss = cross_entropy(logits, labels)
// attn: --attention full | window (--window w) | sparse (--sparse local-global | strided, --block,
// --window-blocks, --global-blocks, --stride-blocks) | linformer (--k) | compressed (--stride) | axial
// (the pixels' grid, or a passage folded into rows of --axial-width bytes; not for ListOps, whose
// expressions vary in length). --materialise computes full, window or sparse attention as
// matmul-softmax-matmul, the T x T weights stored, to compare its memory with the fused kernel's.
// --grad-checkpointing recomputes each block's activations in backward instead of keeping them
// (docs/math/checkpointing.md).
// Default: pixels of Fashion-MNIST (784 tokens), full attention, d 64, 4 heads, 2 layers, MLP 128;
// AdamW (lr 1e-3, weight decay 0.05), 5% linear warmup then cosine to zero, gradient clip 1.0,
// batch 32, 2000 steps.
//
// Model selection: the evaluations during training run on a validation split (pixels: --val-size
// training images, -1 for 10% of the training set, at most 5000; ListOps and text have their own),
// best.safetensors keeps the model of the best validation accuracy, and the test split is
// evaluated once, at the end, on that model. Under 20,000 training sequences --patience is 5.
//
// In the run directory (default runs/longseq): checkpoint.safetensors, best.safetensors,
// metrics.jsonl, TensorBoard events, curves.svg, report.json (test accuracy, step time, peak
// memory), and attention.svg: the last block's attention averaged over heads and pooled into blocks
// of tokens. ListOps also writes its splits there (listops-{train,val,test}.tsv). --resume,
// --stop-at and --eval-only [--checkpoint FILE] work as in the other apps; `mpirun -np N longseq`
// trains on N processes, --batch sequences each (apps/common/run.h).
#include <filesystem>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "apps/common/app.h"
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

// --eval-only: the model and its data as the checkpoint saved them, on the test split.
// given: run_config of the command line's model and task, for check_eval_only_options
int evaluate_checkpoint(const RunOptions& o, const AppOptions& a, const nlohmann::json& given) {
  if (!dist::is_main()) return 0;  // under mpirun rank 0 evaluates alone
  const CheckpointInfo info = read_checkpoint_info(o.checkpoint, "longseq");
  check_eval_only_options(o, info.config, given, longseq_saved_options(), "longseq");
  const LongSeqConfig cfg = model_from_json(info.config, o.checkpoint);
  const TaskOptions t = task_from_json(info.config, o.data_dir);
  const SeqSplits data = load_task(t);
  LongSeqClassifier model(cfg);
  model.to(training_device(o));  // --device: the checkpoint's tensors are copied there
  training::load_checkpoint(o.checkpoint, model, nullptr, nullptr);
  fmt::print("longseq: {} trained {} steps ({} attention) on {}: evaluating on its {} test sequences\n", o.checkpoint,
             info.step, cfg.attention, t.task, data.test.size());
  const EvalResult r = evaluate(model, data.test, a.eval_batch);
  fmt::print("{}\ntest accuracy {:.2f}%  test loss {:.4f}\n", r.confusion->to_text(), 100 * r.accuracy, r.loss);
  std::filesystem::create_directories(o.out_dir);
  write_heatmap(model, data.test, a.heatmap_seqs, o.out_dir);
  return 0;
}

int train(RunOptions o, LongSeqConfig cfg, TaskOptions t, const AppOptions& a, const DiagnoseOptions& dg,
          bool grad_checkpointing) {
  // ---- data: the task's train / validation / test splits, and what depends on them --------------
  const SeqSplits data = load_task(t, dist::is_main() ? o.out_dir : "");
  if (t.task == "pixels") t.val_size = data.val.size();  // what -1 chose, as the checkpoint records it
  const std::string patience_line = fit_patience_to_data(o, data.train.size());
  cfg.dropout = o.dropout;
  fit_model_to_data(cfg, data.train, a.axial_width);

  // ---- model, optimizer, schedule, and the run directory ---------------------------------------
  Generator gen(o.seed);
  LongSeqClassifier model(cfg, &gen);  // initialised on the CPU (the same numbers on every device)
  model.grad_checkpointing = grad_checkpointing;
  model.to(training_device(o));  // --device; the optimizer's state is made beside each parameter
  optim::AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  const auto schedule = make_schedule(o);
  nlohmann::json config = run_config(cfg, t);
  // what fixes the batches too, so --resume refuses another global batch (N x --batch under mpirun)
  config["train"] = {{"batch", global_batch(o)}, {"seed", o.seed}};
  if (grad_checkpointing) config["train"]["grad_checkpointing"] = true;  // absent when off, as in older runs
  Run run("longseq", o, model, opt, gen, config);
  run.select_by("val_accuracy", true, "val_loss");
  if (!patience_line.empty()) run.print("longseq: " + patience_line);
  if (grad_checkpointing)
    run.print("longseq: --grad-checkpointing: each block's activations are recomputed in backward");
  run.print(describe_run(cfg, t, data));
  if (!data.train.source.empty())
    run.print("longseq: each training passage is drawn at a random start inside its run of training bytes "
              "(--fixed-passages: off)");
  std::string compute_text;
  const SeqBatch probe = make_batch(data.train, std::vector<int64_t>(size_t(std::min(o.batch, data.train.size())), 0));
  const ComputeProfile compute = profile_model(
      model, [&] { return model.forward(probe.tokens, probe.lengths); }, probe.tokens.size(0), cfg.max_len, dg,
      &compute_text);
  run.print(compute_text);

  // ---- the training loop: the validation split picks the best model; the test split waits ------
  run.evaluate_with([&](int64_t s) {
    if (data.val.size() == 0) return run.log_eval(s, {});
    const EvalResult v = evaluate(model, data.val, a.eval_batch, s == o.steps ? 0 : a.eval_limit, /*sharded=*/true);
    run.log_eval(s, {{"val_loss", v.loss}, {"val_accuracy", v.accuracy}});
  });
  int64_t step = run.resume();
  // the global batch of N x --batch sequences, planned as one process would; this rank makes its slice
  auto loader = make_train_loader(data.train, global_batch(o), o.seed, step, 2, dist::rank(), dist::world_size());
  for (; step < o.steps && !run.stop_requested(); ++step) {
    schedule->set_lr(opt, step);
    const SeqBatch batch = loader->next_step();
    const double loss = forward_backward(model, opt, batch, run.loss_scale());
    // over the ranks: clip, step, log, save, evaluate
    run.update(step + 1, loss, batch.labels.size(0), sum(batch.lengths).item<int64_t>());
  }
  run.save(step);  // also after Ctrl-C: nothing trained is lost

  // ---- the test split, once, on the model of the best validation accuracy ---------------------
  run.load_best();
  const EvalResult test = evaluate(model, data.test, a.eval_batch, 0, /*sharded=*/true);
  RunReport report;
  report.accuracy = test.accuracy;
  report.confusion = test.confusion;
  report.extra = {{"test_loss", test.loss}, {"test_sequences", double(test.samples)}};
  if (run.best().step >= 0) report.extra.push_back({"val_accuracy", run.best().value});
  compute.fill(report);
  run.finish(report);
  if (!dist::is_main()) return 0;  // the pictures are rank 0's
  write_heatmap(model, data.val.size() > 0 ? data.val : data.test, a.heatmap_seqs, run.dir());
  fmt::print("test accuracy {:.2f}% ({} after {} steps; {} attention, {})\n", 100 * test.accuracy,
             run.best().step >= 0 ? fmt::format("the best model by validation, step {}", run.best().step)
                                  : std::string("the last model"),
             step, cfg.attention, t.task);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  App app("longseq", "long-sequence classification (pixels, ListOps, bible text) with a chosen attention method");
  // The default recipe; each method's accuracy with it: docs/benchmarks.md, "Accuracy of each
  // method on each task".
  app.o = {.steps = 2000, .batch = 32, .lr = 1e-3, .warmup = 0.05, .weight_decay = 0.05, .clip = 1.0};
  app.add_run_options();
  LongSeqConfig cfg;
  TaskOptions t;
  AppOptions a;
  DiagnoseOptions dg;
  bool fixed_passages = false, grad_checkpointing = false;
  add_diagnose_options(app.cli, dg);
  CLI::App& cli = app.cli;
  cli.add_option("--task", t.task, "pixels, listops or text")->check(CLI::IsMember(longseq_tasks()));
  cli.add_option("--attention", cfg.attention,
                 fmt::format("attention method: {}", fmt::join(attention_methods(), ", ")))
      ->check(CLI::IsMember(attention_methods()));
  cli.add_option("--window", cfg.window, "--attention window: each token sees the tokens within +-this many")
      ->check(non_negative());
  cli.add_option("--sparse", cfg.sparse, "--attention sparse: the pattern, local-global or strided")
      ->check(CLI::IsMember({"local-global", "strided"}));
  cli.add_option("--block", cfg.block, "--attention sparse: tokens per block")->check(positive());
  cli.add_option("--window-blocks", cfg.window_blocks, "--sparse local-global: blocks on each side of the diagonal")
      ->check(non_negative());
  cli.add_option("--global-blocks", cfg.global_blocks, "--sparse local-global: leading blocks that are global")
      ->check(non_negative());
  cli.add_option("--stride-blocks", cfg.stride_blocks, "--sparse strided: the stride in blocks")->check(positive());
  cli.add_flag("--materialise", cfg.materialise,
               "--attention full, window or sparse: compute it as matmul, softmax, matmul, storing the T x T weights "
               "(the same function as the fused kernel, O(T^2) memory: to measure what fusing saves)");
  cli.add_option("--k", cfg.k, "--attention linformer: the projected length of keys and values")->check(positive());
  cli.add_option("--stride", cfg.stride, "--attention compressed: positions per compressed key")->check(positive());
  cli.add_option("--axial-width", a.axial_width,
                 "--attention axial on text: bytes per row of the grid (0: the divisor of --passage nearest its square "
                 "root); pixels use the image's grid")
      ->check(non_negative());
  cli.add_option("--dataset", t.dataset, std::string("pixels: fashion-mnist, mnist or cifar10 (default --data-dir: ") +
                                             data::kFashionMnistDir + ", data/mnist, data/cifar10)")
      ->check(CLI::IsMember({"fashion-mnist", "mnist", "cifar10"}));
  app.add_val_size_option(t.val_size, "images (--task pixels)");
  cli.add_option("--data-seed", t.data_seed, "listops: the seed of the generated splits");
  cli.add_option("--listops-train", t.listops_train, "listops: training expressions")->check(positive());
  cli.add_option("--listops-val", t.listops_val, "listops: validation expressions")->check(positive());
  cli.add_option("--listops-test", t.listops_test, "listops: test expressions")->check(positive());
  cli.add_option("--listops-min-len", t.listops_min_len, "listops: shortest expression in tokens")->check(positive());
  cli.add_option("--listops-max-len", t.listops_max_len, "listops: longest expression in tokens")->check(positive());
  cli.add_option("--passage", t.passage, "text: bytes per passage")->check(positive());
  cli.add_flag("--fixed-passages", fixed_passages,
               "text: train on the fixed passages; by default each batch draws every training passage at a random "
               "start inside its run of training bytes (never reaching a validation or test byte)");
  cli.add_option("--d-model", cfg.d_model, "token width")->check(positive());
  cli.add_option("--heads", cfg.n_heads, "attention heads (must divide d-model)")->check(positive());
  cli.add_option("--layers", cfg.n_layers, "transformer blocks")->check(positive());
  cli.add_option("--mlp", cfg.mlp_hidden, "hidden width of each block's MLP")->check(positive());
  cli.add_flag("--grad-checkpointing", grad_checkpointing,
               "recompute each block's activations in backward instead of keeping them: less memory, about a third "
               "more compute per step, the same gradients (docs/math/checkpointing.md)");
  cli.add_option("--eval-batch", a.eval_batch, "sequences per forward pass when evaluating")->check(positive());
  cli.add_option("--eval-limit", a.eval_limit,
                 "evaluate on the first N validation sequences during training (0: all); the last evaluation uses all")
      ->check(non_negative());
  cli.add_option("--heatmap-seqs", a.heatmap_seqs, "validation sequences averaged in attention.svg")->check(positive());
  const auto check = [&] {
    t.random_windows = !fixed_passages;
    t.data_dir = app.o.data_dir;
    validate_command_line(cfg, t, a.axial_width);
    usage_check(!grad_checkpointing || !app.o.eval_only,
                "longseq: --grad-checkpointing: recomputes activations in backward; --eval-only trains nothing");
  };
  return app.main(argc, argv, check, [&] {
    return app.o.eval_only ? evaluate_checkpoint(app.o, a, run_config(cfg, t))
                           : train(app.o, cfg, t, a, dg, grad_checkpointing);
  });
}
