// Text corpora (UTF-8, fortunes, aclImdb, TSV, the KJV Bible) and tokenizers (char, word).
// Unit tests build small synthetic files in a TempDir; the tests named "real data" read the
// installed Debian packages and print "[skipped: ...]" where they are absent.
#include <filesystem>
#include <set>

#include "data/text.h"
#include "data/tokenizer.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::data;
using namespace ag::test;
namespace fs = std::filesystem;

namespace {
std::vector<std::string> texts_of(const TextDataset& ds) {
  std::vector<std::string> out;
  for (const TextExample& e : ds.examples) out.push_back(e.text);
  return out;
}
std::vector<int> labels_of(const TextDataset& ds) {
  std::vector<int> out;
  for (const TextExample& e : ds.examples) out.push_back(e.label);
  return out;
}
void write_file(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  write_bytes(p.string(), bytes);
}
void write_script(const fs::path& p, const std::string& body) {
  write_file(p, "#!/bin/sh\n" + body);
  fs::permissions(p, fs::perms::owner_all);
}
}  // namespace

// ---- UTF-8 ----------------------------------------------------------------------------------

TEST_CASE("utf8: decoding known values") {
  // "a" U+0061 (1 byte), "é" U+00E9 = C3 A9, "€" U+20AC = E2 82 AC, "😀" U+1F600 = F0 9F 98 80
  std::string s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";
  CHECK(utf8_decode(s) == std::vector<uint32_t>{0x61, 0xE9, 0x20AC, 0x1F600});
  std::string back;
  for (uint32_t cp : {0x61u, 0xE9u, 0x20ACu, 0x1F600u}) utf8_append(back, cp);
  CHECK(back == s);
  // the boundaries of each length: U+007F, U+0080, U+07FF, U+0800, U+FFFF, U+10000, U+10FFFF
  std::string edges;
  for (uint32_t cp : {0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFFu, 0x10000u, 0x10FFFFu}) utf8_append(edges, cp);
  CHECK(edges == "\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF");
  CHECK(utf8_decode(edges) == std::vector<uint32_t>{0x7F, 0x80, 0x7FF, 0x800, 0xFFFF, 0x10000, 0x10FFFF});
  CHECK(utf8_invalid_offset("") == -1);
  AG_CHECK_ERROR(utf8_append(back, 0xD800), "utf8_append", "U+D800");
  AG_CHECK_ERROR(utf8_append(back, 0x110000), "utf8_append", "U+110000");
}

TEST_CASE("utf8: every kind of invalid input is found at its byte offset") {
  CHECK(utf8_invalid_offset("ab\x80") == 2);                 // stray continuation byte
  CHECK(utf8_invalid_offset("a\xC0\xAF") == 1);              // overlong '/'
  CHECK(utf8_invalid_offset("\xC1\xBF") == 0);               // overlong
  CHECK(utf8_invalid_offset("xy\xE0\x80\x80") == 2);         // overlong 3-byte
  CHECK(utf8_invalid_offset("\xF0\x80\x80\x80") == 0);       // overlong 4-byte
  CHECK(utf8_invalid_offset("ok\xED\xA0\x80") == 2);         // surrogate U+D800
  CHECK(utf8_invalid_offset("\xF4\x90\x80\x80") == 0);       // U+110000
  CHECK(utf8_invalid_offset("\xF5\x80\x80\x80") == 0);       // lead byte beyond U+10FFFF
  CHECK(utf8_invalid_offset("abc\xE2\x82") == 3);            // truncated at the end
  CHECK(utf8_invalid_offset("\xE2\x82x") == 0);              // continuation missing
  CHECK(utf8_invalid_offset("\xC3\xA9\xFF") == 2);           // valid, then 0xFF
  AG_CHECK_ERROR(check_utf8("abc\xE2\x82", "mytext"), "mytext", "invalid UTF-8 at byte offset 3", "0xE2");
  AG_CHECK_ERROR(utf8_decode("\xC3(", "dec"), "dec", "offset 0", "0xC3");
}

TEST_CASE("read_text_file: validates UTF-8 and names the file") {
  TempDir tmp("text_read");
  write_bytes(tmp.file("good.txt"), "h\xC3\xA9llo\n");
  CHECK(read_text_file(tmp.file("good.txt")) == "h\xC3\xA9llo\n");
  write_bytes(tmp.file("bad.txt"), "hello w\xF6rld");  // Latin-1 ö
  AG_CHECK_ERROR(read_text_file(tmp.file("bad.txt")), "bad.txt", "byte offset 7", "0xF6");
  AG_CHECK_ERROR(read_text_file(tmp.file("missing.txt")), "cannot open", "missing.txt");
  AG_CHECK_ERROR(read_text_file(tmp.dir.string()), "is a folder");
}

TEST_CASE("to_printable_ascii: keeps printable ASCII and newlines") {
  // tab -> space, "\r\n" -> "\n", é (2 bytes) and a bell (0x07) dropped
  CHECK(to_printable_ascii("caf\xC3\xA9\tbar\r\nbaz\x07~") == "caf bar\nbaz~");
}

// ---- fortunes -----------------------------------------------------------------------------------

