// --grad-checkpointing in gpt and longseq (apps/common/gpt2_style.h block_forward): one training
// step with each block recomputed in backward gives the plain step's loss and every parameter's
// gradient bit for bit, dropout included. The recomputation runs the same kernels on the same
// inputs in the same order, and dropout redraws the same masks from the rewound generator, so
// no rounding differs: the bound is 0. The memory kept between forward and backward falls by the
// count of docs/math/checkpointing.md, to the byte. And the binaries: the flag trains to the
// same checkpoint, is saved in the run's config, and is refused with --eval-only (exit 2).
#include <cstring>
#include <filesystem>

#include "apps/common/run.h"
#include "apps/gpt/lib.h"
#include "apps/longseq/lib.h"
#include "attograd.h"
#include "tests/apps/tiny_apps.h"
#include "tests/helpers.h"
#include "tests/spawn.h"

using namespace ag;
using namespace ag::apps;
using namespace ag::test;

namespace {

// What one training step leaves: the loss, every parameter's gradient by name, the bytes the
// forward kept for backward, and where the model's generator stands afterwards.
struct Step {
  double loss = 0;
  std::vector<std::pair<std::string, Tensor>> grads;
  int64_t held = 0;
  uint64_t gen_offset = 0;
};

template <class Model, class Loss>
Step one_step(Model& model, Generator& gen, Loss&& loss_of) {
  model.train();
  model.zero_grad();
  Step s;
  const int64_t before = int64_t(alloc_stats().bytes_in_use);
  Tensor loss = loss_of();
  s.held = int64_t(alloc_stats().bytes_in_use) - before;
  loss.backward();
  s.loss = loss.item<double>();
  for (const auto& [name, p] : model.named_parameters()) s.grads.emplace_back(name, p.grad());
  s.gen_offset = gen.offset();
  return s;
}

// The same loss and gradients, bit for bit, and the generator at the same place (so the next
// step's dropout draws agree too).
void check_same(const Step& plain, const Step& ck) {
  CHECK(std::memcmp(&plain.loss, &ck.loss, sizeof(double)) == 0);
  CHECK(plain.gen_offset == ck.gen_offset);
  REQUIRE(plain.grads.size() == ck.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    INFO("parameter " << plain.grads[i].first);
    REQUIRE(plain.grads[i].first == ck.grads[i].first);
    const Tensor &a = plain.grads[i].second, &b = ck.grads[i].second;
    REQUIRE(a.defined());
    REQUIRE(b.defined());
    REQUIRE(a.shape() == b.shape());
    const Tensor ac = a.contiguous(), bc = b.contiguous();
    CHECK(std::memcmp(ac.raw_data(), bc.raw_data(), size_t(ac.nbytes())) == 0);
  }
}

GPTConfig tiny_gpt() {
  GPTConfig c;
  c.vocab = 11, c.context = 16, c.d_model = 32, c.n_heads = 4, c.n_layers = 2, c.mlp_hidden = 64;
  return c;
}

// One step of a fresh GPT (seed 3) on a fixed batch of 4 windows of 16 tokens.
Step gpt_step(const GPTConfig& c, bool ckpt) {
  Generator gen(3);
  GPT model(c, &gen);
  model.grad_checkpointing = ckpt;
  const int64_t B = 4, T = c.context;
  std::vector<int64_t> ids(size_t(B * (T + 1)));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t((i * 7 + 3) % size_t(c.vocab));
  const Tensor all = from_vector(ids, {B, T + 1});
  const Tensor x = all.narrow(1, 0, T).contiguous(), y = all.narrow(1, 1, T).contiguous();
  return one_step(model, gen, [&] {
    return cross_entropy(model.forward(x).reshape({B * T, c.vocab}), y.reshape({B * T}));
  });
}

}  // namespace

TEST_CASE("grad checkpointing: a GPT step gives the plain step's loss and gradients bit for bit") {
  struct Case {
    const char* name;
    double dropout;
    std::string pos, mlp, norm;
    int64_t kv_heads;
  };
  for (const Case& k : {Case{"GPT-2's layout", 0.0, "learned", "gelu", "layernorm", 0},
                        Case{"GPT-2's layout, dropout 0.2", 0.2, "learned", "gelu", "layernorm", 0},
                        Case{"rope, swiglu, rmsnorm, 2 kv heads, dropout 0.2", 0.2, "rope", "swiglu", "rmsnorm", 2},
                        Case{"alibi, dropout 0.2", 0.2, "alibi", "gelu", "layernorm", 0}}) {
    INFO(k.name);
    GPTConfig c = tiny_gpt();
    c.dropout = k.dropout, c.pos = k.pos, c.mlp_kind = k.mlp, c.norm = k.norm, c.kv_heads = k.kv_heads;
    const Step plain = gpt_step(c, false), ck = gpt_step(c, true);
    check_same(plain, ck);
    if (k.dropout > 0) CHECK(plain.gen_offset > 0);  // dropout drew, and the recomputation drew the same
    CHECK(ck.held < plain.held);
  }
}

