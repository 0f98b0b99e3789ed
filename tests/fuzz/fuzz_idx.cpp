// libFuzzer target: IDX files (data/idx.h), plain and gzipped, and an images + labels pair as the
// MNIST loaders read it (data/images.h load_idx_dataset). The first byte picks what the rest is:
//   0: one IDX file as is (the seeds hold plain and .gz files: gzread reads both)
//   1: one IDX file, gzip-compressed here first (so mutations of the plain bytes reach read_idx
//      through zlib's inflate)
//   2: an images file and a labels file, split at kSplit, read as a dataset of 10 classes
#include <zlib.h>

#include "data/idx.h"
#include "data/images.h"
#include "tests/fuzz/fuzz_common.h"

using namespace ag;

namespace {
// `bytes` as a gzip file at scratch path `rel`.
std::string write_gzip(const std::string& rel, std::string_view bytes) {
  const std::string path = fuzz::scratch_path(rel);
  gzFile f = gzopen(path.c_str(), "wb1");
  if (!f || (!bytes.empty() && gzwrite(f, bytes.data(), unsigned(bytes.size())) != int(bytes.size())) ||
      gzclose(f) != Z_OK)
    fuzz::finding("idx", "cannot write the gzip file " + path);
  return path;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* kTarget = "idx";
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  const std::string_view rest = fuzz::as_view(data + 1, size - 1);
  if (mode == 0 || mode == 1) {
    const std::string path = mode == 0 ? fuzz::write_file("in-idx", rest) : write_gzip("in-idx.gz", rest);
    data::IdxArray a;
    if (fuzz::ok_or_error(kTarget, [&] { a = data::read_idx(path); }))
      fuzz::expect(kTarget, !a.dims.empty() && int64_t(a.data.size()) == a.numel(), "read_idx: dims and data disagree");
    return 0;
  }
  const auto parts = fuzz::split_parts(rest, 2);
  const std::string images = fuzz::write_file("images-idx3-ubyte", parts[0]);
  const std::string labels = fuzz::write_file("labels-idx1-ubyte", parts.size() > 1 ? parts[1] : std::string_view());
  const std::vector<std::string> classes = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
  data::ImageDataset ds;
  if (!fuzz::ok_or_error(kTarget, [&] { ds = data::load_idx_dataset(images, labels, classes); })) return 0;
  fuzz::expect(kTarget, int64_t(ds.images.size()) == ds.n * ds.image_size() && int64_t(ds.labels.size()) == ds.n,
               "load_idx_dataset: sizes disagree");
  for (int64_t l : ds.labels) fuzz::expect(kTarget, l >= 0 && l < 10, "load_idx_dataset: a label out of range");
  return 0;
}