TEST_CASE("fortunes: read_fortune_file splits on lines holding only %") {
  TempDir tmp("fortune_file");
  // entries: "one" (trimmed), an empty entry, "two\n%not a separator" (% not alone on its line),
  // "three" after a CRLF separator, and a last entry without a final separator
  write_bytes(tmp.file("f"), "  one  \n%\n\n%\ntwo\n%not a separator\n%\r\nthree\n%\nlast\n");
  CHECK(read_fortune_file(tmp.file("f")) ==
        std::vector<std::string>{"one", "two\n%not a separator", "three", "last"});
  write_bytes(tmp.file("g"), "%\n%\n");
  CHECK(read_fortune_file(tmp.file("g")).empty());
  write_bytes(tmp.file("h"), "ok\n%\n\xC0\xAF\n");
  AG_CHECK_ERROR(read_fortune_file(tmp.file("h")), "read_fortune_file", "/h", "byte offset 5");
}

TEST_CASE("fortunes: a synthetic tree gives the right entries and labels") {
  TempDir tmp("fortunes");
  fs::path r = tmp.dir;
  // English: duplicates inside and across files, an empty entry
  write_file(r / "fortunes", "Hello world.\n%\nSame text\n%\n\n%\nHello world.\n");
  write_file(r / "riddles", "What is it?\n%\nSame text\n");
  write_file(r / "fortunes.dat", std::string("\x00\x00\x00\x02\xff\xfe", 6));  // strfile index: skipped
  fs::create_symlink("fortunes", r / "fortunes.u8");                          // skipped
  write_file(r / "unknown-package", "Not in the table\n");                      // not read
  write_file(r / "brasil", "Ol\xC3\xA1 mundo\n");                              // pt
  write_file(r / "it" / "italia", "Ciao mondo\n%\nHello world.\n");  // "Hello world." also en: dropped
  fs::create_symlink("it/italia", r / "italia");                     // top-level link: skipped
  write_file(r / "it" / "banner", "###\n");                          // excluded: ASCII art
  write_file(r / "de" / "witze", "Guten Tag\n%\nGuten Tag\n");      // de, duplicate
  write_file(r / "es" / "vida.fortunes", "Hola\n");
  write_file(r / "es" / "off" / "malo.fortunes", "Ofensivo\n");     // offensive: skipped
  write_file(r / "cs" / "citat", "Dobr\xC3\xBD den\n");
  write_file(r / "cs" / "klasik-sk", "Dobr\xC3\xBD de\xC5\x88\n");  // Slovak: excluded
  write_file(r / "ru" / "life", "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82\n");  // Привет
  write_file(r / "pl" / "misc", "Cze\xB6\xE6\n");                   // ISO-8859-2, not UTF-8: skipped

  TextDataset ds = load_fortunes(r.string());
  CHECK(ds.classes == std::vector<std::string>{"en", "de", "es", "it", "pt", "ru", "cs", "pl"});
  // files in sorted path order: brasil, cs/citat, de/witze, es/vida.fortunes, fortunes, it/italia,
  // pl/misc (invalid), riddles, ru/life
  CHECK(texts_of(ds) == std::vector<std::string>{"Ol\xC3\xA1 mundo", "Dobr\xC3\xBD den", "Guten Tag", "Hola", "Same text",
                                                 "Ciao mondo", "What is it?", "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"});
  CHECK(labels_of(ds) == std::vector<int>{4, 6, 1, 2, 0, 3, 0, 5});
  CHECK(ds.class_counts() == std::vector<int64_t>{2, 1, 1, 1, 1, 1, 1, 0});
  bool pl_skipped = false;
  for (const std::string& s : ds.skipped)
    if (s.find("pl/misc") != std::string::npos && s.find("byte offset 3") != std::string::npos) pl_skipped = true;
  CHECK(pl_skipped);
  // the English text for a char model: entries in order, "\n\n" after each
  CHECK(fortunes_english_text(r.string()) == "Same text\n\nWhat is it?\n\n");
}

TEST_CASE("fortunes: errors name the root") {
  TempDir tmp("fortunes_err");
  AG_CHECK_ERROR(load_fortunes(tmp.file("nope")), "load_fortunes", "nope", "is not a folder", "fortunes-de");
  AG_CHECK_ERROR(load_fortunes(tmp.dir.string()), "load_fortunes", "holds none of the fortune files");
  write_file(tmp.dir / "de" / "witze", "Guten Tag\n");
  AG_CHECK_ERROR(fortunes_english_text(tmp.dir.string()), "fortunes_english_text", "no English fortunes");
}

TEST_CASE("fortunes: the table covers the eight languages and its exclusions are in it") {
  std::set<std::string> langs;
  for (const FortuneSource& s : fortune_sources()) langs.insert(s.language);
  CHECK(langs == std::set<std::string>(fortune_languages().begin(), fortune_languages().end()));
  CHECK(fortune_languages().size() == 8);
  for (const FortuneExclusion& x : fortune_exclusions()) {
    std::string p = x.path;
    bool covered = false;
    for (const FortuneSource& s : fortune_sources()) {
      std::string sp = s.path;
      covered |= p == sp || (sp.back() == '/' && p.rfind(sp, 0) == 0);
    }
    CHECK_MESSAGE(covered, p);
  }
}

