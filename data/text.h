#pragma once
// Text corpora for the sample apps: labelled text for classification (Debian's fortune files,
// the aclImdb folder layout, a plain TSV) and running text for character-level language models
// (the King James Bible of Debian's bible-kjv, the English fortunes, any UTF-8 file).
//
// Every text handed out is valid UTF-8. Every problem (missing file or folder, invalid UTF-8,
// a malformed line) raises ag::Error naming the file and the offending value or position.
//
// ---- File formats, exactly ----------------------------------------------------------------
//
// UTF-8 (RFC 3629). A codepoint is one of
//   0xxxxxxx                              U+0000..U+007F
//   110xxxxx 10xxxxxx                     U+0080..U+07FF     (lead 0xC2..0xDF)
//   1110xxxx 10xxxxxx 10xxxxxx            U+0800..U+FFFF     minus the surrogates U+D800..U+DFFF
//   11110xxx 10xxxxxx 10xxxxxx 10xxxxxx   U+10000..U+10FFFF  (lead 0xF0..0xF4)
// Overlong forms (0xC0, 0xC1, E0 80..9F, F0 80..8F), surrogates (ED A0..BF), codepoints above
// U+10FFFF (F4 90.., F5..FF), stray continuation bytes and truncated sequences are invalid.
// A byte-order mark is an ordinary codepoint (U+FEFF) here.
//
// Fortune file (fortune(6), strfile(8)): UTF-8 text; entries are separated by lines that hold
// exactly "%" (a trailing '\r' is tolerated). An entry is the text between two separators with
// leading and trailing whitespace (space, \t, \r, \n) removed; empty entries are dropped.
// Beside each file <name> lie <name>.dat (strfile's binary index, not text) and, in newer
// packages, <name>.u8 (a symlink to <name>); both are skipped, as are all symlinks.
//
// aclImdb (Maas et al. 2011, ai.stanford.edu/~amaas/data/sentiment/):
//   <root>/<split>/pos/<id>_<rating>.txt     one review per file, UTF-8, label "pos"
//   <root>/<split>/neg/<id>_<rating>.txt     label "neg"
// <split> is "train" or "test"; other files and folders (unsup/, *.feat, urls_*.txt) are ignored.
// Reviews contain HTML line breaks "<br />", which become '\n'.
//
// TSV: UTF-8 lines "label<TAB>text" ending in '\n' (or "\r\n"; the last line may lack it). The
// label is everything before the first tab, the text everything after it (it may hold more
// tabs). Blank lines are skipped; a line without a tab, with an empty label or with an empty
// text is an error naming the file and the 1-based line number.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ag::data {

// ---- UTF-8 ----------------------------------------------------------------------------------

// Byte offset of the first invalid byte of `bytes`, or -1 when all of it is valid UTF-8.
int64_t utf8_invalid_offset(std::string_view bytes);
// Raises ag::Error "<what>: invalid UTF-8 at byte offset <k> (byte 0x..)" unless `bytes` is valid.
void check_utf8(std::string_view bytes, const std::string& what);
// The codepoints of valid UTF-8 (checked, as check_utf8).
std::vector<uint32_t> utf8_decode(std::string_view bytes, const std::string& what = "utf8_decode");
// Appends the UTF-8 form of codepoint `cp` (<= U+10FFFF, not a surrogate) to `out`.
void utf8_append(std::string& out, uint32_t cp);

// ---- plain files ----------------------------------------------------------------------------

// The bytes of a file (ag::Error naming it when it cannot be opened or read).
std::string read_file_bytes(const std::string& path);
// The contents of a UTF-8 text file: read_file_bytes + check_utf8 (the error gives the offset).
std::string read_text_file(const std::string& path);
// `text` with every byte outside printable ASCII (0x20..0x7E) and '\n' removed, tabs turned into
// one space and "\r\n" into "\n": what the English fortunes become for a byte-level model.
std::string to_printable_ascii(std::string_view text);

// ---- labelled text ----------------------------------------------------------------------------

struct TextExample {
  std::string text;  // valid UTF-8
  int label;         // index into TextDataset::classes
};

struct TextDataset {
  std::vector<std::string> classes;   // label names; label k is classes[k]
  std::vector<TextExample> examples;  // in a deterministic order (see each loader)
  std::vector<std::string> skipped;   // "<path>: <reason>": files passed over for missing packages
                                      // or invalid UTF-8 (.dat/.u8 files and symlinks: silently)

