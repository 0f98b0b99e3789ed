// libFuzzer target: a TSV file of label<TAB>text lines (data/text.h load_tsv), read twice: with its
// own classes (the training file) and against fixed classes (a test file gets the training ids).
#include "data/text.h"
#include "tests/fuzz/fuzz_common.h"

using namespace ag;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* kTarget = "tsv";
  const std::string path = fuzz::write_file("in.tsv", fuzz::as_view(data, size));
  data::TextDataset ds;
  if (fuzz::ok_or_error(kTarget, [&] { ds = data::load_tsv(path); })) {
    fuzz::expect(kTarget, ds.size() >= 1 && ds.num_classes() >= 1, "load_tsv: no examples or classes");
    for (const auto& e : ds.examples) {
      fuzz::expect(kTarget, e.label >= 0 && e.label < ds.num_classes(), "load_tsv: a label out of range");
      fuzz::expect(kTarget, !e.text.empty() && data::utf8_invalid_offset(e.text) < 0, "load_tsv: an invalid text");
    }
    for (const auto& c : ds.classes) fuzz::expect(kTarget, !c.empty(), "load_tsv: an empty class name");
  }
  fuzz::ok_or_error(kTarget, [&] { data::load_tsv(path, {"neg", "pos"}); });
  return 0;
}
