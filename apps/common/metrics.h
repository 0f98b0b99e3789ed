#pragma once
// Metrics the apps write at every evaluation: one JSON object per line (metrics.jsonl) and
// TensorBoard event files, so `tensorboard --logdir <run dir>` shows the curves. Both are flushed
// after every write, so a crash keeps everything written before it.
//
// ---- tfevents file format ------------------------------------------------------------------
// File name: events.out.tfevents.<unix time, integer seconds>.<hostname>
// The file is a sequence of records (TensorFlow's TFRecord framing), all integers little-endian:
//   u64  length                       number of bytes in data
//   u32  masked_crc32c(length)        over the 8 bytes of the length field
//   u8   data[length]                 one serialized tensorflow.Event protobuf
//   u32  masked_crc32c(data)
// crc32c is CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF;
// crc32c("123456789") = 0xE3069283) and masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (mod 2^32).
//
// The protobuf messages, field numbers and types as in TensorFlow's
// tensorflow/core/util/event.proto and tensorflow/core/framework/summary.proto (also
// tensorboard/compat/proto/{event,summary}.proto):
//   message Event   { double wall_time = 1; int64 step = 2;
//                     oneof what { string file_version = 3; ...; Summary summary = 5; ... } }
//   message Summary { repeated Value value = 1; }
//   message Summary.Value { string tag = 1; ...; oneof value { float simple_value = 2; ... } }
// Protobuf wire format: each field is a key varint (field_number << 3 | wire_type) and a payload:
//   wire type 0 varint (int64 step: two's complement as 64-bit unsigned, 7 bits per byte, LSB first)
//   wire type 1 fixed64 (double wall_time: 8 bytes LE)
//   wire type 2 length-delimited (strings, nested messages: varint length, then the bytes)
//   wire type 5 fixed32 (float simple_value: 4 bytes LE)
// The first record is Event{wall_time, file_version = "brain.Event:2"}; then one Event per
// (step, scalars) with Summary.value holding one Value{tag, simple_value} per scalar.
//
// ---- metrics.jsonl -------------------------------------------------------------------------
// One JSON object per line: {"step": 100, "time": <seconds since the logger started>,
// "<name>": <value>, ...}; non-finite values are written as null.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ag::apps {

// CRC-32C, table-driven; pass the previous result as `crc` to continue over more bytes.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
inline uint32_t crc32c(std::string_view s) { return crc32c(s.data(), s.size()); }
inline uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t unmask_crc32c(uint32_t masked) {
  const uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

using Scalars = std::vector<std::pair<std::string, double>>;  // (tag, value), in the order given

// ---- protobuf + record encoding (pure, for the writer and the tests) ------------------------
std::string encode_file_version_event(double wall_time, std::string_view version = "brain.Event:2");
std::string encode_scalars_event(double wall_time, int64_t step, const Scalars& scalars);
std::string tfrecord(std::string_view data);  // length, crc, data, crc as above

// Appends events to one new tfevents file in `logdir` (created when missing).
class TfEventsWriter {
 public:
  explicit TfEventsWriter(const std::string& logdir);
  ~TfEventsWriter();
  TfEventsWriter(const TfEventsWriter&) = delete;
  TfEventsWriter& operator=(const TfEventsWriter&) = delete;

  // One event with every scalar at this step; flushed to the OS before returning.
  void add_scalars(int64_t step, const Scalars& scalars, double wall_time = -1);  // -1: now
  void add_scalar(const std::string& tag, int64_t step, double value, double wall_time = -1) {
    add_scalars(step, {{tag, value}}, wall_time);
  }
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* file_ = nullptr;
};

// ---- the reader (tests, and apps that resume and want the old curves) -----------------------
struct TfScalar {
  std::string tag;
  int64_t step = 0;
  double wall_time = 0;
  float value = 0;
};
struct TfEvents {
  std::string file_version;        // from the first event ("brain.Event:2")
  int64_t events = 0;              // records read
  std::vector<TfScalar> scalars;   // every simple_value, in file order
};
// Decodes every record, verifies both CRCs of each, parses Event/Summary/Value (skipping fields it
// does not know) and returns the (tag, step, value) triples. Raises ag::Error naming the file, the
// byte offset and the offending values on a truncated record, a CRC mismatch or a malformed
// protobuf; never reads out of bounds.
TfEvents read_tfevents(const std::string& path);
TfEvents parse_tfevents(std::string_view bytes, const std::string& name = "<memory>");

// ---- JSONL ---------------------------------------------------------------------------------
class JsonlWriter {
 public:
  explicit JsonlWriter(const std::string& path, bool append = false);
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  void write(const nlohmann::json& object);  // one line, flushed
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Both at once: <dir>/metrics.jsonl and <dir>/events.out.tfevents.*. The tags are the names given
// ("train/loss", "val/accuracy", ...: TensorBoard groups by the part before the slash).
class MetricsLogger {
 public:
  explicit MetricsLogger(const std::string& dir, bool append_jsonl = false);
  void log(int64_t step, const Scalars& scalars);
  const std::string& jsonl_path() const { return jsonl_.path(); }
  const std::string& tfevents_path() const { return events_.path(); }

 private:
  double start_;
  JsonlWriter jsonl_;
  TfEventsWriter events_;
};

double unix_time();  // seconds since the epoch, with sub-second precision

}  // namespace ag::apps
