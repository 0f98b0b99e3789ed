// Text corpora: UTF-8 checks, fortune files, aclImdb, TSV, the KJV Bible. Formats in data/text.h.
#include "data/text.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <unordered_map>

#include "core/error.h"
#include "core/kernels.h"

namespace fs = std::filesystem;

namespace ag::data {

// ---- UTF-8 ----------------------------------------------------------------------------------

namespace {
// Length of the valid sequence starting at s[i], or 0 when it is invalid (format in text.h).
int utf8_sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return uint8_t(s[k]); };
  const size_t n = s.size();
  uint8_t c = b(i);
  if (c < 0x80) return 1;
  int len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // below: overlong
    if (c == 0xED) hi = 0x9F;  // above: surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;  // below: overlong
    if (c == 0xF4) hi = 0x8F;  // above: > U+10FFFF
  } else
    return 0;  // stray continuation byte, 0xC0/0xC1 (overlong) or 0xF5..0xFF
  if (i + size_t(len) > n) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (int k = 2; k < len; ++k)
    if ((b(i + size_t(k)) & 0xC0) != 0x80) return 0;
  return len;
}
}  // namespace

int64_t utf8_invalid_offset(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    // fast path: a run of ASCII bytes
    while (i < bytes.size() && uint8_t(bytes[i]) < 0x80) ++i;
    if (i == bytes.size()) break;
    int len = utf8_sequence_length(bytes, i);
    if (len == 0) return int64_t(i);
    i += size_t(len);
  }
  return -1;
}

void check_utf8(std::string_view bytes, const std::string& what) {
  int64_t at = utf8_invalid_offset(bytes);
  check(at < 0, "{}: invalid UTF-8 at byte offset {} (byte 0x{:02X})", what, at,
        at < 0 ? 0u : unsigned(uint8_t(bytes[size_t(at)])));
}

std::vector<uint32_t> utf8_decode(std::string_view bytes, const std::string& what) {
  check_utf8(bytes, what);
  std::vector<uint32_t> out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    uint32_t c = uint8_t(bytes[i]);
    int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(bytes[i + size_t(k)]) & 0x3F);
    out.push_back(cp);
    i += size_t(len);
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  check(cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF), "utf8_append: U+{:04X} is not a Unicode scalar value",
        cp);
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// ---- plain files ----------------------------------------------------------------------------

std::string read_file_bytes(const std::string& path) {
  std::error_code ec;
  check(!fs::is_directory(path, ec), "read_file: {} is a folder, not a file", path);
  std::ifstream f(path, std::ios::binary);
  check(f.is_open(), "read_file: cannot open {}", path);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  check(!f.bad(), "read_file: error while reading {}", path);
  return bytes;
}

std::string read_text_file(const std::string& path) {
  std::string bytes = read_file_bytes(path);
  check_utf8(bytes, "read_text_file: " + path);
  return bytes;
}

std::string to_printable_ascii(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    auto c = uint8_t(ch);
    if (c == '\t') out += ' ';
    else if (c == '\n' || (c >= 0x20 && c <= 0x7E)) out += ch;
    // everything else ('\r', other control bytes, every byte of a non-ASCII codepoint) is dropped
  }
  return out;
}

// ---- labelled text ----------------------------------------------------------------------------

std::vector<int64_t> TextDataset::class_counts() const {
  std::vector<int64_t> counts(classes.size(), 0);
  for (size_t i = 0; i < examples.size(); ++i) {
    int label = examples[i].label;
    check(label >= 0 && size_t(label) < classes.size(), "class_counts: example {} has label {} but there are {} classes",
          i, label, classes.size());
    counts[size_t(label)] += 1;
  }
  return counts;
}

uint64_t philox_below(uint64_t seed, uint64_t stream, uint64_t i, uint64_t n) {
  // key = seed mixed with the stream (golden-ratio increment), counter = i; 64 random bits
  // scaled to [0, n) by a 128-bit multiply (Lemire). The bias, n / 2^64, is far below anything
  // measurable, and the result is the same on every machine.
  Philox4 r = philox4x32_10(seed + stream * 0x9E3779B97F4A7C15ull, i);
  uint64_t x = (uint64_t(r.v[0]) << 32) | r.v[1];
  // high 64 bits of the 128-bit product x * n, from 32-bit halves (portable C++)
  uint64_t x_hi = x >> 32, x_lo = x & 0xFFFFFFFFu, n_hi = n >> 32, n_lo = n & 0xFFFFFFFFu;
  uint64_t lo_lo = x_lo * n_lo, hi_lo = x_hi * n_lo, lo_hi = x_lo * n_hi, hi_hi = x_hi * n_hi;
  uint64_t mid = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFu) + (lo_hi & 0xFFFFFFFFu);
  return hi_hi + (hi_lo >> 32) + (lo_hi >> 32) + (mid >> 32);
}

