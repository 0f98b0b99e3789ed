// Character and word tokenizers with JSON vocabularies. Formats and id layouts in data/tokenizer.h.
#include "data/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/text.h"

namespace ag::data {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {
constexpr const char* kFormat = "attograd-tokenizer";
constexpr int kVersion = 1;

void write_text(const std::string& path, const std::string& text, const char* op) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  check(f.is_open(), "{}: cannot write {}", op, path);
  f.write(text.data(), std::streamsize(text.size()));
  f.close();
  check(!f.fail(), "{}: error while writing {}", op, path);
}

// Parses a tokenizer object and checks the fields every kind shares.
json parse_header(const std::string& text, const std::string& what, const char* kind) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: malformed JSON: {}", what, e.what());
  }
  check(j.is_object(), "{}: expected a JSON object, got {}", what, j.type_name());
  check(j.contains("format") && j["format"].is_string() && j["format"] == kFormat,
        "{}: \"format\" must be \"{}\"", what, kFormat);
  check(j.contains("version") && j["version"].is_number_integer() && j["version"] == kVersion,
        "{}: unsupported \"version\" (this build reads version {})", what, kVersion);
  check(j.contains("kind") && j["kind"].is_string(), "{}: missing string field \"kind\"", what);
  std::string k = j["kind"].get<std::string>();
  check(k == kind, "{}: kind is \"{}\", expected \"{}\"", what, k, kind);
  return j;
}

// The "vocab" array of strings, each valid UTF-8 (nlohmann checks that while parsing).
std::vector<std::string> vocab_strings(const json& j, const std::string& what) {
  check(j.contains("vocab") && j["vocab"].is_array(), "{}: missing array field \"vocab\"", what);
  std::vector<std::string> out;
  size_t k = 0;
  for (const json& t : j["vocab"]) {
    check(t.is_string(), "{}: vocab entry {} is a {}, not a string", what, k, t.type_name());
    out.push_back(t.get<std::string>());
    ++k;
  }
  return out;
}
}  // namespace

// ---- CharTokenizer ----------------------------------------------------------------------------

CharTokenizer CharTokenizer::bytes() { return CharTokenizer(); }

CharTokenizer CharTokenizer::from_text(std::string_view utf8) {
  std::vector<uint32_t> cps = utf8_decode(utf8, "CharTokenizer::from_text");
  std::sort(cps.begin(), cps.end());
  cps.erase(std::unique(cps.begin(), cps.end()), cps.end());
  CharTokenizer t;
  t.mode_ = Mode::codepoint;
  t.codepoints_ = std::move(cps);
  for (size_t i = 0; i < t.codepoints_.size(); ++i) t.id_[t.codepoints_[i]] = int64_t(i + 1);
  return t;
}

std::vector<int64_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  if (mode_ == Mode::byte) {
    ids.reserve(text.size());
    for (char c : text) ids.push_back(int64_t(uint8_t(c)));
    return ids;
  }
  std::vector<uint32_t> cps = utf8_decode(text, "CharTokenizer::encode");
  ids.reserve(cps.size());
  for (uint32_t cp : cps) {
    auto it = id_.find(cp);
    ids.push_back(it == id_.end() ? kUnk : it->second);
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  const int n = vocab_size();
  for (size_t i = 0; i < ids.size(); ++i) {
    int64_t id = ids[i];
    check(id >= 0 && id < n, "CharTokenizer::decode: id {} at position {} is outside the vocabulary [0, {})", id, i, n);
    if (mode_ == Mode::byte) out += char(uint8_t(id));
    else utf8_append(out, id == kUnk ? 0xFFFDu : codepoints_[size_t(id - 1)]);
  }
  return out;
}

std::string CharTokenizer::to_json() const {
  ordered_json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["kind"] = "char";
  j["mode"] = mode_ == Mode::byte ? "byte" : "codepoint";
  if (mode_ == Mode::codepoint) {
    ordered_json v = ordered_json::array();
    for (uint32_t cp : codepoints_) {
      std::string s;
      utf8_append(s, cp);
      v.push_back(s);
    }
    j["vocab"] = v;
  }
  return j.dump(1) + "\n";
}