// ---- split ------------------------------------------------------------------------------------

TEST_CASE("split_dataset: deterministic, disjoint, stratified") {
  TextDataset all;
  all.classes = {"a", "b", "c"};
  const int n_per[3] = {50, 20, 10};
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < n_per[c]; ++i) all.examples.push_back({fmt::format("{}{}", all.classes[size_t(c)], i), c});

  TextSplit s1 = split_dataset(all, 42), s2 = split_dataset(all, 42), s3 = split_dataset(all, 43);
  CHECK(texts_of(s1.train) == texts_of(s2.train));
  CHECK(texts_of(s1.valid) == texts_of(s2.valid));
  CHECK(texts_of(s1.test) == texts_of(s2.test));
  CHECK(texts_of(s1.train) != texts_of(s3.train));
  // 80/10/10 within each class
  CHECK(s1.train.class_counts() == std::vector<int64_t>{40, 16, 8});
  CHECK(s1.valid.class_counts() == std::vector<int64_t>{5, 2, 1});
  CHECK(s1.test.class_counts() == std::vector<int64_t>{5, 2, 1});
  CHECK(s1.test.classes == all.classes);
  // disjoint, and together every example once, with its label
  std::multiset<std::string> seen;
  for (const TextDataset* p : {&s1.train, &s1.valid, &s1.test})
    for (const TextExample& e : p->examples) {
      seen.insert(e.text);
      CHECK(e.text[0] == all.classes[size_t(e.label)][0]);
    }
  std::vector<std::string> all_texts = texts_of(all);
  CHECK(seen == std::multiset<std::string>(all_texts.begin(), all_texts.end()));
  // the classes are mixed, not in blocks
  CHECK(labels_of(s1.train) != [] { std::vector<int> v(40, 0); v.resize(56, 1); v.resize(64, 2); return v; }());
  // the same on every machine: the draws are a pure function of the seed (Philox4x32-10), so the
  // split is pinned here; a change to the shuffle or the generator shows up as a failure
  CHECK(texts_of(s1.valid) == std::vector<std::string>{"b8", "a9", "c9", "a33", "a49", "a7", "b1", "a1"});
  // uneven fractions and corner cases
  TextSplit s4 = split_dataset(all, 7, 0.0, 0.5);
  CHECK(s4.valid.size() == 0);
  CHECK(s4.test.class_counts() == std::vector<int64_t>{25, 10, 5});
  AG_CHECK_ERROR(split_dataset(all, 1, 0.6, 0.5), "split_dataset", "0.6", "0.5");
  AG_CHECK_ERROR(split_dataset(all, 1, -0.1, 0.1), "split_dataset", "-0.1");
  TextDataset bad = all;
  bad.examples[3].label = 5;
  AG_CHECK_ERROR(split_dataset(bad, 1), "split_dataset", "example 3 has label 5", "3 classes");
  AG_CHECK_ERROR(bad.class_counts(), "class_counts", "example 3 has label 5", "3 classes");
}

TEST_CASE("philox_below: in range, seeded, position-addressed") {
  std::set<uint64_t> values;
  for (uint64_t i = 0; i < 1000; ++i) {
    uint64_t v = philox_below(9, 0, i, 10);
    CHECK(v < 10);
    values.insert(v);
  }
  CHECK(values.size() == 10);  // 1000 draws hit every value of [0, 10)
  CHECK(philox_below(9, 0, 5, 1) == 0);
  CHECK(philox_below(9, 0, 5, 1000003) == philox_below(9, 0, 5, 1000003));
  int differ = 0;
  for (uint64_t i = 0; i < 20; ++i) differ += philox_below(9, 0, i, 1u << 30) != philox_below(9, 1, i, 1u << 30);
  CHECK(differ >= 19);  // another stream, other numbers
  // n near 2^64 uses all 64 bits: the draw is x * n / 2^64 with x from Philox, so it is not n-1 always
  CHECK(philox_below(1, 0, 0, ~uint64_t(0)) != philox_below(1, 0, 1, ~uint64_t(0)));
}

// ---- aclImdb and TSV -------------------------------------------------------------------------

TEST_CASE("imdb: the aclImdb layout") {
  TempDir tmp("imdb");
  fs::path r = tmp.dir;
  write_file(r / "train" / "pos" / "1_9.txt", "Great film.<br /><br />Loved it.");
  write_file(r / "train" / "pos" / "0_7.txt", "Good.");
  write_file(r / "train" / "neg" / "0_2.txt", "Bad.");
  write_file(r / "train" / "neg" / "notes.feat", "ignored");
  write_file(r / "train" / "unsup" / "0_0.txt", "ignored");
  write_file(r / "train" / "urls_pos.txt", "ignored");
  TextDataset ds = load_imdb(r.string(), "train");
  CHECK(ds.classes == std::vector<std::string>{"neg", "pos"});
  CHECK(texts_of(ds) == std::vector<std::string>{"Bad.", "Good.", "Great film.\n\nLoved it."});
  CHECK(labels_of(ds) == std::vector<int>{0, 1, 1});

  AG_CHECK_ERROR(load_imdb(r.string(), "dev"), "load_imdb", "\"dev\"");
  AG_CHECK_ERROR(load_imdb(r.string(), "test"), "load_imdb", "test/neg", "is not a folder");
  write_file(r / "test" / "neg" / "0_1.txt", "Meh.");
  fs::create_directories(r / "test" / "pos");
  AG_CHECK_ERROR(load_imdb(r.string(), "test"), "load_imdb", "test/pos", "no .txt files");
  write_file(r / "test" / "pos" / "0_8.txt", "Tr\xE8s bien");  // Latin-1
  AG_CHECK_ERROR(load_imdb(r.string(), "test"), "0_8.txt", "byte offset 2");
}

