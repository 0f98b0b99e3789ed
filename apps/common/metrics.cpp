// JSONL and tfevents writers, and the tfevents reader (formats in metrics.h).
#include "apps/common/metrics.h"

#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "core/error.h"

namespace ag::apps {

// ---- CRC-32C -------------------------------------------------------------------------------
// Reflected CRC: the register shifts right and the polynomial 0x1EDC6F41 appears bit-reversed as
// 0x82F63B78. table[b] is the register after feeding byte b into a zero register, so each input
// byte costs one lookup: crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8).
namespace {
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[b] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();
}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;  // init 0xFFFFFFFF; continuing from a finished crc undoes its final xor
  for (size_t i = 0; i < n; ++i) crc = kCrc32cTable[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

double unix_time() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// ---- protobuf encoding ---------------------------------------------------------------------
namespace {
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(uint8_t(v)));
}
void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t(field) << 3) | type); }
template <class T> void put_le(std::string& out, T v) {  // fixed-width little-endian
  unsigned char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86/ARM Linux are little-endian; the static_assert below says so
  out.append(reinterpret_cast<const char*>(b), sizeof(T));
}
static_assert(std::endian::native == std::endian::little, "tfevents writer assumes a little-endian host");
void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}
void put_event_header(std::string& out, double wall_time, int64_t step) {
  put_key(out, 1, kFixed64);  // Event.wall_time (double)
  put_le(out, wall_time);
  if (step != 0) {            // proto3 leaves default values out
    put_key(out, 2, kVarint);  // Event.step (int64)
    put_varint(out, uint64_t(step));
  }
}
}  // namespace

std::string encode_file_version_event(double wall_time, std::string_view version) {
  std::string ev;
  put_event_header(ev, wall_time, 0);
  put_bytes(ev, 3, version);  // Event.file_version (string)
  return ev;
}

std::string encode_scalars_event(double wall_time, int64_t step, const Scalars& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);        // Summary.Value.tag (string)
    put_key(v, 2, kFixed32);     // Summary.Value.simple_value (float)
    put_le(v, float(value));
    put_bytes(summary, 1, v);    // Summary.value (repeated Value)
  }
  std::string ev;
  put_event_header(ev, wall_time, step);
  put_bytes(ev, 5, summary);     // Event.summary (Summary)
  return ev;
}

std::string tfrecord(std::string_view data) {
  std::string rec;
  rec.reserve(data.size() + 16);
  put_le(rec, uint64_t(data.size()));
  put_le(rec, mask_crc32c(crc32c(rec.data(), 8)));
  rec.append(data);
  put_le(rec, mask_crc32c(crc32c(data)));
  return rec;
}

// ---- tfevents writer -----------------------------------------------------------------------
namespace {
std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == 0) return "localhost";
  return buf;
}
}  // namespace

TfEventsWriter::TfEventsWriter(const std::string& logdir) {
  std::error_code ec;
  std::filesystem::create_directories(logdir, ec);
  check(!ec, "TfEventsWriter: cannot create directory '{}': {}", logdir, ec.message());
  const double now = unix_time();
  const std::string base =
      (std::filesystem::path(logdir) / fmt::format("events.out.tfevents.{}.{}", int64_t(now), hostname())).string();
  // Two writers started within the same second (a quick restart) must not truncate each other's
  // file: "x" opens only a file that does not exist yet; on a clash a counter goes after the name.
  for (int k = 0; k < 1000 && file_ == nullptr; ++k) {
    path_ = k == 0 ? base : fmt::format("{}.{}", base, k);
    file_ = std::fopen(path_.c_str(), "wbx");
    if (!file_ && errno != EEXIST) break;
  }
  check(file_ != nullptr, "TfEventsWriter: cannot create '{}': {}", path_, std::strerror(errno));
  write_record(encode_file_version_event(now));
}

TfEventsWriter::~TfEventsWriter() {
  if (file_) std::fclose(file_);
}

