// The apps' diagnostics (apps/common/diagnose.h): MFU in the report, the measured FMA peak, the
// attention report as JSON, and --diagnose-attention / --model-report / --peak-gflops on the real
// vit, textclf and gpt binaries (ATTOGRAD_APP_DIR), each a tiny run on synthetic data.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/common/diagnose.h"
#include "apps/common/threads.h"
#include "core/parallel.h"
#include "apps/vit/model.h"
#include "tests/helpers.h"
#include "tests/spawn.h"

using namespace ag;
using namespace ag::apps;
using namespace ag::test;

namespace {

// An IDX file of u8: 0 0 0x08 ndims, each dim as a big-endian u32, then the data.
std::string idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::string s = {0, 0, 8, char(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) s += char((d >> shift) & 0xFF);
  return s + std::string(data.begin(), data.end());
}

// Fashion-MNIST's layout with 8x8 images: image i has class i % 4 and brightness 30 + 60 c + noise.
void write_fashion(const std::string& dir, uint32_t n_train, uint32_t n_test) {
  std::filesystem::create_directories(dir);
  for (auto [prefix, n] : {std::pair{"train", n_train}, std::pair{"t10k", n_test}}) {
    std::vector<uint8_t> images(size_t(n) * 64), labels(n);
    for (uint32_t i = 0; i < n; ++i) {
      labels[i] = uint8_t(i % 4);
      for (uint32_t p = 0; p < 64; ++p) images[size_t(i) * 64 + p] = uint8_t(30 + 60 * (i % 4) + (i * 131 + p * 7) % 32);
    }
    write_bytes(dir + "/" + std::string(prefix) + "-images-idx3-ubyte", idx_bytes({n, 8, 8}, images));
    write_bytes(dir + "/" + std::string(prefix) + "-labels-idx1-ubyte", idx_bytes({n}, labels));
  }
}

// label<TAB>text: "zero" texts from "abcde", "one" from "cdefg", 6..17 characters.
std::string synthetic_tsv(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    const char* alphabet = i % 2 == 0 ? "abcde" : "cdefg";
    out += i % 2 == 0 ? "zero\t" : "one\t";
    for (int t = 0; t < 6 + (i * 7) % 12; ++t) out += alphabet[(i * 31 + t * 17) % 5];
    out += '\n';
  }
  return out;
}

std::string synthetic_text() {
  const char* words[] = {"the", "lord", "said", "unto", "moses", "and", "god", "saw", "light", "was", "good", "day"};
  std::string out;
  for (uint32_t i = 0; i < 2000; ++i) out += std::string(words[((i * 2654435761u) >> 16) % 12]) + (i % 12 == 11 ? "\n" : " ");
  return out;
}

std::vector<std::string> tiny(const std::string& app, const std::string& out, std::vector<std::string> more) {
  std::vector<std::string> a = {std::string(ATTOGRAD_APP_DIR) + "/" + app, "--steps", "3", "--threads", "1",
                                "--out", out, "--quiet", "--d-model", "16", "--mlp", "32"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_bytes(path)); }

// Every layer of the diagnostics JSON: its name, the weights' shape, one entry per head with the
// statistics in range.
void check_layers(const nlohmann::json& j, const std::vector<std::string>& names, const std::vector<int64_t>& shape) {
  REQUIRE(j.at("layers").size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const nlohmann::json& l = j.at("layers")[i];
    CHECK(l.at("layer") == names[i]);
    CHECK(l.at("shape").get<std::vector<int64_t>>() == shape);
    REQUIRE(l.at("heads").size() == size_t(shape[1]));
    CHECK(l.at("similarity").size() == size_t(shape[1]));
    for (const nlohmann::json& h : l.at("heads")) {
      CHECK(h.at("entropy").get<double>() >= 0.0);
      CHECK(h.at("entropy").get<double>() <= 1.0 + 1e-9);
      CHECK(h.at("diagonal").get<double>() >= 0.0);
      CHECK(h.at("diagonal").get<double>() <= 1.0 + 1e-9);
    }
  }
  CHECK(j.at("thresholds").at("uniform_entropy") == 0.9);
  CHECK(j.at("warnings").is_array());
}

}  // namespace

