// libFuzzer target: a UTF-8 text file as the gpt app's --text-file reads it (data/text.h
// read_text_file, then apps/gpt/lib.h make_lm_data), and the tokenizers on its text:
// the codepoint CharTokenizer must encode and decode the text back to itself, the byte one too,
// and the WordTokenizer with its hashed n-grams must accept any valid UTF-8.
#include "apps/gpt/lib.h"
#include "data/text.h"
#include "data/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

using namespace ag;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* kTarget = "text_file";
  const std::string path = fuzz::write_file("in.txt", fuzz::as_view(data, size));
  std::string text;
  const bool valid = fuzz::ok_or_error(kTarget, [&] { text = data::read_text_file(path); });
  fuzz::expect(kTarget, valid == (data::utf8_invalid_offset(fuzz::as_view(data, size)) < 0),
               "read_text_file and utf8_invalid_offset disagree");
  const std::string ascii = data::to_printable_ascii(fuzz::as_view(data, size));
  for (char c : ascii) fuzz::expect(kTarget, c == '\n' || (c >= 0x20 && c <= 0x7E), "to_printable_ascii: a byte it should drop");
  if (!valid) return 0;

  fuzz::ok_or_error(kTarget, [&] { apps::make_lm_data(text); });
  fuzz::must(kTarget, "the tokenizers on valid UTF-8", [&] {
    const data::CharTokenizer chars = data::CharTokenizer::from_text(text);
    fuzz::expect(kTarget, chars.decode(chars.encode(text)) == text, "CharTokenizer: decode(encode(text)) != text");
    const data::CharTokenizer again = data::CharTokenizer::from_json(chars.to_json());
    fuzz::expect(kTarget, again.codepoints() == chars.codepoints(), "CharTokenizer: to_json + from_json changed it");
    const data::CharTokenizer bytes = data::CharTokenizer::bytes();
    fuzz::expect(kTarget, bytes.decode(bytes.encode(text)) == text, "byte CharTokenizer: decode(encode(text)) != text");

    const data::WordTokenizer words = data::WordTokenizer::build({text});
    const data::WordTokenizer words_again = data::WordTokenizer::from_json(words.to_json());
    fuzz::expect(kTarget, words_again.tokens() == words.tokens(), "WordTokenizer: to_json + from_json changed it");
    const std::vector<int64_t> ids = words.encode(text);
    for (int64_t id : ids) fuzz::expect(kTarget, id >= 2 && id < words.vocab_size(), "WordTokenizer: a word of the text is unknown");
    words.decode(ids);
    for (const std::string& w : data::word_split(text))
      for (int64_t h : data::hashed_ngrams(w, {.buckets = 1000}))
        fuzz::expect(kTarget, h >= 1 && h <= 1000, "hashed_ngrams: an id out of [1, buckets]");
  });
  return 0;
}