TEST_CASE("tsv: labels, text with tabs, CRLF, blank lines") {
  TempDir tmp("tsv");
  write_bytes(tmp.file("a.tsv"), "spam\tBuy now\r\nham\tHi\tthere\n\n  \nspam\tWin\n");
  TextDataset ds = load_tsv(tmp.file("a.tsv"));
  CHECK(ds.classes == std::vector<std::string>{"ham", "spam"});  // sorted
  CHECK(texts_of(ds) == std::vector<std::string>{"Buy now", "Hi\tthere", "Win"});
  CHECK(labels_of(ds) == std::vector<int>{1, 0, 1});
  // a test file takes the training file's classes
  write_bytes(tmp.file("b.tsv"), "spam\tx");  // no final newline
  TextDataset t = load_tsv(tmp.file("b.tsv"), {"ham", "spam", "eggs"});
  CHECK(labels_of(t) == std::vector<int>{1});
  CHECK(t.classes.size() == 3);
}

TEST_CASE("tsv: errors give the file and the line number") {
  TempDir tmp("tsv_err");
  write_bytes(tmp.file("e1.tsv"), "a\tok\nno tab here\n");
  AG_CHECK_ERROR(load_tsv(tmp.file("e1.tsv")), "load_tsv", "e1.tsv:2", "no tab");
  write_bytes(tmp.file("e2.tsv"), "a\tok\n\nb\tok\n\tlabel missing\n");
  AG_CHECK_ERROR(load_tsv(tmp.file("e2.tsv")), "e2.tsv:4", "empty label");
  write_bytes(tmp.file("e3.tsv"), "a\t\n");
  AG_CHECK_ERROR(load_tsv(tmp.file("e3.tsv")), "e3.tsv:1", "empty text", "\"a\"");
  write_bytes(tmp.file("e4.tsv"), "a\tok\nc\tok\n");
  AG_CHECK_ERROR(load_tsv(tmp.file("e4.tsv"), {"a", "b"}), "e4.tsv:2", "unknown label \"c\"");
  write_bytes(tmp.file("e5.tsv"), "a\tok\na\tb\xFFz\n");
  AG_CHECK_ERROR(load_tsv(tmp.file("e5.tsv")), "e5.tsv:2", "invalid UTF-8", "offset 3");
  write_bytes(tmp.file("e6.tsv"), "\n\n");
  AG_CHECK_ERROR(load_tsv(tmp.file("e6.tsv")), "e6.tsv", "no lines");
  AG_CHECK_ERROR(load_tsv(tmp.file("e4.tsv"), {"a", "c", "a"}), "load_tsv", "\"a\" is listed twice");
  AG_CHECK_ERROR(load_tsv(tmp.file("missing.tsv")), "cannot open", "missing.tsv");
}

// ---- the Bible --------------------------------------------------------------------------------

TEST_CASE("bible: runs the program once, then reads the cache") {
  TempDir tmp("bible");
  fs::path prog = tmp.dir / "fake-bible";
  // the fake prints its arguments, so the test sees that the whole range was asked for
  write_script(prog, "printf 'Genesis 1\\n\\n  1 In the beginning %s\\n' \"$1\"\n");
  std::string cache = (tmp.dir / "cache").string();
  std::string text = load_bible_kjv(cache, prog.string());
  CHECK(text == "Genesis 1\n\n  1 In the beginning gen1:1-rev22:21\n");
  CHECK(read_bytes(cache + "/bible-kjv.txt") == text);
  fs::remove(prog);
  CHECK(load_bible_kjv(cache, prog.string()) == text);  // from the cache; the program is gone

  std::string cache2 = (tmp.dir / "cache2").string();
  AG_CHECK_ERROR(load_bible_kjv(cache2, prog.string()), "load_bible_kjv", "fake-bible", "bible-kjv");
  write_script(prog, "echo partial; exit 3\n");
  AG_CHECK_ERROR(load_bible_kjv(cache2, prog.string()), "load_bible_kjv", "exit status 3", "bible-kjv");
  write_script(prog, "exit 0\n");
  AG_CHECK_ERROR(load_bible_kjv(cache2, prog.string()), "load_bible_kjv", "printed nothing");
  CHECK_FALSE(fs::exists(cache2 + "/bible-kjv.txt"));  // failures leave no cache
  write_bytes(cache + "/bible-kjv.txt", "bad \xFF");
  AG_CHECK_ERROR(load_bible_kjv(cache, prog.string()), "bible-kjv.txt", "byte offset 4");
}

