#pragma once
// IDX files: the format of MNIST and Fashion-MNIST (LeCun et al.; Debian's dataset-fashion-mnist
// ships them gzipped under /usr/share/datasets/fashion-mnist/).
//
// Byte layout (all integers big-endian):
//   offset 0   u8   0x00                       magic, first byte
//   offset 1   u8   0x00                       magic, second byte
//   offset 2   u8   element type               0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64
//   offset 3   u8   ndims                      number of dimensions, >= 1
//   offset 4   u32  dims[0], ..., dims[ndims-1]  (4 bytes each, big-endian)
//   offset 4 + 4*ndims: the elements, row-major (last dim fastest), prod(dims) of them, and
//                       nothing after them.
// MNIST images: type 0x08, ndims 3, dims (N, 28, 28), pixels 0 (background) .. 255 (ink).
// MNIST labels: type 0x08, ndims 1, dims (N), values 0..9.
//
// read_idx reads a plain file or a gzip-compressed one (zlib's gzread passes plain files through),
// streaming: the header's sizes are only trusted once that many bytes have actually been
// decompressed, so a lying or truncated file gives an ag::Error, never a huge allocation or an
// out-of-bounds read. Only element type 0x08 (unsigned byte) is supported: it is what every
// MNIST-family file uses.
#include <cstdint>
#include <string>
#include <vector>

struct gzFile_s;  // zlib's gzFile is a gzFile_s*

namespace ag::data {

// A file read through zlib: gzip-compressed or plain (gzread passes plain bytes through), in
// order, never seeking. `what` names the reader in errors ("idx", "cifar10"). Raises ag::Error
// naming the file when it is missing, unreadable or a corrupt/truncated gzip stream.
class GzReader {
 public:
  GzReader(const std::string& path, const char* what);
  ~GzReader();
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;
  // Reads up to n bytes into dst; returns how many were read (fewer only at the end of the file).
  int64_t read(void* dst, int64_t n);
  // Reads up to n bytes, growing the buffer as bytes arrive (never allocating n up front).
  std::vector<uint8_t> read_up_to(int64_t n);

 private:
  gzFile_s* file_ = nullptr;
  std::string path_;
  const char* what_;
  int64_t pos_ = 0;  // bytes delivered so far, for error messages
};

struct IdxArray {
  std::vector<int64_t> dims;  // (dims[0], ..., dims[ndims-1])
  std::vector<uint8_t> data;  // prod(dims) elements, row-major
  int64_t numel() const;
};

// Reads an IDX file of element type 0x08 (u8), gzipped or not. Raises ag::Error naming the file
// on: a missing/unreadable file, a corrupt gzip stream, bad magic, an unsupported element type,
// ndims == 0, a size beyond 2^40 elements, fewer data bytes than the dims promise (truncated) and
// bytes left over after them.
IdxArray read_idx(const std::string& path);

}  // namespace ag::data