namespace {
// Fisher-Yates from the back: position i swaps with a uniform j in [0, i].
template <class T>
void philox_shuffle(std::vector<T>& v, uint64_t seed, uint64_t stream) {
  for (size_t i = v.size(); i > 1; --i) {
    size_t j = size_t(philox_below(seed, stream, i - 1, i));
    std::swap(v[i - 1], v[j]);
  }
}
}  // namespace

TextSplit split_dataset(const TextDataset& all, uint64_t seed, double valid_fraction, double test_fraction) {
  check(valid_fraction >= 0 && test_fraction >= 0 && valid_fraction + test_fraction <= 1,
        "split_dataset: fractions valid {} and test {} must be >= 0 with a sum <= 1", valid_fraction, test_fraction);
  TextSplit s;
  for (TextDataset* part : {&s.train, &s.valid, &s.test}) part->classes = all.classes;
  std::vector<std::vector<size_t>> by_class(all.classes.size());
  for (size_t i = 0; i < all.examples.size(); ++i) {
    int label = all.examples[i].label;
    check(label >= 0 && size_t(label) < all.classes.size(), "split_dataset: example {} has label {} but there are {} classes",
          i, label, all.classes.size());
    by_class[size_t(label)].push_back(i);
  }
  for (size_t c = 0; c < by_class.size(); ++c) {
    std::vector<size_t>& idx = by_class[c];
    philox_shuffle(idx, seed, c);
    const size_t n = idx.size();
    size_t n_valid = size_t(std::llround(double(n) * valid_fraction));
    size_t n_test = std::min(n - n_valid, size_t(std::llround(double(n) * test_fraction)));
    size_t n_train = n - n_valid - n_test;
    for (size_t k = 0; k < n; ++k) {
      TextDataset& part = k < n_train ? s.train : k < n_train + n_valid ? s.valid : s.test;
      part.examples.push_back(all.examples[idx[k]]);
    }
  }
  // mix the classes: one more shuffle per part, on streams no class uses
  uint64_t stream = uint64_t(1) << 32;
  for (TextDataset* part : {&s.train, &s.valid, &s.test}) philox_shuffle(part->examples, seed, stream++);
  return s;
}

// ---- Debian fortunes --------------------------------------------------------------------------

// Which fortune file holds which language. Derived once, by hand, from `dpkg -L <package>` for
// fortunes, fortunes-min, fortunes-de, fortunes-es, fortunes-it, fortunes-br, fortunes-ru,
// fortunes-cs and fortunes-pl (Debian 12), then checked by reading the files:
// - fortunes and fortunes-min put the English files at the top level. fortunes-br adds one more
//   top-level file, "brasil" (Brazilian Portuguese). fortunes-it installs its files in it/ and
//   top-level symlinks to them (italia -> it/italia, formiche, luttazzi, ...), which are skipped
//   like every symlink, so Italian is read from it/ only.
// - de/, es/, ru/, cs/, pl/ are folders of one language each; es/off/ (and the empty top-level
//   off/) hold the offensive Spanish fortunes and are skipped. fortunes-cs also installs cz/ and
//   sk/, which hold only symlinks into cs/, so they need no rows.
// Any other file (other fortune packages, e.g. fortunes-fr or fortune-zh) is not read.
// All files of these nine packages are UTF-8 (checked: none fails check_utf8), so there is no
// Latin-1/KOI8 decoding; a file that is not UTF-8 would be skipped with its offset in `skipped`.
const std::vector<FortuneSource>& fortune_sources() {
  static const std::vector<FortuneSource> table = {
      {"art", "en", "fortunes"},           {"ascii-art", "en", "fortunes"},   {"computers", "en", "fortunes"},
      {"cookie", "en", "fortunes"},        {"debian", "en", "fortunes"},      {"definitions", "en", "fortunes"},
      {"disclaimer", "en", "fortunes"},    {"drugs", "en", "fortunes"},       {"education", "en", "fortunes"},
      {"ethnic", "en", "fortunes"},        {"food", "en", "fortunes"},        {"goedel", "en", "fortunes"},
      {"humorists", "en", "fortunes"},     {"kids", "en", "fortunes"},        {"knghtbrd", "en", "fortunes"},
      {"law", "en", "fortunes"},           {"linux", "en", "fortunes"},       {"linuxcookie", "en", "fortunes"},
      {"love", "en", "fortunes"},          {"magic", "en", "fortunes"},       {"medicine", "en", "fortunes"},
      {"men-women", "en", "fortunes"},     {"miscellaneous", "en", "fortunes"}, {"news", "en", "fortunes"},
      {"paradoxum", "en", "fortunes"},     {"people", "en", "fortunes"},      {"perl", "en", "fortunes"},
      {"pets", "en", "fortunes"},          {"platitudes", "en", "fortunes"},  {"politics", "en", "fortunes"},
      {"pratchett", "en", "fortunes"},     {"science", "en", "fortunes"},     {"songs-poems", "en", "fortunes"},
      {"sports", "en", "fortunes"},        {"startrek", "en", "fortunes"},    {"tao", "en", "fortunes"},
      {"translate-me", "en", "fortunes"},  {"wisdom", "en", "fortunes"},      {"work", "en", "fortunes"},
      {"zippy", "en", "fortunes"},         {"fortunes", "en", "fortunes-min"}, {"literature", "en", "fortunes-min"},
      {"riddles", "en", "fortunes-min"},   {"de/", "de", "fortunes-de"},      {"es/", "es", "fortunes-es"},
      {"it/", "it", "fortunes-it"},        {"brasil", "pt", "fortunes-br"},   {"ru/", "ru", "fortunes-ru"},
      {"cs/", "cs", "fortunes-cs"},        {"pl/", "pl", "fortunes-pl"},
  };
  return table;
}