TEST_CASE("grad checkpointing: a GPT step under bf16 autocast, the same bits too") {
  AutocastGuard bf16(Precision::bf16);
  GPTConfig c = tiny_gpt();
  c.dropout = 0.2;
  check_same(gpt_step(c, false), gpt_step(c, true));
}

TEST_CASE("grad checkpointing: what a GPT keeps for backward falls by L (8 d + 2 m + H + 4) N floats") {
  // Per block the plain forward keeps (docs/math/checkpointing.md): ln1's output (d N), the fused
  // q, k, v projection (3 d N), attention's output (d N) and log-sum-exp (H N), the heads merged
  // (d N), the residual stream between the sublayers (d N), ln2's output (d N), fc1's and gelu's
  // outputs (2 m N), the block's output (d N) and the two norms' mean and 1/std (4 N). Checkpointed,
  // only the output stays. Every size here is a whole allocator size class, so the count is exact.
  GPTConfig c = tiny_gpt();
  const int64_t N = 4 * c.context, d = c.d_model, m = c.mlp_hidden, H = c.n_heads, L = c.n_layers;
  const Step plain = gpt_step(c, false), ck = gpt_step(c, true);
  CHECK(plain.held - ck.held == L * (8 * d + 2 * m + H + 4) * N * 4);
}

TEST_CASE("grad checkpointing: a longseq step, every attention method, padding and dropout, bit for bit") {
  using namespace ag::apps::longseq;
  LongSeqConfig c;
  c.vocab = 20, c.max_len = 12, c.classes = 3, c.d_model = 16, c.n_heads = 2, c.n_layers = 2, c.mlp_hidden = 24;
  c.dropout = 0.2, c.k = 5, c.stride = 3, c.block = 4, c.window = 3, c.grid_h = 3, c.grid_w = 4;
  std::vector<int64_t> tok(24);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = int64_t(1 + (i * 5) % 19);
  const Tensor tokens = from_vector<int64_t>(tok, {2, 12}), labels = from_vector<int64_t>({2, 0}, {2});
  for (const char* method : {"full", "window", "sparse", "linformer", "compressed", "axial"}) {
    for (bool materialise : {false, true}) {
      const std::string name = method;
      if (materialise && name != "full" && name != "window" && name != "sparse") continue;
      INFO(method << (materialise ? ", materialised" : ""));
      c.attention = method, c.materialise = materialise;
      // axial takes no padding: every sequence fills the 3 x 4 grid
      const Tensor lengths = name == "axial" ? Tensor() : from_vector<int64_t>({7, 12}, {2});
      auto step = [&](bool ckpt) {
        Generator gen(9);
        LongSeqClassifier model(c, &gen);
        model.grad_checkpointing = ckpt;
        return one_step(model, gen, [&] { return cross_entropy(model.forward(tokens, lengths), labels); });
      };
      const Step plain = step(false), ck = step(true);
      check_same(plain, ck);
      CHECK(plain.gen_offset > 0);
      CHECK(ck.held < plain.held);
    }
  }
}

TEST_CASE("grad checkpointing: only training steps checkpoint, evaluation and sampling run the blocks plainly") {
  // block_forward checkpoints only in training mode with grad on: an eval-mode forward (nn::summarize's,
  // which must see every op of the blocks) records the blocks' ops, and one under NoGradGuard nothing
  Generator gen(4);
  GPT model(tiny_gpt(), &gen);
  model.grad_checkpointing = true;
  const Tensor x = from_vector<int64_t>(std::vector<int64_t>(16, 2), {1, 16});
  auto count = [](const Tensor& root, const std::string& op) {
    int n = 0;
    for (const GraphEntry& e : graph_entries(root)) n += !e.leaf && e.op == op;
    return n;
  };
  const Tensor trained = model.forward(x);
  CHECK(count(trained, "checkpoint") == 2);  // one node per block, nothing of their insides
  CHECK(count(trained, "scaled_dot_product_attention") == 0);
  model.eval();
  const Tensor evaluated = model.forward(x);
  CHECK(count(evaluated, "checkpoint") == 0);
  CHECK(count(evaluated, "scaled_dot_product_attention") == 2);
  {
    NoGradGuard no_grad;
    CHECK(!model.forward(x).requires_grad());
  }
  model.train();
  const std::vector<int64_t> prompt{1, 2, 3};  // decoding with the KV cache: the same tokens
  CHECK(generate(model, prompt, 20, {.temperature = 0.0, .seed = 1}) ==
        generate(model, prompt, 20, {.temperature = 0.0, .seed = 1, .kv_cache = false}));
}