// ---- CharTokenizer ----------------------------------------------------------------------------

TEST_CASE("CharTokenizer: byte mode encodes any bytes and round trips") {
  CharTokenizer t = CharTokenizer::bytes();
  CHECK(t.vocab_size() == 256);
  std::string s = "A\xC3\xA9\xFF";  // bytes 65, 195, 169, 255; need not be UTF-8
  CHECK(t.encode(s) == std::vector<int64_t>{65, 195, 169, 255});
  CHECK(t.decode(t.encode(s)) == s);
  AG_CHECK_ERROR(t.decode({65, 256}), "CharTokenizer::decode", "id 256 at position 1", "[0, 256)");
  AG_CHECK_ERROR(t.decode({-1}), "CharTokenizer::decode", "id -1");
}

TEST_CASE("CharTokenizer: codepoint vocabulary, sorted, with <unk>") {
  // distinct codepoints of "hallo wélt": ' ' 'a' 'h' 'l' 'o' 't' 'w' 'é' -> ids 1..8, <unk> = 0
  CharTokenizer t = CharTokenizer::from_text("hallo w\xC3\xA9lt");
  CHECK(t.mode() == CharTokenizer::Mode::codepoint);
  CHECK(t.vocab_size() == 9);
  CHECK(t.codepoints() == std::vector<uint32_t>{' ', 'a', 'h', 'l', 'o', 't', 'w', 0xE9});
  CHECK(t.encode("w\xC3\xA9lt") == std::vector<int64_t>{7, 8, 4, 6});
  CHECK(t.decode({7, 8, 4, 6}) == "w\xC3\xA9lt");
  // unseen 'x' and '€' become <unk>, which decodes to U+FFFD
  CHECK(t.encode("ax\xE2\x82\xAC") == std::vector<int64_t>{2, 0, 0});
  CHECK(t.decode({2, 0}) == "a\xEF\xBF\xBD");
  AG_CHECK_ERROR(t.encode("a\xC3"), "CharTokenizer::encode", "byte offset 1");
  AG_CHECK_ERROR(CharTokenizer::from_text("\xFF"), "CharTokenizer::from_text", "offset 0");
  AG_CHECK_ERROR(t.decode({9}), "CharTokenizer::decode", "id 9", "[0, 9)");
}

TEST_CASE("CharTokenizer: save and load round trip") {
  TempDir tmp("chartok");
  CharTokenizer t = CharTokenizer::from_text("ab\n\"\\\t\xD0\xAF\xF0\x9F\x98\x80");  // control, quote, Я, 😀
  t.save(tmp.file("v.json"));
  CharTokenizer u = CharTokenizer::load(tmp.file("v.json"));
  CHECK(u.mode() == CharTokenizer::Mode::codepoint);
  CHECK(u.codepoints() == t.codepoints());
  CHECK(u.encode("b\xD0\xAF?") == t.encode("b\xD0\xAF?"));
  CHECK(CharTokenizer::from_json(t.to_json()).codepoints() == t.codepoints());
  CharTokenizer::bytes().save(tmp.file("b.json"));
  CHECK(CharTokenizer::load(tmp.file("b.json")).mode() == CharTokenizer::Mode::byte);
}

TEST_CASE("CharTokenizer: corrupt vocabulary files name the file and the problem") {
  TempDir tmp("chartok_bad");
  auto load_text = [&](const std::string& name, const std::string& text) {
    write_bytes(tmp.file(name), text);
    return CharTokenizer::load(tmp.file(name));
  };
  const std::string head = R"({"format": "attograd-tokenizer", "version": 1, "kind": "char", )";
  AG_CHECK_ERROR(load_text("t1.json", "{\"format\": "), "t1.json", "malformed JSON");
  AG_CHECK_ERROR(load_text("t2.json", "[1, 2]"), "t2.json", "expected a JSON object");
  AG_CHECK_ERROR(load_text("t3.json", R"({"format": "other", "version": 1, "kind": "char", "mode": "byte"})"), "t3.json",
                 "\"format\"");
  AG_CHECK_ERROR(load_text("t4.json", R"({"format": "attograd-tokenizer", "version": 2, "kind": "char"})"), "t4.json",
                 "version");
  AG_CHECK_ERROR(load_text("t5.json", R"({"format": "attograd-tokenizer", "version": 1, "kind": "word", "vocab": []})"),
                 "t5.json", "kind is \"word\", expected \"char\"");
  AG_CHECK_ERROR(load_text("t6.json", head + R"("mode": "bits"})"), "t6.json", "\"bits\"");
  AG_CHECK_ERROR(load_text("t7.json", head + R"("mode": "codepoint", "vocab": ["a", "b", "b"]})"), "t7.json",
                 "duplicate token \"b\"", "entries 1 and 2");
  AG_CHECK_ERROR(load_text("t8.json", head + R"("mode": "codepoint", "vocab": ["b", "a"]})"), "t8.json",
                 "not in ascending order");
  AG_CHECK_ERROR(load_text("t9.json", head + R"("mode": "codepoint", "vocab": ["ab"]})"), "t9.json",
                 "exactly one codepoint", "it has 2");
  AG_CHECK_ERROR(load_text("t10.json", head + R"("mode": "codepoint", "vocab": ["a", 7]})"), "t10.json",
                 "vocab entry 1 is a number");
  AG_CHECK_ERROR(load_text("t11.json", head + R"("mode": "codepoint"})"), "t11.json", "\"vocab\"");
  AG_CHECK_ERROR(CharTokenizer::load(tmp.file("absent.json")), "cannot open", "absent.json");
}