  int64_t size() const { return int64_t(examples.size()); }
  int num_classes() const { return int(classes.size()); }
  std::vector<int64_t> class_counts() const;  // examples per label
};

struct TextSplit {
  TextDataset train, valid, test;
};

// Splits `all` into train/valid/test, deterministically on every machine: within each class the
// examples are shuffled by a Fisher-Yates shuffle whose draws come from Philox4x32-10
// (core/kernels.h) keyed by `seed`, and the first round(n * (1 - valid - test)) go to train, the
// next round(n * valid) to valid, the rest to test (stratified: every class keeps its share). Each
// part is then shuffled once more (same generator, another stream) so that classes are mixed.
// The three parts are disjoint and together hold every example exactly once.
TextSplit split_dataset(const TextDataset& all, uint64_t seed, double valid_fraction = 0.1,
                        double test_fraction = 0.1);

// A uniform integer in [0, n) from Philox4x32-10 keyed by `seed` at position (`stream`, `i`):
// the draw behind split_dataset, exposed so that apps can shuffle the same way.
uint64_t philox_below(uint64_t seed, uint64_t stream, uint64_t i, uint64_t n);

// ---- Debian fortunes: language identification -----------------------------------------------

// Where the Debian packages put the fortune files.
inline constexpr const char* kFortuneRoot = "/usr/share/games/fortunes";

// One row of the fixed table that says which files hold which language (see text.cpp for how it
// was derived from `dpkg -L`): `path` is relative to the fortune root; a path ending in '/' is a
// folder, read recursively (skipping subfolders named "off", the offensive fortunes).
struct FortuneSource {
  const char* path;
  const char* language;  // ISO 639-1: en de es it pt ru cs pl
  const char* package;   // the Debian package that installs it
};
const std::vector<FortuneSource>& fortune_sources();
// Files inside the folders above that are left out, with the reason (ASCII art, another language).
struct FortuneExclusion {
  const char* path;
  const char* reason;
};
const std::vector<FortuneExclusion>& fortune_exclusions();
// The languages in label order: en de es it pt ru cs pl.
const std::vector<std::string>& fortune_languages();

// The entries of one fortune file (format above), in file order, without de-duplication.
std::vector<std::string> read_fortune_file(const std::string& path);

// Every fortune entry of the table under `root`, labelled with its language (classes =
// fortune_languages()). Files are read in sorted path order; entries are de-duplicated (the
// first copy stays); a text that occurs under two languages is dropped from both (its label is
// unknown). Missing packages are not an error (their files are listed in `skipped`), but a root
// holding none of the table's files is. Files that are not valid UTF-8 are skipped with the
// offset of the first bad byte in `skipped`.
TextDataset load_fortunes(const std::string& root = kFortuneRoot);

// The English fortunes as one running text for a character-level model: the English entries of
// load_fortunes in order, each followed by "\n\n", cleaned by to_printable_ascii (~2.5 MB).
std::string fortunes_english_text(const std::string& root = kFortuneRoot);

// ---- aclImdb and TSV -------------------------------------------------------------------------

// One split ("train" or "test") of an aclImdb folder: classes {"neg", "pos"}, negatives first,
// each class in sorted file-name order.
TextDataset load_imdb(const std::string& root, const std::string& split);

// A TSV file (format above). With `classes` empty the classes are the distinct labels, sorted;
// otherwise labels must be among `classes` (so a test file gets the training file's ids) and
// an unknown label is an error with its line number.
TextDataset load_tsv(const std::string& path, const std::vector<std::string>& classes = {});

// ---- running text for character-level models ------------------------------------------------

// The King James Bible as printed by the `bible` program of Debian's bible-kjv
// (`bible gen1:1-rev22:21`: book and chapter headings, numbered verses, lines of at most 79
// columns; 4,298,239 bytes of ASCII with 73 distinct characters). The first call runs `program`
// once and writes its output to <cache_dir>/bible-kjv.txt (atomically); later calls read that
// file. Raises ag::Error naming the package when the program is missing or fails.
std::string load_bible_kjv(const std::string& cache_dir, const std::string& program = "/usr/bin/bible");

}  // namespace ag::data