// Files of the table that are not text in their package's language.
const std::vector<FortuneExclusion>& fortune_exclusions() {
  static const std::vector<FortuneExclusion> table = {
      {"ascii-art", "ASCII art, no language"},
      {"de/asciiart", "ASCII art, no language"},
      {"it/banner", "ASCII-art banners, no language"},
      {"cs/klasik-sk", "Slovak, not Czech (fortunes-cs links it from sk/)"},
  };
  return table;
}

const std::vector<std::string>& fortune_languages() {
  static const std::vector<std::string> langs = {"en", "de", "es", "it", "pt", "ru", "cs", "pl"};
  return langs;
}

namespace {
std::string_view trim_space(std::string_view s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The entries of fortune text `bytes` (format in text.h).
std::vector<std::string> split_fortunes(std::string_view bytes) {
  std::vector<std::string> entries;
  size_t entry_begin = 0, pos = 0;
  auto flush = [&](size_t end) {
    std::string_view e = trim_space(bytes.substr(entry_begin, end - entry_begin));
    if (!e.empty()) entries.emplace_back(e);
  };
  while (pos < bytes.size()) {
    size_t nl = bytes.find('\n', pos);
    size_t line_end = nl == std::string_view::npos ? bytes.size() : nl;
    std::string_view line = bytes.substr(pos, line_end - pos);
    if (line == "%" || line == "%\r") {
      flush(pos);
      entry_begin = nl == std::string_view::npos ? bytes.size() : nl + 1;
    }
    pos = nl == std::string_view::npos ? bytes.size() : nl + 1;
  }
  flush(bytes.size());
  return entries;
}
}  // namespace

std::vector<std::string> read_fortune_file(const std::string& path) {
  std::string bytes = read_file_bytes(path);
  check_utf8(bytes, "read_fortune_file: " + path);
  return split_fortunes(bytes);
}

namespace {
// The fortune files of the table under `root`, as (path relative to root, label), sorted by path.
std::vector<std::pair<std::string, int>> fortune_files(const fs::path& root, std::vector<std::string>& skipped) {
  const std::vector<std::string>& langs = fortune_languages();
  auto label_of = [&](const char* lang) {
    return int(std::find(langs.begin(), langs.end(), std::string(lang)) - langs.begin());
  };
  auto excluded = [&](const std::string& rel) {
    for (const FortuneExclusion& x : fortune_exclusions())
      if (rel == x.path) return true;
    return false;
  };
  auto wanted = [&](const fs::directory_entry& e) {  // a regular file, not a symlink, not an index
    std::string name = e.path().filename().string();
    return e.is_regular_file() && !e.is_symlink() && !ends_with(name, ".dat") && !ends_with(name, ".u8");
  };
  std::vector<std::pair<std::string, int>> files;
  for (const FortuneSource& src : fortune_sources()) {
    std::string rel = src.path;
    int label = label_of(src.language);
    std::error_code ec;
    fs::path p = root / rel;
    if (ends_with(rel, "/")) {
      if (!fs::is_directory(fs::symlink_status(p, ec))) {
        skipped.push_back(fmt::format("{}: missing (package {} not installed)", p.string(), src.package));
        continue;
      }
      fs::recursive_directory_iterator it(p, ec), end;  // does not follow folder symlinks
      check(!ec, "load_fortunes: cannot list {}: {}", p.string(), ec.message());
      for (; it != end; it.increment(ec)) {
        check(!ec, "load_fortunes: cannot list {}: {}", p.string(), ec.message());
        if (it->is_directory() && !it->is_symlink() && it->path().filename() == "off") {
          it.disable_recursion_pending();  // offensive fortunes
          continue;
        }
        if (!wanted(*it)) continue;
        std::string r = fs::relative(it->path(), root).generic_string();
        if (!excluded(r)) files.emplace_back(r, label);
      }
    } else {
      fs::directory_entry e(p, ec);
      if (ec || !wanted(e)) {
        skipped.push_back(fmt::format("{}: missing or not a regular file (package {})", p.string(), src.package));
        continue;
      }
      if (!excluded(rel)) files.emplace_back(rel, label);
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}
}  // namespace

TextDataset load_fortunes(const std::string& root) {
  TextDataset ds;
  ds.classes = fortune_languages();
  std::error_code ec;
  check(fs::is_directory(root, ec), "load_fortunes: {} is not a folder (install the Debian packages fortunes "
        "fortunes-de fortunes-es fortunes-it fortunes-br fortunes-ru fortunes-cs fortunes-pl)", root);
  std::vector<std::pair<std::string, int>> files = fortune_files(root, ds.skipped);
  check(!files.empty(), "load_fortunes: {} holds none of the fortune files of the table (fortune_sources())", root);

  // De-duplicate: the first copy of a text stays; a text seen under two labels is ambiguous.
  std::vector<TextExample> all;
  std::vector<bool> ambiguous;
  std::unordered_map<std::string, size_t> first;
  for (const auto& [rel, label] : files) {
    std::string path = (fs::path(root) / rel).string();
    std::string bytes = read_file_bytes(path);
    if (int64_t at = utf8_invalid_offset(bytes); at >= 0) {
      ds.skipped.push_back(fmt::format("{}: invalid UTF-8 at byte offset {}", path, at));
      continue;
    }
    for (std::string& e : split_fortunes(bytes)) {
      auto [it, inserted] = first.try_emplace(e, all.size());
      if (inserted) {
        all.push_back({std::move(e), label});
        ambiguous.push_back(false);
      } else if (all[it->second].label != label) {
        ambiguous[it->second] = true;
      }
    }
  }
  for (size_t i = 0; i < all.size(); ++i)
    if (!ambiguous[i]) ds.examples.push_back(std::move(all[i]));
  return ds;
}

std::string fortunes_english_text(const std::string& root) {
  TextDataset ds = load_fortunes(root);
  std::string text;
  for (const TextExample& e : ds.examples)
    if (e.label == 0) {  // "en"
      text += e.text;
      text += "\n\n";
    }
  check(!text.empty(), "fortunes_english_text: no English fortunes under {} (install the Debian package fortunes)",
        root);
  return to_printable_ascii(text);
}

// ---- aclImdb and TSV -------------------------------------------------------------------------

TextDataset load_imdb(const std::string& root, const std::string& split) {
  check(split == "train" || split == "test", "load_imdb: split must be \"train\" or \"test\", got \"{}\"", split);
  TextDataset ds;
  ds.classes = {"neg", "pos"};
  for (int label = 0; label < 2; ++label) {
    fs::path dir = fs::path(root) / split / ds.classes[size_t(label)];
    std::error_code ec;
    check(fs::is_directory(dir, ec), "load_imdb: {} is not a folder (expected the aclImdb layout "
          "<root>/train|test/pos|neg/*.txt)", dir.string());
    std::vector<fs::path> files;
    for (fs::directory_iterator it(dir, ec), end; it != end; it.increment(ec)) {
      check(!ec, "load_imdb: cannot list {}: {}", dir.string(), ec.message());
      if (it->is_regular_file() && it->path().extension() == ".txt") files.push_back(it->path());
    }
    check(!ec, "load_imdb: cannot list {}: {}", dir.string(), ec.message());
    check(!files.empty(), "load_imdb: {} holds no .txt files", dir.string());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      std::string raw = read_text_file(f.string()), text;
      text.reserve(raw.size());
      for (size_t at = 0; at < raw.size();) {  // "<br />" -> '\n'
        size_t br = raw.find("<br />", at);
        text.append(raw, at, (br == std::string::npos ? raw.size() : br) - at);
        if (br == std::string::npos) break;
        text += '\n';
        at = br + 6;
      }
      ds.examples.push_back({std::move(text), label});
    }
  }
  return ds;
}

TextDataset load_tsv(const std::string& path, const std::vector<std::string>& classes) {
  std::string bytes = read_file_bytes(path);
  struct Row {
    std::string label, text;
  };
  std::vector<Row> rows;
  std::vector<int64_t> line_of;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < bytes.size()) {
    ++line_no;
    size_t nl = bytes.find('\n', pos);
    size_t end = nl == std::string::npos ? bytes.size() : nl;
    std::string_view line(bytes.data() + pos, end - pos);
    pos = nl == std::string::npos ? bytes.size() : nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (trim_space(line).empty()) continue;
    if (int64_t at = utf8_invalid_offset(line); at >= 0)
      fail("load_tsv: {}:{}: invalid UTF-8 at byte offset {} of the line", path, line_no, at);
    size_t tab = line.find('\t');
    check(tab != std::string_view::npos, "load_tsv: {}:{}: no tab between label and text", path, line_no);
    check(tab > 0, "load_tsv: {}:{}: empty label", path, line_no);
    check(tab + 1 < line.size(), "load_tsv: {}:{}: empty text for label \"{}\"", path, line_no, line.substr(0, tab));
    rows.push_back({std::string(line.substr(0, tab)), std::string(line.substr(tab + 1))});
    line_of.push_back(line_no);
  }
  check(!rows.empty(), "load_tsv: {} holds no lines", path);

