// libFuzzer target: an aclImdb folder (data/text.h load_imdb). The input is the reviews joined by
// kSplit; review k becomes <root>/train/{neg,pos}/<k>_<rating>.txt (even k: neg, odd k: pos), and
// a review starting with "#" is written as <k>_<rating>.feat instead (a file the loader skips).
#include "data/text.h"
#include "tests/fuzz/fuzz_common.h"

using namespace ag;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* kTarget = "imdb";
  const std::string root = fuzz::fresh_dir("aclImdb");
  fuzz::fresh_dir("aclImdb/train/neg");
  fuzz::fresh_dir("aclImdb/train/pos");
  const auto parts = fuzz::split_parts(fuzz::as_view(data, size), 16);
  for (size_t k = 0; k < parts.size(); ++k) {
    const char* ext = parts[k].starts_with("#") ? ".feat" : ".txt";
    fuzz::write_file(fmt::format("aclImdb/train/{}/{}_{}{}", k % 2 ? "pos" : "neg", k, k % 10 + 1, ext), parts[k]);
  }
  data::TextDataset ds;
  if (!fuzz::ok_or_error(kTarget, [&] { ds = data::load_imdb(root, "train"); })) return 0;
  fuzz::expect(kTarget, ds.classes.size() == 2 && ds.size() >= 2, "load_imdb: classes or count wrong");
  for (const auto& e : ds.examples) {
    fuzz::expect(kTarget, e.label == 0 || e.label == 1, "load_imdb: a label out of range");
    fuzz::expect(kTarget, data::utf8_invalid_offset(e.text) < 0, "load_imdb: a text that is not valid UTF-8");
    fuzz::expect(kTarget, e.text.find("<br />") == std::string::npos, "load_imdb: a <br /> left in a text");
  }
  return 0;
}