CharTokenizer CharTokenizer::from_json(const std::string& text, const std::string& what) {
  json j = parse_header(text, what, "char");
  check(j.contains("mode") && j["mode"].is_string(), "{}: missing string field \"mode\"", what);
  std::string mode = j["mode"].get<std::string>();
  if (mode == "byte") return bytes();
  check(mode == "codepoint", "{}: mode is \"{}\", expected \"byte\" or \"codepoint\"", what, mode);
  std::vector<std::string> vocab = vocab_strings(j, what);
  CharTokenizer t;
  t.mode_ = Mode::codepoint;
  for (size_t k = 0; k < vocab.size(); ++k) {
    std::vector<uint32_t> cp = utf8_decode(vocab[k], what);
    check(cp.size() == 1, "{}: vocab entry {} (\"{}\") must be exactly one codepoint, it has {}", what, k, vocab[k],
          cp.size());
    if (!t.codepoints_.empty()) {
      check(cp[0] != t.codepoints_.back(), "{}: duplicate token \"{}\" (vocab entries {} and {})", what, vocab[k], k - 1, k);
      check(cp[0] > t.codepoints_.back(), "{}: vocab entry {} (U+{:04X}) is not in ascending order after U+{:04X}", what,
            k, cp[0], t.codepoints_.back());
    }
    t.codepoints_.push_back(cp[0]);
    t.id_[cp[0]] = int64_t(k + 1);
  }
  return t;
}

void CharTokenizer::save(const std::string& path) const { write_text(path, to_json(), "CharTokenizer::save"); }

CharTokenizer CharTokenizer::load(const std::string& path) {
  return from_json(read_file_bytes(path), "CharTokenizer::load: " + path);
}

// ---- word splitting ---------------------------------------------------------------------------

uint32_t word_lower(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp < 0xC0) return cp;
  if (cp <= 0xDE) return cp == 0xD7 ? cp : cp + 0x20;  // À..Þ -> à..þ, not ×
  if (cp >= 0x100 && cp <= 0x17F) {
    // Latin Extended-A pairs upper/lower, mostly as (even, odd), in two runs as (odd, even).
    if (cp == 0x130) return 'i';      // İ -> i (simple mapping)
    if (cp == 0x178) return 0xFF;     // Ÿ -> ÿ
    if (cp == 0x138 || cp == 0x149 || cp == 0x17F) return cp;  // ĸ ŉ ſ: lower-case only
    bool odd_upper = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
    return (cp % 2 == 1) == odd_upper ? cp + 1 : cp;
  }
  if (cp >= 0x400 && cp <= 0x40F) return cp + 0x50;  // Ѐ..Џ -> ѐ..џ  (Ё -> ё)
  if (cp >= 0x410 && cp <= 0x42F) return cp + 0x20;  // А..Я -> а..я
  return cp;
}

namespace {
bool word_is_space(uint32_t cp) {
  return cp <= 0x20 || cp == 0x7F || cp == 0x85 || cp == 0xA0 || (cp >= 0x2000 && cp <= 0x200B) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}
}  // namespace

bool word_is_punct(uint32_t cp) {
  if (cp < 0x80) return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
                        (cp >= 0x7B && cp <= 0x7E);
  return (cp >= 0xA1 && cp <= 0xBF) || cp == 0xD7 || cp == 0xF7 || (cp >= 0x2000 && cp <= 0x206F);
}

std::vector<std::string> word_split(std::string_view text, bool layout) {
  std::vector<uint32_t> cps = utf8_decode(text, "word_split");
  std::vector<std::string> tokens;
  std::string word;
  auto flush = [&] {
    if (!word.empty()) tokens.push_back(std::move(word));
    word.clear();
  };
  for (uint32_t cp : cps) {
    if (word_is_space(cp)) {
      flush();
      if (layout && (cp == '\n' || cp == '\t')) tokens.emplace_back(1, char(cp));
    } else if (word_is_punct(cp)) {
      flush();
      std::string p;
      utf8_append(p, cp);
      tokens.push_back(std::move(p));
    } else {
      utf8_append(word, word_lower(cp));
    }
  }
  flush();
  return tokens;
}

// ---- hashed n-grams ---------------------------------------------------------------------------

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::vector<int64_t> hashed_ngrams(std::string_view token, const NgramSpec& s) {
  check(s.buckets >= 0 && s.min_n >= 1 && s.max_n >= s.min_n && s.max_per_token >= 1,
        "hashed_ngrams: expected buckets >= 0, 1 <= min_n <= max_n and max_per_token >= 1, got buckets {}, n {}..{}, "
        "max_per_token {}",
        s.buckets, s.min_n, s.max_n, s.max_per_token);
  std::vector<int64_t> ids;
  if (s.buckets == 0) return ids;
  utf8_decode(token, "hashed_ngrams");  // validates; the n-grams below cut at codepoint starts
  std::string w = "<";
  w.append(token);
  w += '>';
  std::vector<size_t> starts;  // byte offset of each codepoint of w, then w.size()
  for (size_t i = 0; i < w.size(); ++i)
    if ((static_cast<unsigned char>(w[i]) & 0xC0) != 0x80) starts.push_back(i);
  starts.push_back(w.size());
  const auto cps = int64_t(starts.size()) - 1;
  for (int64_t n = s.min_n; n <= s.max_n; ++n)
    for (int64_t i = 0; i + n <= cps; ++i) {
      if (int64_t(ids.size()) == s.max_per_token) return ids;
      const size_t a = starts[size_t(i)], b = starts[size_t(i + n)];
      ids.push_back(1 + int64_t(fnv1a64(std::string_view(w).substr(a, b - a)) % uint64_t(s.buckets)));
    }
  return ids;
}