// ---- WordTokenizer ----------------------------------------------------------------------------

TEST_CASE("word_split: lower-cases and splits punctuation") {
  CHECK(word_split("Don't panic!  Hello,world...") ==
        std::vector<std::string>{"don", "'", "t", "panic", "!", "hello", ",", "world", ".", ".", "."});
  // Ä -> ä (Latin-1), Ł -> ł (Latin Ext-A, even/odd pair), Ř -> ř, Ё -> ё and Я -> я (Cyrillic),
  // « » and the em dash U+2014 are punctuation; NBSP U+00A0 separates
  CHECK(word_split("\xC3\x84pfel \xC5\x81\xC3\xB3" "d\xC5\xBA \xC5\x98\xC3\xAD\x6A\xC3\xA9 \xD0\x81\xD0\xAF\xC2\xA0"
                   "\xC2\xAB" "a\xE2\x80\x94" "b\xC2\xBB") ==
        std::vector<std::string>{"\xC3\xA4pfel", "\xC5\x82\xC3\xB3" "d\xC5\xBA", "\xC5\x99\xC3\xAD\x6A\xC3\xA9",
                                 "\xD1\x91\xD1\x8F", "\xC2\xAB", "a", "\xE2\x80\x94", "b", "\xC2\xBB"});
  CHECK(word_lower(0xD7) == 0xD7);    // × is not a letter
  CHECK(word_lower(0x130) == 'i');    // İ
  CHECK(word_lower(0x178) == 0xFF);   // Ÿ -> ÿ
  CHECK(word_lower(0x139) == 0x13A);  // Ĺ -> ĺ (odd/even run)
  CHECK(word_lower(0x17D) == 0x17E);  // Ž -> ž
  CHECK(word_lower(0x17E) == 0x17E);
  CHECK(word_lower(0x0391) == 0x0391);  // Greek: unchanged (not in the table)
  CHECK(word_split(" \t\n").empty());
  // layout: each newline and tab is a token, other whitespace still only separates
  CHECK(word_split("Hi,\n\n\t\t-- Me  now\r\n", /*layout=*/true) ==
        std::vector<std::string>{"hi", ",", "\n", "\n", "\t", "\t", "-", "-", "me", "now", "\n"});
  CHECK(word_split(" \t\n", true) == std::vector<std::string>{"\t", "\n"});
  AG_CHECK_ERROR(word_split("ok \xE0\x80"), "word_split", "offset 3");
}

TEST_CASE("hashed_ngrams: FNV-1a ids of the n-grams of <token>, UTF-8 aware, cut to the shorter n") {
  // FNV-1a 64 test vectors (Fowler/Noll/Vo's reference list): "" is the offset basis
  CHECK(fnv1a64("") == 0xcbf29ce484222325ull);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  CHECK(fnv1a64("foobar") == 0x85944171f73967e8ull);
  auto id = [](const char* g) { return int64_t(1 + fnv1a64(g) % 1000); };  // the rule, bucket count 1000
  // "ab", n 2..3: "<ab>" gives "<a" "ab" "b>", then "<ab" "ab>" (n ascending, then position);
  // the ids, from a separate Python FNV-1a: 783 763 10 45 757
  const NgramSpec s{.buckets = 1000, .min_n = 2, .max_n = 3, .max_per_token = 32};
  CHECK(hashed_ngrams("ab", s) == std::vector<int64_t>{id("<a"), id("ab"), id("b>"), id("<ab"), id("ab>")});
  CHECK(hashed_ngrams("ab", s) == std::vector<int64_t>{783, 763, 10, 45, 757});
  // Cyrillic "мир" (2 bytes a letter): n-grams cut at codepoints, 5 codepoints with the brackets:
  // "<м" "ми" "ир" "р>" then "<ми" "мир" "ир>"  ->  640 10 797 175 632 721 831 ("ми" shares id 10
  // with "b>": two strings, one bucket)
  const char* mir = "\xD0\xBC\xD0\xB8\xD1\x80";
  CHECK(hashed_ngrams(mir, s) == std::vector<int64_t>{id("<\xD0\xBC"), id("\xD0\xBC\xD0\xB8"), id("\xD0\xB8\xD1\x80"),
                                                      id("\xD1\x80>"), id("<\xD0\xBC\xD0\xB8"), id(mir), id("\xD0\xB8\xD1\x80>")});
  CHECK(hashed_ngrams(mir, s) == std::vector<int64_t>{640, 10, 797, 175, 632, 721, 831});
  // max_per_token 5 keeps the four 2-grams and the first 3-gram
  NgramSpec cut = s;
  cut.max_per_token = 5;
  CHECK(hashed_ngrams(mir, cut) == std::vector<int64_t>{640, 10, 797, 175, 632});
  // punctuation is a token like any other: "!" -> "<!" "!>" "<!>"
  CHECK(hashed_ngrams("!", s) == std::vector<int64_t>{id("<!"), id("!>"), id("<!>")});
  // n longer than "<token>": none of that length; n = 1 includes the brackets; ids in 1..buckets
  const NgramSpec unigrams{.buckets = 3, .min_n = 1, .max_n = 9, .max_per_token = 100};
  std::vector<int64_t> ab = hashed_ngrams("ab", unigrams);
  CHECK(ab.size() == 4 + 3 + 2 + 1);
  for (int64_t i : ab) CHECK((i >= 1 && i <= 3));
  CHECK(hashed_ngrams("ab", NgramSpec{.buckets = 0}).empty());  // off
  AG_CHECK_ERROR(hashed_ngrams("a\xE0", s), "hashed_ngrams", "offset 1");
  AG_CHECK_ERROR(hashed_ngrams("ab", NgramSpec{.buckets = 10, .min_n = 3, .max_n = 2}), "hashed_ngrams", "n 3..2");
  AG_CHECK_ERROR(hashed_ngrams("ab", NgramSpec{.buckets = 10, .max_per_token = 0}), "hashed_ngrams",
                 "max_per_token 0");
}

