// libFuzzer target: tokenizer vocabulary files (data/tokenizer.h: the JSON the char and word
// tokenizers save and load, also stored in checkpoints) and the textclf app's wrapper of them
// (apps/textclf/lib.h TextTokenizer::from_json). What loads must save and load back
// unchanged, and decode every id of its vocabulary.
#include "apps/textclf/lib.h"
#include "data/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

using namespace ag;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* kTarget = "tokenizer";
  const std::string path = fuzz::write_file("vocab.json", fuzz::as_view(data, size));

  data::CharTokenizer chars;
  if (fuzz::ok_or_error(kTarget, [&] { chars = data::CharTokenizer::load(path); }))
    fuzz::must(kTarget, "the loaded CharTokenizer", [&] {
      const std::string again = fuzz::scratch_path("again.json");
      chars.save(again);
      fuzz::expect(kTarget, data::CharTokenizer::load(again).codepoints() == chars.codepoints() &&
                                data::CharTokenizer::load(again).mode() == chars.mode(),
                   "CharTokenizer: save + load changed it");
      std::vector<int64_t> all(size_t(chars.vocab_size()));
      for (size_t i = 0; i < all.size(); ++i) all[i] = int64_t(i);
      const std::string text = chars.decode(all);
      if (chars.mode() == data::CharTokenizer::Mode::codepoint) {
        // <unk> decodes to U+FFFD, which encodes back to <unk> unless the vocabulary holds it
        std::vector<int64_t> ids = chars.encode(text);
        fuzz::expect(kTarget, ids.size() == all.size(), "CharTokenizer: decode + encode changed the length");
        for (size_t i = 1; i < ids.size(); ++i) fuzz::expect(kTarget, ids[i] == all[i], "CharTokenizer: decode + encode changed an id");
      }
    });

  data::WordTokenizer words;
  if (fuzz::ok_or_error(kTarget, [&] { words = data::WordTokenizer::load(path); }))
    fuzz::must(kTarget, "the loaded WordTokenizer", [&] {
      const std::string again = fuzz::scratch_path("again.json");
      words.save(again);
      fuzz::expect(kTarget, data::WordTokenizer::load(again).tokens() == words.tokens(), "WordTokenizer: save + load changed it");
      for (int64_t i = 0; i < words.vocab_size(); ++i)
        fuzz::expect(kTarget, words.id(words.token(i)) == i, "WordTokenizer: id(token(i)) != i");
    });

  apps::textclf::TextTokenizer tok;
  if (fuzz::ok_or_error(kTarget, [&] { tok = apps::textclf::TextTokenizer::from_json(std::string(fuzz::as_view(data, size))); }))
    fuzz::must(kTarget, "the loaded TextTokenizer", [&] {
      apps::textclf::TextTokenizer::from_json(tok.to_json());
      for (int64_t i = 0; i < tok.vocab_size(); ++i) tok.label(i);
    });
  return 0;
}
