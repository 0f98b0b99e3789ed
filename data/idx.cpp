#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>

#include <fmt/ranges.h>

#include "core/error.h"

namespace ag::data {

// ---- GzReader ---------------------------------------------------------------------------------

GzReader::GzReader(const std::string& path, const char* what) : path_(path), what_(what) {
  std::error_code ec;
  check(std::filesystem::is_regular_file(path, ec), "{}: {}: no such file", what, path);
  file_ = gzopen(path.c_str(), "rb");
  check(file_ != nullptr, "{}: {}: cannot open the file", what, path);
  gzbuffer(file_, 1 << 17);
}

GzReader::~GzReader() {
  if (file_) gzclose(file_);
}

namespace {
// zlib's message without the "path: " it puts in front of it
std::string zlib_message(gzFile_s* f, const std::string& path, int* errnum) {
  std::string msg = gzerror(f, errnum);
  if (msg.starts_with(path + ": ")) msg.erase(0, path.size() + 2);
  return msg;
}
}  // namespace

int64_t GzReader::read(void* dst, int64_t n) {
  int64_t total = 0;
  auto* out = static_cast<uint8_t*>(dst);
  while (total < n) {
    const unsigned ask = unsigned(std::min<int64_t>(n - total, 1 << 30));
    const int k = gzread(file_, out + total, ask);
    if (k < 0) {
      int errnum = 0;
      const std::string msg = zlib_message(file_, path_, &errnum);
      fail("{}: {}: corrupt or truncated gzip stream after {} bytes: {}", what_, path_, pos_ + total, msg);
    }
    if (k == 0) {
      // zlib reports a gzip stream cut short as an error flag, not always as a negative count
      int errnum = 0;
      const std::string msg = zlib_message(file_, path_, &errnum);
      check(errnum == Z_OK, "{}: {}: corrupt or truncated gzip stream after {} bytes: {}", what_, path_,
            pos_ + total, msg);
      break;
    }
    total += k;
  }
  pos_ += total;
  return total;
}

std::vector<uint8_t> GzReader::read_up_to(int64_t n) {
  std::vector<uint8_t> buf;
  constexpr int64_t kChunk = int64_t(1) << 22;  // 4 MiB: the most a lying header can make us allocate early
  while (int64_t(buf.size()) < n) {
    const int64_t have = int64_t(buf.size()), want = std::min(kChunk, n - have);
    buf.resize(size_t(have + want));
    const int64_t k = read(buf.data() + have, want);
    buf.resize(size_t(have + k));
    if (k < want) break;
  }
  return buf;
}

// ---- IDX --------------------------------------------------------------------------------------

int64_t IdxArray::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

namespace {

const char* idx_type_name(int t) {
  switch (t) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "short";
    case 0x0C: return "int";
    case 0x0D: return "float";
    case 0x0E: return "double";
    default: return nullptr;
  }
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  GzReader in(path, "idx");

  // magic: 0x00 0x00 type ndims
  uint8_t head[4];
  int64_t got = in.read(head, 4);
  check(got == 4, "idx: {}: truncated: {} bytes, the header needs at least 4", path, got);
  check(head[0] == 0 && head[1] == 0,
        "idx: {}: bad magic {:#04x} {:#04x} (expected 0x00 0x00 then type and ndims)", path, head[0],
        head[1]);
  const int type = head[2], ndims = head[3];
  const char* tname = idx_type_name(type);
  check(tname != nullptr, "idx: {}: unknown element type {:#04x} (IDX defines 0x08, 0x09, 0x0B-0x0E)",
        path, type);
  check(type == 0x08, "idx: {}: element type {:#04x} ({}) is not supported, only 0x08 (unsigned byte)",
        path, type, tname);
  check(ndims >= 1, "idx: {}: ndims is 0, expected at least 1", path);

  // dims: ndims big-endian u32
  std::vector<uint8_t> dim_bytes(size_t(ndims) * 4);
  got = in.read(dim_bytes.data(), int64_t(dim_bytes.size()));
  check(got == int64_t(dim_bytes.size()), "idx: {}: truncated header: {} dims need {} bytes, got {}",
        path, ndims, dim_bytes.size(), got);
  IdxArray a;
  constexpr int64_t kMaxElements = int64_t(1) << 40;  // a sanity bound: no real IDX is near it
  int64_t numel = 1;
  for (int i = 0; i < ndims; ++i) {
    a.dims.push_back(be32(&dim_bytes[size_t(i) * 4]));
  }
  for (int64_t d : a.dims) {
    // numel * d <= 2^40, tested by division so that the product itself cannot overflow
    check(d == 0 || numel <= kMaxElements / d, "idx: {}: dims [{}] give more than 2^40 elements", path,
          fmt::join(a.dims, ", "));
    numel *= d;
  }

  // data: trust numel only as far as the stream really delivers (GzReader grows the buffer
  // chunk by chunk, so a header that lies about its size cannot make us allocate it up front)
  a.data = in.read_up_to(numel);
  check(int64_t(a.data.size()) == numel,
        "idx: {}: truncated: dims [{}] need {} data bytes, only {} follow the header", path,
        fmt::join(a.dims, ", "), numel, a.data.size());
  uint8_t extra[4096];
  int64_t trailing = 0;
  while (int64_t k = in.read(extra, sizeof extra)) trailing += k;
  check(trailing == 0, "idx: {}: {} bytes after the {} data bytes that dims [{}] give", path, trailing,
        numel, fmt::join(a.dims, ", "));
  return a;
}

}  // namespace ag::data
