// Writes the seed corpus of every fuzz target: tests/fuzz/corpus/<target>/, a few small valid
// files each, made with the library's own writers where it has one (safetensors, checkpoints,
// tokenizers, tfevents) and byte by byte from the format's description where it has none (IDX,
// CIFAR-10, text). Usage: fuzz_make_corpus <tests/fuzz/corpus>  (the folder is rewritten).
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "apps/common/metrics.h"
#include "apps/gpt/lib.h"
#include "apps/textclf/lib.h"
#include "apps/vit/lib.h"
#include "attograd.h"
#include "core/serialize.h"
#include "data/tokenizer.h"
#include "training/checkpoint.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "tests/fuzz/fuzz_common.h"

using namespace ag;
namespace fs = std::filesystem;

namespace {

fs::path g_root;

void put(const std::string& target, const std::string& name, std::string_view bytes) {
  fs::create_directories(g_root / target);
  std::ofstream f(g_root / target / name, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  if (!f) throw Error("make_corpus: cannot write " + (g_root / target / name).string());
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string gzip(std::string_view bytes) {
  const std::string tmp = fuzz::scratch_path("gz.tmp");
  gzFile f = gzopen(tmp.c_str(), "wb9");
  gzwrite(f, bytes.data(), unsigned(bytes.size()));
  gzclose(f);
  return slurp(tmp);
}

std::string join(std::initializer_list<std::string_view> parts) {
  std::string out;
  size_t k = 0;
  for (std::string_view p : parts) {
    if (k++ > 0) out += fuzz::kSplit;
    out += p;
  }
  return out;
}

// An IDX file of u8 elements: 00 00 08 ndims, big-endian u32 dims, then the bytes.
std::string idx_file(const std::vector<uint32_t>& dims) {
  std::string s = {0, 0, 8, char(dims.size())};
  size_t n = 1;
  for (uint32_t d : dims) {
    for (int k = 3; k >= 0; --k) s += char((d >> (8 * k)) & 0xFF);
    n *= d;
  }
  for (size_t i = 0; i < n; ++i) s += char(i * 37 % (dims.size() == 1 ? 10 : 256));
  return s;
}

// CIFAR-10 records: label, then 3x32x32 pixels.
std::string cifar_records(int n) {
  std::string s;
  for (int r = 0; r < n; ++r) {
    s += char(r % 10);
    for (int i = 0; i < 3 * 32 * 32; ++i) s += char((i * 7 + r) % 256);
  }
  return s;
}

Tensor bools(const std::vector<uint8_t>& v) {
  Tensor t = zeros({int64_t(v.size())}, DType::b8);
  std::copy(v.begin(), v.end(), static_cast<uint8_t*>(t.raw_data()));
  return t;
}

std::string safetensors_bytes(const std::vector<std::pair<std::string, Tensor>>& t,
                              const std::map<std::string, std::string>& meta) {
  const std::string p = fuzz::scratch_path("seed.safetensors");
  save_safetensors(p, t, meta);
  return slurp(p);
}

std::string checkpoint_bytes(const nlohmann::json& config, const std::string& tokenizer) {
  Generator gen(7);
  nn::Linear model(2, 3, true, DType::f32, &gen);
  optim::AdamW opt(model.parameters(), {});
  backward(sum(model.forward(ones({1, 2}))));
  opt.step();
  gen.advance(5);
  std::map<std::string, std::string> extra = {{"config", config.dump()}, {"steps", "10"}};
  if (!tokenizer.empty()) extra["tokenizer"] = tokenizer;
  const std::string p = fuzz::scratch_path("seed-ckpt.safetensors");
  training::save_checkpoint(p, model, opt, 1, gen, extra);
  return slurp(p);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_corpus <tests/fuzz/corpus>\n");
    return 2;
  }
  g_root = argv[1];
  try {
    // safetensors: every dtype, metadata, a 0-dim and an empty tensor, and no tensor at all
    put("safetensors", "dtypes.safetensors",
        safetensors_bytes({{"w", from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3})},
                           {"d", from_vector<double>({0.5, -1})},
                           {"i", from_vector<int64_t>({1, -2, 3})},
                           {"b", bools({0, 1, 1, 0})}},
                          {{"step", "100"}, {"note", "é"}}));
    put("safetensors", "scalar-empty.safetensors",
        safetensors_bytes({{"s", from_vector<float>({2.5f}, Shape{})}, {"e", zeros({0, 4})}}, {}));
    put("safetensors", "none.safetensors", safetensors_bytes({}, {{"only", "metadata"}}));

    // checkpoints: a Linear(2, 3) + AdamW, with each app's config and tokenizer
    apps::VitRunConfig vit;
    put("checkpoint", "vit.safetensors", checkpoint_bytes(apps::vit_config_to_json(vit), ""));
    const data::CharTokenizer chars = data::CharTokenizer::from_text("hello, world\n");
    put("checkpoint", "gpt.safetensors",
        checkpoint_bytes({{"model", apps::gpt_config_to_json(apps::GPTConfig{})},
                          {"data", {{"dataset", "bible"}, {"text_file", ""}, {"valid_fraction", 0.1}}}},
                         chars.to_json()));
    const auto words = apps::textclf::TextTokenizer::build_word({"the cat sat on the mat"}, 1, 100);
    put("checkpoint", "textclf.safetensors",
        checkpoint_bytes({{"model", apps::textclf::config_to_json(apps::TextClassifierConfig{})},
                          {"data", apps::textclf::data_to_json(apps::textclf::DataOptions{})}},
                         words.to_json()));

    // IDX: mode byte, then the file(s); see fuzz_idx.cpp
    const std::string images = idx_file({3, 4, 4}), labels = idx_file({3});
    put("idx", "plain-images", "\x00" + images);
    put("idx", "gz-labels", std::string(1, '\x00') + gzip(labels));
    put("idx", "compress-images", "\x01" + images);
    put("idx", "dataset", "\x02" + join({images, labels}));

    // CIFAR-10: two plain records, one gzipped
    put("cifar10", "two-records.bin", cifar_records(2));
    put("cifar10", "one-record.bin.gz", gzip(cifar_records(1)));

    // aclImdb: reviews joined by kSplit (even: neg, odd: pos; "#": a skipped file)
    put("imdb", "reviews", join({"Dull.<br /><br />Really dull.", "Great fun, loved it!", "#0:1 5:2",
                                 "Trop long.", "Très bien \xF0\x9F\x8E\xAC"}));

    // fortunes: "fortunes", "de/a", "de/b", "es/off/c"
    put("fortunes", "root", join({"Fortune one.\n%\nFortune two,\n  two lines.\n%\n", "Guten Tag.\n%\r\nFortune one.\n%\n",
                                  "Gr\xC3\xBC\xC3\x9F Gott.\n%\n", "Malo.\n%\n"}));
    put("fortunes", "single", "A % B\n%\n\n%\nlast, no newline");

    // TSV
    put("tsv", "train.tsv", "pos\tgood film\nneg\tbad film\r\n\npos\tsee\tit\nneg\tno\n");
    put("tsv", "utf8.tsv", "neg\tpas \xC3\xA9t\xC3\xA9\npos\t\xE5\xA5\xBD");

    // --text-file
    put("text_file", "ascii.txt", "In the beginning was the word.\nAnd the word was short.\n");
    put("text_file", "utf8.txt", "Gr\xC3\xBC\xC3\x9F\xC3\xA9 \xD0\x9F\xD1\x80\xD0\xB8 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80!\n\t\xC2\xA0x\n");

    // tokenizer vocabularies (and the textclf wrapper object)
    put("tokenizer", "char-byte.json", data::CharTokenizer::bytes().to_json());
    put("tokenizer", "char-codepoint.json", data::CharTokenizer::from_text("ab\xC3\xA9\n").to_json());
    put("tokenizer", "word.json", data::WordTokenizer::build({"the cat, the hat"}).to_json());
    put("tokenizer", "textclf-word.json", words.to_json());
    put("tokenizer", "textclf-char.json", apps::textclf::TextTokenizer::build_char({"xyz"}).to_json());

    // tfevents
    {
      const std::string dir = fuzz::fresh_dir("tfevents");
      std::string path;
      {
        apps::TfEventsWriter w(dir);
        w.add_scalars(1, {{"train/loss", 2.5}, {"val/accuracy", 0.75}}, 1000.0);
        w.add_scalar("train/loss", 2, 1.25, 1001.0);
        path = w.path();
      }
      put("tfevents", "file", "\x00" + slurp(path));
      // the same events as payloads, framed by the target
      put("tfevents", "payloads", "\x01" + join({apps::encode_file_version_event(1000.0),
                                                 apps::encode_scalars_event(1000.5, 3, {{"train/loss", 2.5}}),
                                                 apps::encode_scalars_event(1001.0, 4, {{"val/acc", 0.5}, {"val/loss", 1.0}})}));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_make_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