void TfEventsWriter::write_record(const std::string& data) {
  const std::string rec = tfrecord(data);
  const bool ok = std::fwrite(rec.data(), 1, rec.size(), file_) == rec.size() && std::fflush(file_) == 0;
  check(ok, "TfEventsWriter: writing {} bytes to '{}' failed: {}", rec.size(), path_, std::strerror(errno));
}

void TfEventsWriter::add_scalars(int64_t step, const Scalars& scalars, double wall_time) {
  write_record(encode_scalars_event(wall_time < 0 ? unix_time() : wall_time, step, scalars));
}

// ---- tfevents reader -----------------------------------------------------------------------
namespace {
// A bounds-checked cursor over one protobuf message; every read names the file and offset.
struct ProtoReader {
  std::string_view buf;
  size_t pos = 0;
  const std::string& name;
  size_t base;  // offset of buf in the file, for messages

  bool done() const { return pos >= buf.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      check(pos < buf.size(), "read_tfevents: {}: varint runs past the end of its message at byte {}", name,
            base + pos);
      const uint8_t b = uint8_t(buf[pos++]);
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("read_tfevents: {}: varint longer than 10 bytes at byte {}", name, base + pos);
  }
  std::string_view take(uint64_t n, const char* what) {
    check(n <= buf.size() - pos, "read_tfevents: {}: {} of {} bytes at byte {} runs past its message ({} left)",
          name, what, n, base + pos, buf.size() - pos);
    std::string_view s = buf.substr(pos, size_t(n));
    pos += size_t(n);
    return s;
  }
  template <class T> T fixed() {
    std::string_view s = take(sizeof(T), sizeof(T) == 8 ? "fixed64" : "fixed32");
    T v;
    std::memcpy(&v, s.data(), sizeof(T));
    return v;
  }
  void skip(uint32_t type) {
    switch (type) {
      case kVarint: varint(); break;
      case kFixed64: take(8, "fixed64"); break;
      case kLengthDelimited: take(varint(), "length-delimited field"); break;
      case kFixed32: take(4, "fixed32"); break;
      default: fail("read_tfevents: {}: unsupported protobuf wire type {} at byte {}", name, type, base + pos);
    }
  }
  ProtoReader sub(std::string_view s) const {
    return ProtoReader{s, 0, name, base + size_t(s.data() - buf.data())};
  }
};

void expect_type(const ProtoReader& r, const char* field, uint32_t got, uint32_t want) {
  check(got == want, "read_tfevents: {}: field {} has wire type {}, expected {} (byte {})", r.name, field, got, want,
        r.base + r.pos);
}

void parse_event(ProtoReader r, TfEvents& out) {
  double wall_time = 0;
  int64_t step = 0;
  std::vector<std::pair<std::string, float>> values;
  while (!r.done()) {
    const uint64_t key = r.varint();
    const uint32_t field = uint32_t(key >> 3), type = uint32_t(key & 7);
    if (field == 1) {
      expect_type(r, "Event.wall_time", type, kFixed64);
      wall_time = r.fixed<double>();
    } else if (field == 2) {
      expect_type(r, "Event.step", type, kVarint);
      step = int64_t(r.varint());
    } else if (field == 3) {
      expect_type(r, "Event.file_version", type, kLengthDelimited);
      out.file_version = std::string(r.take(r.varint(), "Event.file_version"));
    } else if (field == 5) {
      expect_type(r, "Event.summary", type, kLengthDelimited);
      ProtoReader summary = r.sub(r.take(r.varint(), "Event.summary"));
      while (!summary.done()) {
        const uint64_t skey = summary.varint();
        if ((skey >> 3) != 1) {
          summary.skip(uint32_t(skey & 7));
          continue;
        }
        expect_type(summary, "Summary.value", uint32_t(skey & 7), kLengthDelimited);
        ProtoReader value = summary.sub(summary.take(summary.varint(), "Summary.value"));
        std::string tag;
        bool has_simple = false;
        float simple = 0;
        while (!value.done()) {
          const uint64_t vkey = value.varint();
          const uint32_t vfield = uint32_t(vkey >> 3), vtype = uint32_t(vkey & 7);
          if (vfield == 1) {
            expect_type(value, "Value.tag", vtype, kLengthDelimited);
            tag = std::string(value.take(value.varint(), "Value.tag"));
          } else if (vfield == 2) {
            expect_type(value, "Value.simple_value", vtype, kFixed32);
            simple = value.fixed<float>();
            has_simple = true;
          } else {
            value.skip(vtype);
          }
        }
        if (has_simple) values.emplace_back(std::move(tag), simple);
      }
    } else {
      r.skip(type);
    }
  }
  for (auto& [tag, v] : values) out.scalars.push_back(TfScalar{std::move(tag), step, wall_time, v});
}

uint32_t load_u32(std::string_view b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}
}  // namespace

