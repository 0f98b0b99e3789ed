#include "data/images.h"

#include <array>
#include <cmath>
#include <filesystem>

#include <fmt/ranges.h>

#include "core/kernels.h"
#include "core/parallel.h"
#include "data/idx.h"

namespace ag::data {

namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kFashionClasses = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                  "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
const std::vector<std::string> kDigitClasses = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
const std::vector<std::string> kCifarClasses = {"airplane", "automobile", "bird",  "cat",  "deer",
                                                "dog",      "frog",       "horse", "ship", "truck"};

constexpr int kCifarSide = 32, kCifarChannels = 3;
constexpr int64_t kCifarRecord = 1 + kCifarChannels * kCifarSide * kCifarSide;  // 3073 bytes

// `dir`/`base`.gz, else `dir`/`base`; empty when neither exists.
std::string find_idx(const std::string& dir, const std::string& base) {
  std::error_code ec;
  for (const std::string& name : {base + ".gz", base})
    if (fs::is_regular_file(fs::path(dir) / name, ec)) return (fs::path(dir) / name).string();
  return {};
}

// The four MNIST-layout files of `dir`, or DatasetNotFound naming the first missing one and `hint`.
ImageSplits load_mnist_layout(const char* what, const std::string& dir, const std::string& hint,
                              const std::vector<std::string>& classes) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw DatasetNotFound(fmt::format("{}: folder {} not found; {}", what, dir, hint));
  std::string paths[4];
  const char* bases[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                          "t10k-labels-idx1-ubyte"};
  for (int i = 0; i < 4; ++i) {
    paths[i] = find_idx(dir, bases[i]);
    if (paths[i].empty())
      throw DatasetNotFound(fmt::format("{}: {}/{}[.gz] not found; {}", what, dir, bases[i], hint));
  }
  return {load_idx_dataset(paths[0], paths[1], classes), load_idx_dataset(paths[2], paths[3], classes)};
}

const char* kFashionHint =
    "install the Debian package dataset-fashion-mnist (sudo apt install dataset-fashion-mnist) "
    "or pass the folder holding the IDX files";
const char* kMnistHint = "download the four IDX files of http://yann.lecun.com/exdb/mnist/ into it";
const char* kCifarHint = "download the binary version from https://www.cs.toronto.edu/~kriz/cifar.html "
                         "and unpack it (cifar-10-binary.tar.gz)";

// The folder of `dir` that holds the CIFAR-10 batches: `dir` itself or its cifar-10-batches-bin.
std::string cifar_folder(const std::string& dir) {
  std::error_code ec;
  for (const fs::path& p : {fs::path(dir), fs::path(dir) / "cifar-10-batches-bin"})
    if (fs::is_regular_file(p / "test_batch.bin", ec)) return p.string();
  return {};
}

}  // namespace

// ---- readers -----------------------------------------------------------------------------------

ImageDataset load_idx_dataset(const std::string& images_path, const std::string& labels_path,
                              const std::vector<std::string>& class_names) {
  IdxArray im = read_idx(images_path), lb = read_idx(labels_path);
  check(im.dims.size() == 3, "idx: {}: images need 3 dims [N, H, W], got [{}]", images_path,
        fmt::join(im.dims, ", "));
  check(lb.dims.size() == 1, "idx: {}: labels need 1 dim [N], got [{}]", labels_path, fmt::join(lb.dims, ", "));
  check(im.dims[0] == lb.dims[0], "idx: {} holds {} images but {} holds {} labels", images_path, im.dims[0],
        labels_path, lb.dims[0]);
  check(im.dims[1] >= 1 && im.dims[2] >= 1 && im.dims[1] <= 65536 && im.dims[2] <= 65536,
        "idx: {}: image size {}x{} is out of range [1, 65536]", images_path, im.dims[1], im.dims[2]);
  const int64_t num_classes = int64_t(class_names.size());
  for (int64_t i = 0; i < lb.dims[0]; ++i)
    check(lb.data[size_t(i)] < num_classes, "idx: {}: label {} of image {} is not below the {} classes",
          labels_path, lb.data[size_t(i)], i, num_classes);
  ImageDataset ds;
  ds.n = im.dims[0];
  ds.channels = 1, ds.height = int(im.dims[1]), ds.width = int(im.dims[2]);
  ds.num_classes = int(num_classes);
  ds.images = std::move(im.data);
  ds.labels.assign(lb.data.begin(), lb.data.end());
  ds.class_names = class_names;
  return ds;
}