TEST_CASE("diagnose: MFU in the report is 3 x forward FLOPs x samples/s over the peak") {
  RunReport r;
  r.samples = 100, r.train_seconds = 2;  // 50 samples/s
  r.forward_flops_per_sample = 1e6;
  CHECK(r.training_flops_per_second() == 1.5e8);
  CHECK(r.mfu() == 0);  // no peak, no MFU
  r.peak_flops = 1e9, r.peak_source = "--peak-gflops";
  CHECK(r.mfu() == doctest::Approx(0.15));
  const std::string text = r.to_text();
  CHECK(text.find("forward FLOPs: 1.00M per sample") != std::string::npos);
  CHECK(text.find("MFU: 15.0% of a 1.00GFLOP/s peak (--peak-gflops)") != std::string::npos);
  const nlohmann::json j = r.to_json();
  CHECK(j.at("mfu").get<double>() == doctest::Approx(0.15));
  CHECK(j.at("training_flops_per_second") == 1.5e8);
  // texts of varying length: the real tokens count, not the padded samples of the probe batch
  r.forward_flops_per_token = 2e4, r.tokens = 2000;  // 1000 tokens/s
  CHECK(r.training_flops_per_second() == 6e7);
  CHECK(r.mfu() == doctest::Approx(0.06));
  CHECK(r.to_text().find("forward FLOPs: 20.0k per token") != std::string::npos);
  CHECK(r.to_json().at("forward_flops_per_token") == 2e4);
  // a CPU of this century does more than 0.1 GFLOP/s of FMAs on one thread
  CHECK(measure_peak_flops(1, 0.01) > 1e8);
  // above 100% the peak was wrong (measured while another process held a core): said, not shown
  r.peak_flops = 3e7;  // the training FLOP/s are 6e7: 200%
  const std::string wrong = r.to_text();
  CHECK(wrong.find("MFU: not known: the training FLOP/s are 200% of the 30.0MFLOP/s peak") != std::string::npos);
  CHECK(wrong.find("--peak-gflops") != std::string::npos);
  CHECK(r.to_json().at("mfu").is_null());
  CHECK(r.to_json().at("mfu_above_peak").get<double>() == doctest::Approx(2.0));
}

TEST_CASE("diagnose: the FMA peak is the best this machine has measured, kept in a cache file") {
  TempDir tmp("peak_cache");
  const std::string file = tmp.file("sub/peak_flops.json");  // the folder is made when missing
  const std::string key = peak_flops_key(2);
  CHECK(key.find("fp32 lanes, 2 threads") != std::string::npos);
  CHECK(best_peak_flops(file, key, 100e9) == 100e9);  // nothing cached yet: the measurement
  CHECK(best_peak_flops(file, key, 50e9) == 100e9);   // a trial slowed by another process: the cache
  CHECK(best_peak_flops(file, "other CPU", 10e9) == 10e9);  // per key
  CHECK(best_peak_flops(file, key, 120e9) == 120e9);  // a better one replaces it
  const nlohmann::json j = nlohmann::json::parse(read_bytes(file));
  CHECK(j.at(key) == 120e9);
  CHECK(j.at("other CPU") == 10e9);
  write_bytes(file, "{not json");  // a damaged file counts as empty and is replaced
  CHECK(best_peak_flops(file, key, 70e9) == 70e9);
  CHECK(nlohmann::json::parse(read_bytes(file)).at(key) == 70e9);
  write_bytes(file, "{\"" + key + "\": \"fast\"}");  // a value that is no number: ignored
  CHECK(best_peak_flops(file, key, 60e9) == 60e9);
  CHECK(best_peak_flops(file, key, std::nan("")) == 60e9);  // a NaN measurement never enters the file
}

TEST_CASE("diagnose: under --threads 0 the peak is that of every core the run may take") {
  TempDir tmp("peak_auto");
  const char* home = std::getenv("HOME");
  const std::string saved_home = home ? home : "";
  ::setenv("HOME", tmp.dir.c_str(), 1);  // the peak cache of this test only
  const int before = num_threads();
  set_num_threads(2);
  AutoThreads& a = auto_threads();
  a.start();  // may take up to the 2 threads set now
  REQUIRE(a.active());
  CHECK(a.cores() == 2);
  set_num_threads(1);  // what it does beside a busy process
  std::string source;
  CHECK(machine_peak_flops(&source) > 0);
  CHECK(source.find("2 threads") != std::string::npos);  // the machine's 2 cores, not the 1 thread of the moment
  const std::string file = tmp.file(".cache/attograd/peak_flops.json");
  CHECK(nlohmann::json::parse(read_bytes(file)).contains(peak_flops_key(2)));
  a.stop();  // an explicit --threads: the threads of the run
  CHECK(machine_peak_flops(&source) > 0);
  CHECK(source.find("1 thread,") != std::string::npos);
  CHECK(nlohmann::json::parse(read_bytes(file)).contains(peak_flops_key(1)));
  if (home)
    ::setenv("HOME", saved_home.c_str(), 1);
  else
    ::unsetenv("HOME");
  set_num_threads(before);
}

TEST_CASE("diagnose: the attention report as JSON") {
  nn::LayerAttentionStats l = nn::attention_stats(from_vector(std::vector<double>{0.5, 0.5, 1, 0}, {1, 2, 1, 2}), {},
                                                  "blocks.0.attn");
  nn::AttentionReport r;
  r.layers = {l};
  r.warnings = {{"blocks.0.attn", "similar_heads", {0, 1}, "m"}};
  const nlohmann::json j = attention_report_to_json(r);
  CHECK(j.at("layers")[0].at("layer") == "blocks.0.attn");
  CHECK(j.at("layers")[0].at("shape") == nlohmann::json({1, 2, 1, 2}));
  CHECK(j.at("layers")[0].at("heads")[1].at("entropy").get<double>() == doctest::Approx(0.0));
  CHECK(j.at("layers")[0].at("similarity")[0][1].get<double>() == doctest::Approx(l.similarity[1]));
  CHECK(j.at("warnings")[0].at("heads") == nlohmann::json({0, 1}));
  CHECK(j.at("thresholds").at("head_similarity") == 0.95);
}