TfEvents parse_tfevents(std::string_view bytes, const std::string& name) {
  TfEvents out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    check(bytes.size() - pos >= 12, "read_tfevents: {}: truncated record header at byte {} ({} bytes left, need 12)",
          name, pos, bytes.size() - pos);
    uint64_t len;
    std::memcpy(&len, bytes.data() + pos, 8);
    const uint32_t len_crc = load_u32(bytes, pos + 8), want_len_crc = mask_crc32c(crc32c(bytes.data() + pos, 8));
    check(len_crc == want_len_crc, "read_tfevents: {}: length CRC mismatch at byte {}: stored {:#010x}, computed {:#010x}",
          name, pos, len_crc, want_len_crc);
    const size_t left = bytes.size() - pos - 12;
    check(left >= 4 && len <= left - 4,
          "read_tfevents: {}: truncated record at byte {}: length {} but only {} bytes follow the header", name, pos,
          len, left);
    std::string_view data = bytes.substr(pos + 12, size_t(len));
    const uint32_t data_crc = load_u32(bytes, pos + 12 + size_t(len)), want = mask_crc32c(crc32c(data));
    check(data_crc == want, "read_tfevents: {}: data CRC mismatch in record at byte {}: stored {:#010x}, computed {:#010x}",
          name, pos, data_crc, want);
    parse_event(ProtoReader{data, 0, name, pos + 12}, out);
    ++out.events;
    pos += 16 + size_t(len);
  }
  return out;
}

TfEvents read_tfevents(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  check(f.good(), "read_tfevents: cannot open '{}'", path);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return parse_tfevents(bytes, path);
}

// ---- JSONL ---------------------------------------------------------------------------------
JsonlWriter::JsonlWriter(const std::string& path, bool append) : path_(path) {
  const auto parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  file_ = std::fopen(path.c_str(), append ? "ab" : "wb");
  check(file_ != nullptr, "JsonlWriter: cannot open '{}': {}", path, std::strerror(errno));
  if (append) {  // a line a killed process left half written ends here, so the next one starts whole
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (in && in.tellg() > 0) {
      in.seekg(-1, std::ios::end);
      if (in.get() != '\n') check(std::fputc('\n', file_) != EOF, "JsonlWriter: writing to '{}' failed", path);
    }
  }
}

JsonlWriter::~JsonlWriter() {
  if (file_) std::fclose(file_);
}

void JsonlWriter::write(const nlohmann::json& object) {
  // error_handler::replace: invalid UTF-8 in a string becomes U+FFFD instead of an exception.
  const std::string line = object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const bool ok = std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  check(ok, "JsonlWriter: writing to '{}' failed: {}", path_, std::strerror(errno));
}

// ---- both ----------------------------------------------------------------------------------
MetricsLogger::MetricsLogger(const std::string& dir, bool append_jsonl)
    : start_(unix_time()),
      jsonl_((std::filesystem::path(dir) / "metrics.jsonl").string(), append_jsonl),
      events_(dir) {}

void MetricsLogger::log(int64_t step, const Scalars& scalars) {
  const double now = unix_time();
  nlohmann::json j = {{"step", step}, {"time", now - start_}};
  for (const auto& [name, value] : scalars)
    j[name] = std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
  jsonl_.write(j);
  events_.add_scalars(step, scalars, now);
}

}  // namespace ag::apps