ImageDataset read_cifar10_batch(const std::string& path) {
  GzReader in(path, "cifar10");
  constexpr int64_t kMaxRecords = 100000;  // ten times an official batch; a bound on what we buffer
  std::vector<uint8_t> bytes = in.read_up_to(kMaxRecords * kCifarRecord + 1);
  const int64_t size = int64_t(bytes.size());
  check(size > 0, "cifar10: {}: the file is empty", path);
  check(size <= kMaxRecords * kCifarRecord, "cifar10: {}: more than {} records ({} bytes)", path, kMaxRecords,
        kMaxRecords * kCifarRecord);
  check(size % kCifarRecord == 0,
        "cifar10: {}: size {} bytes is not a whole number of {}-byte records ({} records and {} bytes left)",
        path, size, kCifarRecord, size / kCifarRecord, size % kCifarRecord);
  ImageDataset ds;
  ds.n = size / kCifarRecord;
  ds.channels = kCifarChannels, ds.height = kCifarSide, ds.width = kCifarSide;
  ds.num_classes = 10;
  ds.class_names = kCifarClasses;
  ds.images.resize(size_t(ds.n * ds.image_size()));
  ds.labels.resize(size_t(ds.n));
  for (int64_t i = 0; i < ds.n; ++i) {
    const uint8_t* rec = bytes.data() + i * kCifarRecord;
    check(rec[0] < 10, "cifar10: {}: label {} of record {} is not below the 10 classes", path, rec[0], i);
    ds.labels[size_t(i)] = rec[0];
    std::copy(rec + 1, rec + kCifarRecord, ds.images.begin() + i * ds.image_size());
  }
  return ds;
}

ImageDataset concat(const std::vector<ImageDataset>& parts) {
  check(!parts.empty(), "concat: no datasets given");
  ImageDataset out;
  const ImageDataset& a = parts[0];
  out.channels = a.channels, out.height = a.height, out.width = a.width;
  out.num_classes = a.num_classes, out.class_names = a.class_names;
  for (size_t k = 0; k < parts.size(); ++k) {
    const ImageDataset& p = parts[k];
    check(p.channels == a.channels && p.height == a.height && p.width == a.width,
          "concat: part {} has images [{}, {}, {}], part 0 has [{}, {}, {}]", k, p.channels, p.height, p.width,
          a.channels, a.height, a.width);
    check(p.num_classes == a.num_classes, "concat: part {} has {} classes, part 0 has {}", k, p.num_classes,
          a.num_classes);
    out.n += p.n;
    out.images.insert(out.images.end(), p.images.begin(), p.images.end());
    out.labels.insert(out.labels.end(), p.labels.begin(), p.labels.end());
  }
  return out;
}