// ---- WordTokenizer ----------------------------------------------------------------------------

void WordTokenizer::index(const std::string& what) {
  id_.clear();
  for (size_t k = 0; k < tokens_.size(); ++k) {
    check(!tokens_[k].empty(), "{}: vocab entry {} is an empty token", what, k);
    auto [it, fresh] = id_.emplace(tokens_[k], int64_t(k));
    check(fresh, "{}: duplicate token \"{}\" (vocab entries {} and {})", what, tokens_[k], it->second, k);
  }
}

WordTokenizer WordTokenizer::build(const std::vector<std::string>& texts, int min_freq, int max_size, bool layout) {
  check(min_freq >= 1, "WordTokenizer::build: min_freq must be >= 1, got {}", min_freq);
  check(max_size >= 2, "WordTokenizer::build: max_size must be >= 2 (<pad> and <unk>), got {}", max_size);
  std::unordered_map<std::string, int64_t> counts;
  for (const std::string& t : texts)
    for (std::string& w : word_split(t, layout)) counts[std::move(w)] += 1;
  std::vector<std::pair<std::string, int64_t>> kept;
  for (auto& [w, c] : counts)
    if (c >= min_freq) kept.emplace_back(w, c);  // no token can be "<pad>": "<" and ">" split off
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;  // frequent first, then bytes
  });
  WordTokenizer t;
  t.layout_ = layout;
  t.tokens_ = {"<pad>", "<unk>"};
  for (size_t k = 0; k < kept.size() && t.tokens_.size() < size_t(max_size); ++k) t.tokens_.push_back(kept[k].first);
  t.index("WordTokenizer::build");
  return t;
}

const std::string& WordTokenizer::token(int64_t id) const {
  check(id >= 0 && size_t(id) < tokens_.size(), "WordTokenizer::token: id {} is outside the vocabulary [0, {})", id,
        tokens_.size());
  return tokens_[size_t(id)];
}

int64_t WordTokenizer::id(const std::string& token) const {
  auto it = id_.find(token);
  return it == id_.end() ? kUnk : it->second;
}

std::vector<int64_t> WordTokenizer::encode(std::string_view text, int max_len) const {
  check(max_len >= 0, "WordTokenizer::encode: max_len must be >= 0 (0: no limit), got {}", max_len);
  std::vector<int64_t> ids;
  for (const std::string& w : word_split(text, layout_)) {
    if (max_len > 0 && ids.size() == size_t(max_len)) break;
    ids.push_back(id(w));
  }
  return ids;
}

std::vector<int64_t> WordTokenizer::encode_padded(std::string_view text, int len) const {
  check(len >= 1, "WordTokenizer::encode_padded: len must be >= 1, got {}", len);
  std::vector<int64_t> ids = encode(text, len);
  ids.resize(size_t(len), kPad);
  return ids;
}

std::string WordTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    check(ids[i] >= 0 && size_t(ids[i]) < tokens_.size(),
          "WordTokenizer::decode: id {} at position {} is outside the vocabulary [0, {})", ids[i], i, tokens_.size());
    if (ids[i] == kPad) continue;
    if (!out.empty()) out += ' ';
    out += tokens_[size_t(ids[i])];
  }
  return out;
}

std::string WordTokenizer::to_json() const {
  ordered_json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["kind"] = "word";
  j["layout"] = layout_;
  j["vocab"] = tokens_;
  return j.dump(1) + "\n";
}

WordTokenizer WordTokenizer::from_json(const std::string& text, const std::string& what) {
  json j = parse_header(text, what, "word");
  WordTokenizer t;
  if (j.contains("layout")) {  // absent in files made before it: off
    check(j["layout"].is_boolean(), "{}: \"layout\" must be true or false, got {}", what, j["layout"].dump());
    t.layout_ = j["layout"].get<bool>();
  }
  t.tokens_ = vocab_strings(j, what);
  check(t.tokens_.size() >= 2 && t.tokens_[0] == "<pad>" && t.tokens_[1] == "<unk>",
        "{}: the vocab must start with \"<pad>\", \"<unk>\" (ids 0 and 1)", what);
  t.index(what);
  return t;
}

void WordTokenizer::save(const std::string& path) const { write_text(path, to_json(), "WordTokenizer::save"); }

WordTokenizer WordTokenizer::load(const std::string& path) {
  return from_json(read_file_bytes(path), "WordTokenizer::load: " + path);
}

}  // namespace ag::data