TEST_CASE("grad checkpointing: gpt --grad-checkpointing trains to the same checkpoint, saved in its config") {
  Apps apps("grad_ckpt_gpt");
  const auto plain = with_option(apps.command("gpt", "plain", 6, 3, 1), "--layers", "4");
  run_app(plain, apps.logs(), "plain");
  Child flagged = run_app(
      with_option(with_option(apps.command("gpt", "ckpt", 6, 3, 1), "--layers", "4"), "--grad-checkpointing"),
      apps.logs(), "ckpt");
  CHECK(flagged.err().find("--grad-checkpointing: each block's activations are recomputed in backward") !=
        std::string::npos);
  check_checkpoints(apps.checkpoint("plain"), apps.checkpoint("ckpt"));  // bit for bit, dropout 0.1
  auto losses = [&](const std::string& out) {
    std::vector<std::string> lines;
    for (nlohmann::json j : read_metrics(apps.tmp.file(out) + "/metrics.jsonl")) {
      for (const char* name : {"time", "rss_mb", "samples_per_s", "tokens_per_s"}) j.erase(name);
      lines.push_back(j.dump());  // every digit: equal text is equal bits
    }
    return lines;
  };
  CHECK(losses("plain") == losses("ckpt"));
  const auto report = [&](const std::string& out) {
    return nlohmann::json::parse(read_bytes(apps.tmp.file(out) + "/report.json")).at("config").at("train");
  };
  CHECK(report("ckpt").at("grad_checkpointing") == true);
  // the report's peak is training's (the profile's forward does not count): 4 blocks keep less
  const auto peak = [&](const std::string& out) {
    return nlohmann::json::parse(read_bytes(apps.tmp.file(out) + "/report.json")).at("peak_tensor_bytes").get<int64_t>();
  };
  CHECK(peak("ckpt") < peak("plain"));
  CHECK_FALSE(report("plain").contains("grad_checkpointing"));  // off: the config of runs without the flag
  // --resume compares the saved config: a run started with the flag resumes with it
  Child refused = run_app(with_option(with_option(plain, "--out", apps.tmp.file("ckpt")), "--resume"), apps.logs(),
                          "resume-plain", kExitUsage);
  CHECK(refused.err().find("\"grad_checkpointing\":true") != std::string::npos);
}

TEST_CASE("grad checkpointing: longseq --grad-checkpointing trains to the same checkpoint") {
  TempDir dir("grad_ckpt_longseq");
  write_fashion_gz(dir.dir.string(), 64, 16);  // 8x8: 64 pixel tokens
  auto command = [&](const std::string& out) {
    return std::vector<std::string>{std::string(ATTOGRAD_APP_DIR) + "/longseq", "--task", "pixels", "--data-dir",
                                    dir.dir.string(), "--val-size", "16", "--steps", "4", "--batch", "8",
                                    "--d-model", "16", "--heads", "2", "--layers", "2", "--mlp", "32",
                                    "--dropout", "0.1", "--threads", "1", "--quiet", "--out", dir.file(out)};
  };
  run_app(command("plain"), dir.dir.string(), "plain");
  run_app(with_option(command("ckpt"), "--grad-checkpointing"), dir.dir.string(), "ckpt");
  check_checkpoints(dir.file("plain") + "/checkpoint.safetensors", dir.file("ckpt") + "/checkpoint.safetensors");
  const auto report = nlohmann::json::parse(read_bytes(dir.file("ckpt") + "/report.json"));
  CHECK(report.at("config").at("train").at("grad_checkpointing") == true);
}

TEST_CASE("grad checkpointing: --help lists the flag, and --eval-only refuses it with exit 2 and one line") {
  TempDir dir("grad_ckpt_cli");
  for (const std::string app : {"gpt", "longseq"}) {
    INFO(app);
    const std::string bin = std::string(ATTOGRAD_APP_DIR) + "/" + app;
    Child help = run_app({bin, "--help"}, dir.dir.string(), app + "-help");
    CHECK(help.out().find("--grad-checkpointing") != std::string::npos);
    Child c = run_app({bin, "--grad-checkpointing", "--eval-only", "--out", dir.file(app)}, dir.dir.string(),
                      app + "-eval", kExitUsage);
    CHECK(c.err() == app + ": --grad-checkpointing: recomputes activations in backward; --eval-only trains nothing (" +
                         app + " --help lists every option)\n");
    CHECK_FALSE(std::filesystem::exists(dir.file(app)));  // nothing started
  }
}
