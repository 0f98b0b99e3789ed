#pragma once
// Image classification datasets: Fashion-MNIST / MNIST (IDX files, data/idx.h) and CIFAR-10
// (binary version), kept compact as bytes, turned into normalised (and optionally augmented)
// f32 batches on demand.
//
// CIFAR-10 binary files (data_batch_1.bin .. data_batch_5.bin, test_batch.bin; 10000 records
// each in the official release, any whole number of records accepted here):
//   a sequence of 3073-byte records, nothing else (no header):
//     byte 0          label, 0..9
//     bytes 1..1024   red channel,   32x32, row-major (row 0 first, column 0 first)
//     bytes 1025..2048 green channel, same order
//     bytes 2049..3072 blue channel,  same order
// i.e. one record is label + a [3, 32, 32] u8 image in exactly the [C, H, W] order we keep.
// Classes: airplane automobile bird cat deer dog frog horse ship truck.
//
// Shapes: N images, C channels, H x W pixels, B images in a batch.
//   ImageDataset::images  u8  [N, C, H, W]   raw pixels 0..255
//   ImageDataset::labels  i64 [N]            0 <= label < num_classes
//   Batch::images         f32 [B, C, H, W]   (x/255 - mean_c) / std_c, after augmentation
//   Batch::labels         i64 [B]
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"

namespace ag::data {

// A dataset whose files are not there. Apps catch this type (and only this one) to print the hint
// and exit with code 2; a corrupt file is a plain ag::Error.
struct DatasetNotFound : Error {
  using Error::Error;
};

struct ImageDataset {
  int64_t n = 0;                         // number of images
  int channels = 0, height = 0, width = 0;
  int num_classes = 0;
  std::vector<uint8_t> images;           // [N, C, H, W], n * image_size() bytes
  std::vector<int64_t> labels;           // [N]
  std::vector<std::string> class_names;  // [num_classes]

  int64_t size() const { return n; }
  int64_t image_size() const { return int64_t(channels) * height * width; }  // C*H*W
  const uint8_t* image(int64_t i) const { return images.data() + i * image_size(); }
};

struct ImageSplits {
  ImageDataset train, test;
};

// ---- readers -----------------------------------------------------------------------------------

// An IDX images file ([N, H, W], u8) and its IDX labels file ([N], u8) as one dataset with C = 1.
// Raises ag::Error naming the files when the counts disagree, a file has the wrong ndims, or a
// label is >= class_names.size().
ImageDataset load_idx_dataset(const std::string& images_path, const std::string& labels_path,
                              const std::vector<std::string>& class_names);

// One CIFAR-10 binary batch file (gzipped or plain). Raises ag::Error naming the file when it is
// empty, not a whole number of 3073-byte records, or holds a label >= 10.
ImageDataset read_cifar10_batch(const std::string& path);

// Concatenates datasets of the same image shape and classes (e.g. CIFAR's five training batches).
ImageDataset concat(const std::vector<ImageDataset>& parts);

// A validation split held out of a training set: the last `n` images of a permutation of `ds`
// drawn from `seed` (the same images for the same seed and size, on every machine) form `held`,
// the others, in their original order, `rest`. Raises ag::Error when n < 0 or n >= ds.size() (no
// training image would be left).
struct HeldOut {
  ImageDataset rest, held;
};
HeldOut hold_out(const ImageDataset& ds, int64_t n, uint64_t seed);

// ---- the standard datasets ---------------------------------------------------------------------

// Where Debian's dataset-fashion-mnist package installs the files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] in `dir` (the .gz is used when both exist).
// Fashion-MNIST: 60000 train / 10000 test, 28x28 grey, 10 classes (T-shirt/top ... Ankle boot).
// Raises DatasetNotFound when a file is missing, saying to install dataset-fashion-mnist.
ImageSplits load_fashion_mnist(const std::string& dir = kFashionMnistDir);
// The original MNIST digits, same file names and layout; DatasetNotFound when files are missing.
ImageSplits load_mnist(const std::string& dir);
// data_batch_1..5.bin (train, 50000) and test_batch.bin (10000) in `dir` or in
// `dir`/cifar-10-batches-bin (the folder the official tarball unpacks to). DatasetNotFound when
// missing (CIFAR-10 has no Debian package: https://www.cs.toronto.edu/~kriz/cifar.html).
ImageSplits load_cifar10(const std::string& dir);

// Whether load_fashion_mnist(dir) / load_mnist(dir) / load_cifar10(dir) would find its files.
bool fashion_mnist_available(const std::string& dir = kFashionMnistDir);
bool mnist_available(const std::string& dir);
bool cifar10_available(const std::string& dir);

// ---- normalisation -----------------------------------------------------------------------------

// Per-channel mean and standard deviation of x/255 (so in [0, 1] units), one entry per channel.
struct Normalization {
  std::vector<double> mean, std;
};
// Computed over every pixel of `ds` (population std, as torchvision recipes compute it). Use the
// training set's statistics for the test set too.
Normalization channel_stats(const ImageDataset& ds);
// The usual published constants (the training sets' channel_stats, rounded).
Normalization fashion_mnist_stats();  // mean 0.2860, std 0.3530
Normalization mnist_stats();          // mean 0.1307, std 0.3081
Normalization cifar10_stats();        // mean (0.4914, 0.4822, 0.4465), std (0.2470, 0.2435, 0.2616)

// ---- batches and augmentation ------------------------------------------------------------------

// Training-time augmentation, applied to the raw pixels before normalisation, in this order:
//   crop:  pad the image with `pad` pixels of value 0 on every side, then cut an H x W window at a
//          random offset (dy, dx), each uniform in [0, 2*pad]:  out(y, x) = in(y+dy-pad, x+dx-pad),
//          0 outside the image (so a padded pixel normalises to (0 - mean_c)/std_c, as
//          torchvision's RandomCrop(padding=pad) followed by Normalize gives);
//   flip:  with probability 1/2, mirror left-right: out(y, x) = in(y, W-1-x).
// Flips suit Fashion-MNIST and CIFAR-10 (a mirrored shoe or truck is still one) but NOT digits:
// a mirrored 2, 3, 7 or 9 is not a digit, so leave flip off for MNIST.
struct Augment {
  int pad = 0;        // 0: no crop
  bool flip = false;
};

struct Batch {
  Tensor images;  // f32 [B, C, H, W]
  Tensor labels;  // i64 [B]
};

// Images `indices` of `ds` as a normalised f32 batch, with `aug` applied. The random choices come
// from `gen` (default_generator() when null): image b of the batch uses Philox block
// gen.offset() + b, and the call advances gen by B blocks, so a run is reproducible from the seed
// and the batch order, independent of the thread count. Without augmentation gen is not touched.
// Raises ag::Error for an index out of [0, N), a Normalization with the wrong channel count or a
// std <= 0, or pad < 0.
Batch make_batch(const ImageDataset& ds, std::span<const int64_t> indices, const Normalization& norm,
                 const Augment& aug = {}, Generator* gen = nullptr);

}  // namespace ag::data