TEST_CASE("WordTokenizer: vocabulary by frequency, min_freq and max_size") {
  // counts: "the" 3, "cat" 2, "." 2, "a" 1, "dog" 1, "sat" 1
  std::vector<std::string> texts = {"The cat sat.", "the dog. The cat", "a"};
  WordTokenizer t = WordTokenizer::build(texts);
  CHECK(t.tokens() == std::vector<std::string>{"<pad>", "<unk>", "the", ".", "cat", "a", "dog", "sat"});
  WordTokenizer m = WordTokenizer::build(texts, 2);
  CHECK(m.tokens() == std::vector<std::string>{"<pad>", "<unk>", "the", ".", "cat"});
  WordTokenizer s = WordTokenizer::build(texts, 1, 4);
  CHECK(s.tokens() == std::vector<std::string>{"<pad>", "<unk>", "the", "."});
  CHECK(s.vocab_size() == 4);
  AG_CHECK_ERROR(WordTokenizer::build(texts, 0), "WordTokenizer::build", "min_freq", "0");
  AG_CHECK_ERROR(WordTokenizer::build(texts, 1, 1), "WordTokenizer::build", "max_size", "1");
  // layout: newlines and tabs are counted and encoded like words
  WordTokenizer l = WordTokenizer::build({"a\nb\n", "\ta"}, 1, 100, /*layout=*/true);
  CHECK(l.layout());
  CHECK_FALSE(t.layout());
  CHECK(l.tokens() == std::vector<std::string>{"<pad>", "<unk>", "\n", "a", "\t", "b"});
  CHECK(l.encode("A\tb\n\nc") == std::vector<int64_t>{3, 4, 5, 2, 2, 1});
  CHECK(t.encode("A\tcat\n") == std::vector<int64_t>{5, 4});
}

TEST_CASE("WordTokenizer: encode, unknowns, truncation, padding, decode") {
  WordTokenizer t = WordTokenizer::build({"The cat sat.", "the dog. The cat", "a"});
  // ids: the 2, . 3, cat 4, a 5, dog 6, sat 7; "bird" unknown -> 1
  CHECK(t.encode("The bird sat.") == std::vector<int64_t>{2, 1, 7, 3});
  CHECK(t.encode("The bird sat.", 2) == std::vector<int64_t>{2, 1});
  CHECK(t.encode("The bird sat.", 10) == std::vector<int64_t>{2, 1, 7, 3});
  CHECK(t.encode_padded("A cat", 4) == std::vector<int64_t>{5, 4, 0, 0});
  CHECK(t.encode_padded("The bird sat.", 3) == std::vector<int64_t>{2, 1, 7});
  CHECK(t.decode({2, 1, 7, 0, 0}) == "the <unk> sat");
  CHECK(t.id("cat") == 4);
  CHECK(t.id("zebra") == WordTokenizer::kUnk);
  CHECK(t.token(6) == "dog");
  AG_CHECK_ERROR(t.token(8), "WordTokenizer::token", "id 8", "[0, 8)");
  AG_CHECK_ERROR(t.decode({2, 99}), "WordTokenizer::decode", "id 99 at position 1");
  AG_CHECK_ERROR(t.encode("x", -1), "WordTokenizer::encode", "max_len", "-1");
  AG_CHECK_ERROR(t.encode_padded("x", 0), "WordTokenizer::encode_padded", "len");
}

