#pragma once
// The apps at a tiny size on tiny synthetic data, for the tests that run the real binaries
// (tests/apps/test_reliability.cpp, tests/dist/test_dist_apps.cpp, tests/cuda/test_cuda_apps.cpp):
// the data written the way a user would bring it, the command lines, and readers and comparisons
// of what a run leaves in its directory.
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/core.h>

#include "core/serialize.h"
#include "tests/helpers.h"

namespace ag::test {

inline void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), unsigned(bytes.size())) == int(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

// An IDX file of u8 (data/idx.h): 0 0 0x08 ndims, each dim as a big-endian u32, then the data.
inline std::string idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::string s = {0, 0, 8, char(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) s += char((d >> shift) & 0xFF);
  return s + std::string(data.begin(), data.end());
}

// Fashion-MNIST's four .gz files with 8x8 images: image i has class i % 4, brightness 30 + 60 c
// plus hashed noise in [0, 32) (learnable, and different under every crop and flip).
inline void write_fashion_gz(const std::string& dir, uint32_t n_train, uint32_t n_test) {
  std::filesystem::create_directories(dir);
  for (auto [prefix, n, salt] : {std::tuple{"train", n_train, 1u}, std::tuple{"t10k", n_test, 2u}}) {
    std::vector<uint8_t> images(size_t(n) * 64), labels(n);
    for (uint32_t i = 0; i < n; ++i) {
      labels[i] = uint8_t(i % 4);
      for (uint32_t p = 0; p < 64; ++p)
        images[size_t(i) * 64 + p] = uint8_t(30 + 60 * (i % 4) + ((i * 131 + p * 7 + salt) * 2654435761u >> 27));
    }
    write_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz", idx_bytes({n, 8, 8}, images));
    write_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", idx_bytes({n}, labels));
  }
}

// A deterministic pseudo-random stream (no dependence on the library under test).
inline uint32_t hash32(uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352dU, x ^= x >> 15, x *= 0x846ca68bU, x ^= x >> 16;
  return x;
}

// label<TAB>text: class "zero" draws from "abcde", "one" from "cdefg", 6..20 characters.
inline std::string synthetic_tsv(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    const char* alphabet = i % 2 == 0 ? "abcde" : "cdefg";
    out += i % 2 == 0 ? "zero\t" : "one\t";
    const uint32_t len = 6 + hash32(uint32_t(i)) % 15;
    for (uint32_t t = 0; t < len; ++t) out += alphabet[hash32(uint32_t(i) * 1000 + t + 7) % 5];
    out += '\n';
  }
  return out;
}

// ~18k characters of words from a small vocabulary, for the character-level GPT.
inline std::string synthetic_text() {
  const char* words[] = {"the", "lord", "said", "unto", "moses", "and", "god", "saw", "light", "was", "good", "day"};
  std::string out;
  for (uint32_t i = 0; i < 3000; ++i) out += std::string(words[hash32(i) % 12]) + (i % 12 == 11 ? "\n" : " ");
  return out;
}

// The data of the apps in one temporary folder, and their command lines at a tiny size
// (imagetext composes its scenes from the Fashion-MNIST files).
struct Apps {
  TempDir tmp;
  explicit Apps(const std::string& tag) : tmp(tag) {
    write_fashion_gz(tmp.file("fashion"), 256, 64);
    write_bytes(tmp.file("train.tsv"), synthetic_tsv(400));
    write_bytes(tmp.file("text.txt"), synthetic_text());
  }
  std::string logs() const { return tmp.dir.string(); }

  // `app` for `steps` steps in run directory `out`, evaluating and logging the training loss every
  // `eval_every` steps (never stopping early: --patience 0), at `threads` threads, with `dropout` and a batch of `batch` (0: vit 8, textclf 8, gpt
  // 4, imagetext 8); then `more` arguments.
  std::vector<std::string> command(const std::string& app, const std::string& out, int64_t steps, int64_t eval_every,
                                   int threads, std::vector<std::string> more = {}, double dropout = 0.1,
                                   int64_t batch = 0) const {
    std::vector<std::string> a = {std::string(ATTOGRAD_APP_DIR) + "/" + app};
    auto add = [&](std::initializer_list<std::string> xs) { a.insert(a.end(), xs); };
    if (batch == 0) batch = app == "gpt" ? 4 : 8;
    add({"--steps", std::to_string(steps), "--eval-every", std::to_string(eval_every), "--log-every",
       std::to_string(eval_every), "--patience", "0", "--threads",
         std::to_string(threads), "--out", tmp.file(out), "--dropout", fmt::format("{}", dropout), "--quiet",
         "--d-model", "16", "--heads", "2", "--mlp", "32", "--batch", std::to_string(batch)});
    if (app == "imagetext")  // scenes of 1-2 of the 8x8 items, side by side; an encoder and a decoder block
      add({"--enc-layers", "1", "--dec-layers", "1", "--data-dir", tmp.file("fashion"), "--patch", "4",
           "--min-items", "1", "--max-items", "2", "--val-images", "32", "--val-scenes", "16", "--test-scenes", "16",
           "--retrieval-candidates", "8", "--attention-scenes", "1", "--eval-batch", "16", "--peak-gflops", "10"});
    else
      add({"--layers", "1"});
    if (app == "vit")  // augmentation on: its crop and flip draws must resume too
      add({"--data-dir", tmp.file("fashion"), "--patch", "4", "--crop-pad", "1", "--flip", "--eval-batch", "64",
           "--attention-images", "1"});
    else if (app == "textclf")  // word dropout on: its draws must resume too
      add({"--dataset", "tsv", "--tsv-file", tmp.file("train.tsv"), "--max-len", "24", "--baseline", "off",
           "--eval-samples", "0", "--word-dropout", "0.2"});
    else if (app == "gpt")
      add({"--text-file", tmp.file("text.txt"), "--context", "16", "--eval-windows", "8", "--sample-tokens", "0"});
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }
  std::string checkpoint(const std::string& out) const { return tmp.file(out) + "/checkpoint.safetensors"; }
};