HeldOut hold_out(const ImageDataset& ds, int64_t n, uint64_t seed) {
  check(n >= 0 && n < ds.size(), "hold_out: {} images held out of {} would leave {} to train on", n, ds.size(),
        ds.size() - n);
  // Fisher-Yates from a splitmix64 stream: the same permutation for the same seed everywhere
  std::vector<int64_t> order(size_t(ds.size()));
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  uint64_t state = seed;
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[size_t(next() % (i + 1))]);
  std::vector<char> is_held(order.size(), 0);
  for (size_t k = order.size() - size_t(n); k < order.size(); ++k) is_held[size_t(order[k])] = 1;
  HeldOut out;
  for (ImageDataset* p : {&out.rest, &out.held}) {
    p->channels = ds.channels, p->height = ds.height, p->width = ds.width;
    p->num_classes = ds.num_classes, p->class_names = ds.class_names;
  }
  const size_t bytes = size_t(ds.image_size());
  for (int64_t i = 0; i < ds.size(); ++i) {  // both in the original order
    ImageDataset& p = is_held[size_t(i)] ? out.held : out.rest;
    p.images.insert(p.images.end(), ds.image(i), ds.image(i) + bytes);
    p.labels.push_back(ds.labels[size_t(i)]);
    ++p.n;
  }
  return out;
}

// ---- the standard datasets ---------------------------------------------------------------------

ImageSplits load_fashion_mnist(const std::string& dir) {
  return load_mnist_layout("fashion-mnist", dir, kFashionHint, kFashionClasses);
}
ImageSplits load_mnist(const std::string& dir) { return load_mnist_layout("mnist", dir, kMnistHint, kDigitClasses); }

ImageSplits load_cifar10(const std::string& dir) {
  const std::string folder = cifar_folder(dir);
  if (folder.empty())
    throw DatasetNotFound(fmt::format("cifar10: no test_batch.bin in {} or {}/cifar-10-batches-bin; {}", dir, dir,
                                      kCifarHint));
  std::vector<ImageDataset> train;
  for (int i = 1; i <= 5; ++i) {
    const std::string p = (fs::path(folder) / fmt::format("data_batch_{}.bin", i)).string();
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) throw DatasetNotFound(fmt::format("cifar10: {} not found; {}", p, kCifarHint));
    train.push_back(read_cifar10_batch(p));
  }
  return {concat(train), read_cifar10_batch((fs::path(folder) / "test_batch.bin").string())};
}

bool fashion_mnist_available(const std::string& dir) { return mnist_available(dir); }
bool mnist_available(const std::string& dir) {
  for (const char* b : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                        "t10k-labels-idx1-ubyte"})
    if (find_idx(dir, b).empty()) return false;
  return true;
}
bool cifar10_available(const std::string& dir) {
  const std::string folder = cifar_folder(dir);
  if (folder.empty()) return false;
  std::error_code ec;
  for (int i = 1; i <= 5; ++i)
    if (!fs::is_regular_file(fs::path(folder) / fmt::format("data_batch_{}.bin", i), ec)) return false;
  return true;
}

// ---- normalisation -----------------------------------------------------------------------------

Normalization channel_stats(const ImageDataset& ds) {
  check(ds.n > 0, "channel_stats: the dataset is empty");
  const int64_t hw = int64_t(ds.height) * ds.width;
  Normalization s;
  for (int c = 0; c < ds.channels; ++c) {
    // integer sums are exact: 255^2 * 2^31 pixels still fits in int64
    int64_t sum = 0, sum2 = 0;
    for (int64_t i = 0; i < ds.n; ++i) {
      const uint8_t* p = ds.image(i) + c * hw;
      for (int64_t k = 0; k < hw; ++k) sum += p[k], sum2 += int64_t(p[k]) * p[k];
    }
    const double count = double(ds.n) * double(hw);
    const double mean = double(sum) / count / 255.0;
    const double var = double(sum2) / count / (255.0 * 255.0) - mean * mean;  // E[x^2] - E[x]^2
    s.mean.push_back(mean);
    s.std.push_back(std::sqrt(std::max(var, 0.0)));
  }
  return s;
}

Normalization fashion_mnist_stats() { return {{0.2860}, {0.3530}}; }
Normalization mnist_stats() { return {{0.1307}, {0.3081}}; }
Normalization cifar10_stats() { return {{0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616}}; }

// ---- batches and augmentation ------------------------------------------------------------------