TEST_CASE("diagnose: vit --diagnose-attention writes every block's heads, the report its FLOPs and MFU") {
  TempDir tmp("diag_vit");
  write_fashion(tmp.file("fashion"), 64, 16);
  const std::string out = tmp.file("run");
  Child c = run_app(tiny("vit", out, {"--data-dir", tmp.file("fashion"), "--patch", "4", "--batch", "8", "--heads",
                                      "2", "--layers", "2", "--eval-batch", "16", "--attention-images", "1",
                                      "--diagnose-attention", "--model-report"}),
                    tmp.dir.string(), "vit");
  const std::string output = c.output();
  CHECK(output.find("attention diagnostics on 8 test images") != std::string::npos);
  CHECK(output.find("MultiHeadAttention") != std::string::npos);  // --model-report's table
  // 8x8 images, patch 4: 4 patches + the class token = 5 tokens
  check_layers(read_json(out + "/attention_diagnostics.json"), {"blocks.0.attn", "blocks.1.attn"}, {8, 2, 5, 5});

  // the report's forward FLOPs are nn::summarize's on the same model (Fashion-MNIST has 10 classes)
  ViTConfig cfg;
  cfg.image_size = 8, cfg.patch = 4, cfg.classes = 10, cfg.d_model = 16, cfg.n_heads = 2, cfg.n_layers = 2;
  cfg.mlp_hidden = 32;
  ViT model(cfg);
  model.eval();
  const Tensor x = zeros({8, 1, 8, 8});
  const double flops = nn::summarize(model, [&] { return model.forward(x); }, 8, 5).forward_flops_per_sample();
  const nlohmann::json report = read_json(out + "/report.json");
  CHECK(report.at("forward_flops_per_sample").get<double>() == flops);
  CHECK(report.at("peak_flops").get<double>() > 0);
  CHECK(report.at("mfu").get<double>() > 0);
  CHECK(report.at("mfu").get<double>() < 1);
}

TEST_CASE("diagnose: textclf and gpt --diagnose-attention, and --peak-gflops") {
  TempDir tmp("diag_text");
  write_bytes(tmp.file("train.tsv"), synthetic_tsv(200));
  write_bytes(tmp.file("text.txt"), synthetic_text());

  const std::string t_out = tmp.file("textclf");
  Child t = run_app(tiny("textclf", t_out, {"--dataset", "tsv", "--tsv-file", tmp.file("train.tsv"), "--max-len",
                                            "24", "--batch", "8", "--baseline", "off", "--heads", "2", "--layers", "1",
                                            "--diagnose-attention"}),
                    tmp.dir.string(), "textclf");
  CHECK(t.output().find("attention diagnostics on 8 test texts") != std::string::npos);
  const nlohmann::json tj = read_json(t_out + "/attention_diagnostics.json");
  REQUIRE(tj.at("layers").size() == 1);
  const auto shape = tj.at("layers")[0].at("shape").get<std::vector<int64_t>>();
  REQUIRE(shape.size() == 4);
  check_layers(tj, {"blocks.0.attn"}, {8, 2, shape[2], shape[2]});  // T: the batch's longest text
  // padded queries are left out: at most 8 texts x their lengths, fewer than 8 x T when any is padded
  CHECK(tj.at("layers")[0].at("rows").get<int64_t>() <= 8 * shape[2]);

  const std::string g_out = tmp.file("gpt");
  Child g = run_app(tiny("gpt", g_out, {"--text-file", tmp.file("text.txt"), "--context", "16", "--batch", "4",
                                        "--eval-windows", "8", "--sample-tokens", "0", "--heads", "4", "--layers", "2",
                                        "--diagnose-attention", "--peak-gflops", "100"}),
                    tmp.dir.string(), "gpt");
  CHECK(g.output().find("attention diagnostics on 4 validation windows of 16 characters") != std::string::npos);
  const nlohmann::json gj = read_json(g_out + "/attention_diagnostics.json");
  check_layers(gj, {"blocks.0.attn", "blocks.1.attn"}, {4, 4, 16, 16});
  // causal: the first query of each window sees one key and is left out
  CHECK(gj.at("layers")[0].at("rows") == 4 * 15);
  const nlohmann::json report = read_json(g_out + "/report.json");
  CHECK(report.at("peak_flops") == 1e11);
  CHECK(report.at("peak_source") == "--peak-gflops");
  CHECK(report.at("forward_flops_per_sample").get<double>() > 0);
}
