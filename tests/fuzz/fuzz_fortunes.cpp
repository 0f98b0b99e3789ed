// libFuzzer target: fortune files (data/text.h read_fortune_file, load_fortunes). The input is up
// to four files joined by kSplit, laid out as a fortune root: "fortunes" (English), "de/a" and
// "de/b" (German), "es/off/c" (offensive Spanish: skipped). load_fortunes reads them all, with its
// de-duplication across files and languages; read_fortune_file reads the first alone.
#include "data/text.h"
#include "tests/fuzz/fuzz_common.h"

using namespace ag;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* kTarget = "fortunes";
  const std::string root = fuzz::fresh_dir("fortunes");
  const char* names[] = {"fortunes", "de/a", "de/b", "es/off/c"};
  const auto parts = fuzz::split_parts(fuzz::as_view(data, size), 4);
  for (size_t k = 0; k < parts.size(); ++k) fuzz::write_file(std::string("fortunes/") + names[k], parts[k]);

  std::vector<std::string> entries;
  if (fuzz::ok_or_error(kTarget, [&] { entries = data::read_fortune_file(root + "/fortunes"); }))
    for (const std::string& e : entries) {
      fuzz::expect(kTarget, !e.empty() && data::utf8_invalid_offset(e) < 0, "read_fortune_file: an empty or invalid entry");
      fuzz::expect(kTarget, e.find("\n%\n") == std::string::npos, "read_fortune_file: a separator left in an entry");
    }

  data::TextDataset ds;
  if (!fuzz::ok_or_error(kTarget, [&] { ds = data::load_fortunes(root); })) return 0;
  for (const auto& e : ds.examples) {
    fuzz::expect(kTarget, e.label == 0 || e.label == 1, "load_fortunes: a label other than en/de");
    fuzz::expect(kTarget, !e.text.empty() && data::utf8_invalid_offset(e.text) < 0, "load_fortunes: an invalid text");
  }
  // the English running text the gpt app trains on: printable ASCII and newlines only
  std::string en;
  if (fuzz::ok_or_error(kTarget, [&] { en = data::fortunes_english_text(root); }))
    for (char c : en) fuzz::expect(kTarget, c == '\n' || (c >= 0x20 && c <= 0x7E), "fortunes_english_text: a byte outside printable ASCII");
  return 0;
}