Batch make_batch(const ImageDataset& ds, std::span<const int64_t> indices, const Normalization& norm,
                 const Augment& aug, Generator* gen) {
  const int64_t B = int64_t(indices.size());
  const int C = ds.channels, H = ds.height, W = ds.width;
  check(int64_t(ds.images.size()) == ds.n * ds.image_size() && int64_t(ds.labels.size()) == ds.n,
        "make_batch: dataset of {} images [{}, {}, {}] holds {} pixel bytes and {} labels", ds.n, C, H, W,
        ds.images.size(), ds.labels.size());
  check(norm.mean.size() == size_t(C) && norm.std.size() == size_t(C),
        "make_batch: normalisation has {} means and {} stds for images with {} channels", norm.mean.size(),
        norm.std.size(), C);
  for (int c = 0; c < C; ++c)
    check(norm.std[size_t(c)] > 0, "make_batch: std of channel {} is {}, expected > 0", c, norm.std[size_t(c)]);
  check(aug.pad >= 0 && aug.pad <= 65536, "make_batch: crop padding {} is out of range [0, 65536]", aug.pad);
  for (int64_t b = 0; b < B; ++b)
    check(indices[size_t(b)] >= 0 && indices[size_t(b)] < ds.n,
          "make_batch: index {} (batch position {}) is out of range for a dataset of {} images", indices[size_t(b)],
          b, ds.n);

  // (v/255 - mean_c)/std_c for the 256 byte values: one lookup per pixel instead of a division
  std::vector<std::array<float, 256>> lut(static_cast<size_t>(C));
  for (int c = 0; c < C; ++c)
    for (int v = 0; v < 256; ++v)
      lut[size_t(c)][size_t(v)] = float((v / 255.0 - norm.mean[size_t(c)]) / norm.std[size_t(c)]);

  // image b draws Philox block offset + b: (dy, dx, flip) from lanes 0, 1, 2
  const bool augment = aug.pad > 0 || aug.flip;
  uint64_t seed = 0, offset = 0;
  if (augment) {
    Generator& g = gen ? *gen : default_generator();
    seed = g.seed();
    offset = g.advance(uint64_t(B));
  }

  Batch out;
  out.images = empty({B, C, H, W}, DType::f32);
  float* dst = out.images.data<float>();
  const int64_t image_size = ds.image_size(), hw = int64_t(H) * W;
  const int pad = aug.pad;
  parallel_for(B, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, image_size)), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* src = ds.image(indices[size_t(b)]);
      float* o = dst + b * image_size;
      int dy = 0, dx = 0;
      bool flip = false;
      if (augment) {
        const Philox4 r = philox4x32_10(seed, offset + uint64_t(b));
        dy = int(r.v[0] % uint32_t(2 * pad + 1)) - pad;  // the window's top-left, relative to the image
        dx = int(r.v[1] % uint32_t(2 * pad + 1)) - pad;
        flip = aug.flip && (r.v[2] >> 31) != 0;
      }
      for (int c = 0; c < C; ++c) {
        const float* l = lut[size_t(c)].data();
        const uint8_t* s = src + c * hw;
        for (int y = 0; y < H; ++y) {
          const int sy = y + dy;
          float* orow = o + c * hw + int64_t(y) * W;
          if (sy < 0 || sy >= H) {
            for (int x = 0; x < W; ++x) orow[x] = l[0];  // the whole row is padding
            continue;
          }
          const uint8_t* srow = s + int64_t(sy) * W;
          for (int x = 0; x < W; ++x) {
            // crop: cropped(y, x) = in(y+dy, x+dx); flip: out(y, x) = cropped(y, W-1-x)
            const int sx = (flip ? W - 1 - x : x) + dx;
            orow[x] = l[(sx >= 0 && sx < W) ? srow[sx] : 0];
          }
        }
      }
    }
  });

  std::vector<int64_t> labels(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) labels[size_t(b)] = ds.labels[size_t(indices[size_t(b)])];
  out.labels = from_vector<int64_t>(labels, Shape{B});
  return out;
}

}  // namespace ag::data