// `cmd` with option `name` set to `value`: its value replaced where the option is there, else both
// appended (an empty `value`: a flag, appended).
inline std::vector<std::string> with_option(std::vector<std::string> cmd, const std::string& name,
                                            const std::string& value = "") {
  const auto at = std::find(cmd.begin(), cmd.end(), name);
  if (at != cmd.end() && !value.empty() && at + 1 != cmd.end()) {
    *(at + 1) = value;
    return cmd;
  }
  cmd.push_back(name);
  if (!value.empty()) cmd.push_back(value);
  return cmd;
}

// metrics.jsonl, one JSON object per line; with `kind` "train" only the training lines (every
// --log-every steps: train_loss, lr, grad_norm, throughput), with "eval" only the evaluation lines.
inline std::vector<nlohmann::json> read_metrics(const std::string& path, const std::string& kind = "") {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    const bool train = j.contains("lr"), eval = j.contains("skipped_steps");
    REQUIRE(train != eval);  // every line is one of the two kinds
    if (kind.empty() || (kind == "train") == train) lines.push_back(std::move(j));
  }
  return lines;
}

// Two checkpoints hold the same tensors (names, dtypes, shapes) at the same step, with float values
// within atol + rtol |b|, or bit for bit when both are 0 (integer tensors always equal). Names the
// first offending tensor.
inline void check_checkpoints(const std::string& a, const std::string& b, double atol = 0, double rtol = 0) {
  std::map<std::string, std::string> meta_a, meta_b;
  const auto ta = load_safetensors_map(a, &meta_a), tb = load_safetensors_map(b, &meta_b);
  CHECK(meta_a.at("step") == meta_b.at("step"));
  REQUIRE(ta.size() == tb.size());
  REQUIRE(ta.size() > 2);
  for (const auto& [name, x] : ta) {
    INFO("tensor " << name);
    REQUIRE(tb.count(name) == 1);
    const Tensor& y = tb.at(name);
    REQUIRE(x.dtype() == y.dtype());
    REQUIRE(x.shape() == y.shape());
    if (atol == 0 && rtol == 0)
      CHECK(std::memcmp(x.raw_data(), y.raw_data(), size_t(x.nbytes())) == 0);
    else if (is_floating(x.dtype()))
      check_close(x.to_vector<double>(), y.to_vector<double>(), atol, rtol);  // INFO above names it
    else
      CHECK(x.to_vector<int64_t>() == y.to_vector<int64_t>());
  }
}

// Every loss of two metrics.jsonl files (train_loss, test_loss, val_loss), line by line at the
// same steps, within atol + rtol |b|.
inline void check_close_losses(const std::string& a, const std::string& b, double atol, double rtol) {
  const std::vector<nlohmann::json> la = read_metrics(a), lb = read_metrics(b);
  REQUIRE(la.size() == lb.size());
  REQUIRE(!la.empty());
  std::vector<double> va, vb;
  for (size_t i = 0; i < la.size(); ++i) {
    CHECK(la[i].at("step") == lb[i].at("step"));
    for (const auto& [name, value] : la[i].items())
      if (name.ends_with("_loss")) {
        REQUIRE(lb[i].contains(name));
        va.push_back(value.get<double>()), vb.push_back(lb[i].at(name).get<double>());
      }
  }
  INFO("the losses of " << a << " against " << b);
  check_close(va, vb, atol, rtol);
}

inline size_t count_lines(const std::string& path) {
  std::ifstream in(path);
  return size_t(std::count(std::istreambuf_iterator<char>(in), {}, '\n'));
}

}  // namespace ag::test