  TextDataset ds;
  if (classes.empty()) {
    for (const Row& r : rows) ds.classes.push_back(r.label);
    std::sort(ds.classes.begin(), ds.classes.end());
    ds.classes.erase(std::unique(ds.classes.begin(), ds.classes.end()), ds.classes.end());
  } else {
    ds.classes = classes;
  }
  std::map<std::string, int> id;
  for (size_t k = 0; k < ds.classes.size(); ++k) {
    bool fresh = id.emplace(ds.classes[k], int(k)).second;
    check(fresh, "load_tsv: class \"{}\" is listed twice", ds.classes[k]);
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    auto it = id.find(rows[i].label);
    check(it != id.end(), "load_tsv: {}:{}: unknown label \"{}\" ({} classes given)", path, line_of[i], rows[i].label,
          ds.classes.size());
    ds.examples.push_back({std::move(rows[i].text), it->second});
  }
  return ds;
}

// ---- the King James Bible -----------------------------------------------------------------------

std::string load_bible_kjv(const std::string& cache_dir, const std::string& program) {
  fs::path cached = fs::path(cache_dir) / "bible-kjv.txt";
  std::error_code ec;
  if (fs::exists(cached, ec)) {
    std::string text = read_text_file(cached.string());
    check(!text.empty(), "load_bible_kjv: the cached text {} is empty (delete it to regenerate)", cached.string());
    return text;
  }
  check(::access(program.c_str(), X_OK) == 0,
        "load_bible_kjv: {} not found or not executable: install the Debian package bible-kjv "
        "(apt install bible-kjv)", program);
  check(program.find('\'') == std::string::npos, "load_bible_kjv: program path {} contains a quote", program);
  // Pretty-printed (the default): headings, numbered verses, lines broken at 79 columns. COLUMNS
  // is fixed so that the text does not depend on the terminal.
  std::string cmd = "COLUMNS=80 '" + program + "' gen1:1-rev22:21 </dev/null 2>/dev/null";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  check(pipe != nullptr, "load_bible_kjv: cannot run {} (package bible-kjv)", program);
  std::string text;
  char buf[1 << 16];
  for (size_t got; (got = std::fread(buf, 1, sizeof buf, pipe)) > 0;) text.append(buf, got);
  int status = ::pclose(pipe);
  check(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "load_bible_kjv: {} gen1:1-rev22:21 failed (exit status {}; package bible-kjv)", program,
        status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  check(!text.empty(), "load_bible_kjv: {} gen1:1-rev22:21 printed nothing (package bible-kjv)", program);
  check_utf8(text, "load_bible_kjv: output of " + program);

  fs::create_directories(cache_dir, ec);
  check(!ec, "load_bible_kjv: cannot create the cache folder {}: {}", cache_dir, ec.message());
  std::string tmp = cached.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    check(f.is_open(), "load_bible_kjv: cannot write {}", tmp);
    f.write(text.data(), std::streamsize(text.size()));
    f.close();
    check(!f.fail(), "load_bible_kjv: error while writing {}", tmp);
  }
  fs::rename(tmp, cached, ec);
  check(!ec, "load_bible_kjv: cannot rename {} to {}: {}", tmp, cached.string(), ec.message());
  return text;
}

}  // namespace ag::data
