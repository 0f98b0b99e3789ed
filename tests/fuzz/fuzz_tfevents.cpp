// libFuzzer target: TensorBoard event files (apps/common/metrics.h read_tfevents: TFRecord framing
// with masked CRC-32C, each record an Event protobuf). The first byte picks what the rest is:
//   even: the file's bytes as they are (framing, lengths and CRCs under test);
//   odd:  Event payloads joined by kSplit, framed here with correct lengths and CRCs (tfrecord),
//         so that mutations reach the protobuf parser instead of stopping at a CRC mismatch.
#include "apps/common/metrics.h"
#include "tests/fuzz/fuzz_common.h"

using namespace ag;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* kTarget = "tfevents";
  if (size == 0) return 0;
  std::string bytes;
  const std::string_view rest = fuzz::as_view(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    bytes = rest;
  } else {
    for (std::string_view payload : fuzz::split_parts(rest, 64)) bytes += apps::tfrecord(payload);
  }
  apps::TfEvents ev;
  if (fuzz::ok_or_error(kTarget, [&] { ev = apps::parse_tfevents(bytes, "fuzz"); }))
    for (const auto& s : ev.scalars) fuzz::expect(kTarget, s.tag.size() <= bytes.size(), "parse_tfevents: a tag longer than the file");
  const std::string path = fuzz::write_file("events.out.tfevents.fuzz", bytes);
  fuzz::ok_or_error(kTarget, [&] { apps::read_tfevents(path); });
  return 0;
}