TEST_CASE("WordTokenizer: save, load and corrupt vocabulary files") {
  TempDir tmp("wordtok");
  WordTokenizer t = WordTokenizer::build({"Привет мир", "Hola \"mundo\" \\ ok"});
  t.save(tmp.file("w.json"));
  WordTokenizer u = WordTokenizer::load(tmp.file("w.json"));
  CHECK(u.tokens() == t.tokens());
  CHECK(u.encode("привет \"x\"") == t.encode("привет \"x\""));
  CHECK(WordTokenizer::from_json(t.to_json()).tokens() == t.tokens());
  CHECK_FALSE(WordTokenizer::from_json(t.to_json()).layout());
  WordTokenizer l = WordTokenizer::build({"a\nb"}, 1, 100, /*layout=*/true);
  l.save(tmp.file("l.json"));
  WordTokenizer l2 = WordTokenizer::load(tmp.file("l.json"));
  CHECK(l2.layout());
  CHECK(l2.tokens() == l.tokens());
  CHECK(l2.encode("b\na") == l.encode("b\na"));

  auto load_text = [&](const std::string& name, const std::string& text) {
    write_bytes(tmp.file(name), text);
    return WordTokenizer::load(tmp.file(name));
  };
  const std::string head = R"({"format": "attograd-tokenizer", "version": 1, "kind": "word", "vocab": )";
  AG_CHECK_ERROR(load_text("w1.json", head + R"(["<pad>", "<unk>", "a", "a"]})"), "w1.json", "duplicate token \"a\"",
                 "entries 2 and 3");
  AG_CHECK_ERROR(load_text("w2.json", head + R"(["<unk>", "<pad>"]})"), "w2.json", "must start with");
  AG_CHECK_ERROR(load_text("w3.json", head + R"(["<pad>", "<unk>", ""]})"), "w3.json", "entry 2 is an empty token");
  AG_CHECK_ERROR(load_text("w4.json", head + R"("oops"})"), "w4.json", "\"vocab\"");
  AG_CHECK_ERROR(load_text("w5.json", R"({"format": "attograd-tokenizer", "version": 1, "kind": "char", "mode": "byte"})"),
                 "w5.json", "kind is \"char\", expected \"word\"");
  AG_CHECK_ERROR(load_text("w6.json", "not json"), "w6.json", "malformed JSON");
  AG_CHECK_ERROR(load_text("w7.json", head + "[\"<pad>\", \"<unk>\", \"b\xFF\"]}"), "w7.json", "malformed JSON");
  // "layout" may be absent (files made before it: off) but must be a boolean when present
  CHECK_FALSE(load_text("w8.json", head + R"(["<pad>", "<unk>", "a"]})").layout());
  AG_CHECK_ERROR(load_text("w9.json", R"({"format": "attograd-tokenizer", "version": 1, "kind": "word", "layout": "yes", "vocab": ["<pad>", "<unk>"]})"),
                 "w9.json", "\"layout\" must be true or false", "\"yes\"");
}

// ---- real data (skipped visibly when the Debian packages are absent) ---------------------------

TEST_CASE("fortunes: real data, eight languages") {
  const char* dirs[] = {"de", "es", "it", "ru", "cs", "pl"};
  bool present = fs::exists(std::string(kFortuneRoot) + "/fortunes") && fs::exists(std::string(kFortuneRoot) + "/brasil");
  for (const char* d : dirs) present = present && fs::is_directory(std::string(kFortuneRoot) + "/" + d);
  if (!present) {
    MESSAGE("[skipped: fortunes fortunes-de fortunes-es fortunes-it fortunes-br fortunes-ru fortunes-cs fortunes-pl "
            "not installed]");
    return;
  }
  TextDataset ds = load_fortunes();
  std::vector<int64_t> counts = ds.class_counts();
  std::string line;
  for (size_t c = 0; c < counts.size(); ++c) line += fmt::format(" {} {}", ds.classes[c], counts[c]);
  MESSAGE("fortunes after de-duplication:" << line << ", total " << ds.size());
  for (int64_t n : counts) CHECK((n >= 1000 && n <= 30000));
  CHECK((ds.size() >= 75000 && ds.size() <= 100000));
  CHECK(ds.skipped.empty());
  // median length in characters: short texts (60-130 characters)
  std::vector<size_t> lens;
  for (const TextExample& e : ds.examples) lens.push_back(utf8_decode(e.text).size());
  std::nth_element(lens.begin(), lens.begin() + long(lens.size() / 2), lens.end());
  CHECK((lens[lens.size() / 2] >= 50 && lens[lens.size() / 2] <= 150));
  TextSplit s = split_dataset(ds, 0);
  CHECK(s.train.size() + s.valid.size() + s.test.size() == ds.size());
  std::string en = fortunes_english_text();
  MESSAGE("English fortunes text: " << en.size() << " bytes");
  CHECK((en.size() > 2000000 && en.size() < 3000000));
}

TEST_CASE("bible: real data, bible-kjv") {
  if (::access("/usr/bin/bible", X_OK) != 0) {
    MESSAGE("[skipped: bible-kjv not installed]");
    return;
  }
  TempDir tmp("bible_real");
  std::string text = load_bible_kjv(tmp.dir.string());
  std::set<char> chars(text.begin(), text.end());
  MESSAGE("KJV: " << text.size() << " bytes, " << chars.size() << " distinct characters");
  CHECK((text.size() > 4200000 && text.size() < 4400000));
  CHECK(chars.size() == 73);
  CHECK(text.find("In the beginning God created the heaven and the earth.") != std::string::npos);
  CHECK(text.find("The grace of our Lord Jesus Christ be with you all. Amen.") != std::string::npos);
  CHECK(load_bible_kjv(tmp.dir.string(), "/nonexistent") == text);  // from the cache
}
