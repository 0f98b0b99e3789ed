#pragma once
// Tokenizers: text <-> integer ids for the embedding tables of the sample apps.
//
// CharTokenizer, two modes:
//   byte       ids 0..255 are the bytes of the text; vocab_size 256; any byte string encodes.
//   codepoint  id 0 is <unk>, ids 1..n are the distinct codepoints of the training text in
//              ascending order; vocab_size n + 1. Text is validated as UTF-8; a codepoint not in
//              the vocabulary encodes to <unk> and decodes to U+FFFD.
// WordTokenizer: lower-cases (ASCII, Latin-1, Latin Extended-A, basic Cyrillic; see
//   word_lower), splits on whitespace, and makes every punctuation codepoint a token of its own
//   ("don't!" -> "don" "'" "t" "!"). ids 0 = <pad>, 1 = <unk>, then the words seen at least
//   min_freq times, most frequent first (ties in byte order), up to max_size ids in all.
// hashed_ngrams: fastText's subword features of one token (Bojanowski et al. 2017): the
//   character n-grams of "<" + token + ">", hashed into a fixed number of buckets (below).
//
// Vocabulary files are JSON, one object (nlohmann/json):
//   {"format": "attograd-tokenizer", "version": 1, "kind": "char", "mode": "byte"}
//   {"format": "attograd-tokenizer", "version": 1, "kind": "char", "mode": "codepoint",
//    "vocab": ["\n", " ", "!", ...]}                      (ids 1..n: one codepoint each, ascending)
//   {"format": "attograd-tokenizer", "version": 1, "kind": "word", "layout": false,
//    "vocab": ["<pad>", "<unk>", "the", ...]}             (ids 0..n-1, unique non-empty tokens;
//                                                         "layout" optional, false when absent)
// Loading validates all of it (malformed JSON, another format or kind, an unknown version,
// duplicate or unsorted tokens) and raises ag::Error naming the file. to_json()/from_json() give
// the same object as a string, for storing inside a checkpoint's metadata.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ag::data {

class CharTokenizer {
 public:
  enum class Mode { byte, codepoint };

  static CharTokenizer bytes();                            // the 256-id byte tokenizer
  static CharTokenizer from_text(std::string_view utf8);  // codepoint vocabulary of `utf8`

  Mode mode() const { return mode_; }
  int vocab_size() const { return mode_ == Mode::byte ? 256 : int(codepoints_.size()) + 1; }
  static constexpr int64_t kUnk = 0;  // codepoint mode only
  const std::vector<uint32_t>& codepoints() const { return codepoints_; }  // ids 1..n

  std::vector<int64_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int64_t>& ids) const;  // ids out of range: ag::Error

  std::string to_json() const;
  static CharTokenizer from_json(const std::string& json, const std::string& what = "CharTokenizer::from_json");
  void save(const std::string& path) const;
  static CharTokenizer load(const std::string& path);

 private:
  Mode mode_ = Mode::byte;
  std::vector<uint32_t> codepoints_;                 // ascending
  std::unordered_map<uint32_t, int64_t> id_;        // codepoint -> id
};

// The lower-case form of one codepoint: ASCII A-Z, Latin-1 (U+00C0..U+00DE without U+00D7),
// Latin Extended-A (U+0100..U+017F, as Unicode's simple lower-case mapping), Cyrillic U+0400..U+042F.
// Every other codepoint is returned unchanged.
uint32_t word_lower(uint32_t cp);
// Whether a codepoint is punctuation (a token of its own): ASCII punctuation and symbols,
// U+00A1..U+00BF, U+00D7, U+00F7, General Punctuation U+2000..U+206F (dashes, quotes, ellipsis).
bool word_is_punct(uint32_t cp);
// The tokens of `text` (UTF-8, checked): lower-cased words and single punctuation codepoints.
// Whitespace separates them; with `layout` each newline and each tab is also a token of its own
// ("\n", "\t"), so that the shape of a text (line breaks, indented attributions) is seen.
std::vector<std::string> word_split(std::string_view text, bool layout = false);

// Subword features of one token, as fastText (Bojanowski et al. 2017, "Enriching Word Vectors with
// Subword Information"): the n-grams of w = "<" + token + ">" for n = min_n..max_n, counted in
// codepoints (UTF-8 aware: a Cyrillic letter is 2 bytes but one codepoint), each hashed with
// 64-bit FNV-1a over its UTF-8 bytes into an id in 1..buckets:
//   id(g) = 1 + fnv1a64(bytes of g) mod buckets          (0 is left for padding)
// Order: by n ascending, then by start position; ids repeat when n-grams (or their hashes) do.
// At most max_per_token ids are returned: when cut, the shorter n-grams are kept (the first ids
// of that order). Every token gets its n-grams, punctuation too: "!" gives "<!", "!>", "<!>".
//   "ab", n 2..3:  "<a" "ab" "b>" "<ab" "ab>"
// The token must be valid UTF-8 (ag::Error otherwise); buckets >= 1, 1 <= min_n <= max_n,
// max_per_token >= 1 (ag::Error naming the values otherwise).
struct NgramSpec {
  int64_t buckets = 0;  // 0: no n-grams (hashed_ngrams then returns none)
  int64_t min_n = 2, max_n = 5, max_per_token = 32;
};
std::vector<int64_t> hashed_ngrams(std::string_view token, const NgramSpec& spec);
// 64-bit FNV-1a: h = 0xcbf29ce484222325; for each byte c: h = (h xor c) * 0x100000001b3 (mod 2^64).
uint64_t fnv1a64(std::string_view bytes);

class WordTokenizer {
 public:
  static constexpr int64_t kPad = 0, kUnk = 1;

  // Vocabulary from `texts`: tokens seen at least `min_freq` times, most frequent first, at most
  // `max_size` ids counting <pad> and <unk> (max_size >= 2, min_freq >= 1); `layout`: word_split's
  // newline and tab tokens (kept in the JSON form, so a loaded tokenizer splits the same way).
  static WordTokenizer build(const std::vector<std::string>& texts, int min_freq = 1, int max_size = 1 << 30,
                             bool layout = false);
  bool layout() const { return layout_; }

  int vocab_size() const { return int(tokens_.size()); }
  const std::vector<std::string>& tokens() const { return tokens_; }
  const std::string& token(int64_t id) const;  // out of range: ag::Error
  int64_t id(const std::string& token) const;  // kUnk when absent

  // The ids of the tokens of `text`; with max_len > 0 only the first max_len of them.
  std::vector<int64_t> encode(std::string_view text, int max_len = 0) const;
  // Exactly `len` ids: truncated, or padded at the end with kPad.
  std::vector<int64_t> encode_padded(std::string_view text, int len) const;
  // The tokens joined by single spaces, <pad> left out.
  std::string decode(const std::vector<int64_t>& ids) const;

  std::string to_json() const;
  static WordTokenizer from_json(const std::string& json, const std::string& what = "WordTokenizer::from_json");
  void save(const std::string& path) const;
  static WordTokenizer load(const std::string& path);

 private:
  std::vector<std::string> tokens_;                  // id -> token
  std::unordered_map<std::string, int64_t> id_;      // token -> id
  bool layout_ = false;                              // word_split(text, layout_)
  void index(const std::string& what);               // fills id_, rejecting duplicates
};

}  // namespace ag::data
