// Vision data (data/idx.h, data/images.h): IDX files plain and gzipped, CIFAR-10 binary batches,
// every class of corrupt file, normalisation, crop/flip on a known image, determinism, and the
// real Fashion-MNIST when Debian's dataset-fashion-mnist is installed.
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "data/idx.h"
#include "data/images.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::data;
using namespace ag::test;
namespace fs = std::filesystem;

namespace {

// An IDX file as the format lays it out: 0x00 0x00 type ndims, big-endian u32 dims, data.
std::string idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, const std::string& data) {
  std::string s = {'\0', '\0', char(type), char(dims.size())};
  for (uint32_t d : dims)
    for (int k = 3; k >= 0; --k) s += char((d >> (8 * k)) & 0xff);
  return s + data;
}
std::string u8s(std::initializer_list<int> v) {
  std::string s;
  for (int x : v) s += char(uint8_t(x));
  return s;
}
// Bytes 0, 1, 2, ... (mod 251, so they do not repeat with the image size).
std::string ramp(size_t n, int start = 0) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = char(uint8_t((start + i) % 251));
  return s;
}
void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), unsigned(bytes.size())) == int(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}
std::vector<int64_t> as_ints(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }
std::vector<int64_t> as_ints(const std::string& s) {
  std::vector<int64_t> v;
  for (char c : s) v.push_back(uint8_t(c));
  return v;
}

// An MNIST-layout folder: n train and m test images of h x w, labels i % 10; images gzipped,
// labels plain (both forms must be found).
void write_mnist_folder(const std::string& dir, uint32_t n, uint32_t m, uint32_t h, uint32_t w) {
  auto labels = [](uint32_t k) {
    std::string s;
    for (uint32_t i = 0; i < k; ++i) s += char(i % 10);
    return s;
  };
  write_gz(dir + "/train-images-idx3-ubyte.gz", idx_bytes(0x08, {n, h, w}, ramp(size_t(n) * h * w)));
  write_bytes(dir + "/train-labels-idx1-ubyte", idx_bytes(0x08, {n}, labels(n)));
  write_gz(dir + "/t10k-images-idx3-ubyte.gz", idx_bytes(0x08, {m, h, w}, ramp(size_t(m) * h * w, 100)));
  write_bytes(dir + "/t10k-labels-idx1-ubyte", idx_bytes(0x08, {m}, labels(m)));
}

// A hand-made dataset of one image per entry of `pixels`, all C x H x W, labels 0, 1, 2, ...
ImageDataset tiny_dataset(int C, int H, int W, const std::vector<std::vector<int>>& pixels) {
  ImageDataset ds;
  ds.n = int64_t(pixels.size());
  ds.channels = C, ds.height = H, ds.width = W, ds.num_classes = 10;
  for (size_t i = 0; i < pixels.size(); ++i) {
    REQUIRE(int64_t(pixels[i].size()) == ds.image_size());
    for (int v : pixels[i]) ds.images.push_back(uint8_t(v));
    ds.labels.push_back(int64_t(i));
  }
  return ds;
}

// A batch's pixels back in 0..255 units, for a batch made with mean 0 and std 1.
std::vector<int> raw_pixels(const Tensor& images) {
  std::vector<int> v;
  for (float x : images.to_vector<float>()) v.push_back(int(std::lround(x * 255.0f)));
  return v;
}

}  // namespace

// ---- IDX -------------------------------------------------------------------------------------

TEST_CASE("idx: round trip plain and gzip") {
  TempDir tmp("idx_rt");
  const std::string data = ramp(3 * 2 * 4);
  const std::string bytes = idx_bytes(0x08, {3, 2, 4}, data);
  write_bytes(tmp.file("a.idx"), bytes);
  write_gz(tmp.file("a.idx.gz"), bytes);
  CHECK(fs::file_size(tmp.file("a.idx.gz")) != bytes.size());  // really compressed, not stored plain
  for (const char* name : {"a.idx", "a.idx.gz"}) {
    CAPTURE(name);
    IdxArray a = read_idx(tmp.file(name));
    CHECK(a.dims == std::vector<int64_t>{3, 2, 4});
    CHECK(a.numel() == 24);
    CHECK(as_ints(a.data) == as_ints(data));
  }
  // a 1-D labels file with the byte values spelled out
  write_gz(tmp.file("l.gz"), idx_bytes(0x08, {5}, u8s({9, 0, 3, 255, 7})));
  IdxArray l = read_idx(tmp.file("l.gz"));
  CHECK(l.dims == std::vector<int64_t>{5});
  CHECK(as_ints(l.data) == std::vector<int64_t>{9, 0, 3, 255, 7});
  // big-endian dims: 0x00000102 = 258
  write_bytes(tmp.file("be.idx"), idx_bytes(0x08, {258}, ramp(258)));
  CHECK(read_idx(tmp.file("be.idx")).dims == std::vector<int64_t>{258});
}

TEST_CASE("idx: corrupt files") {
  TempDir tmp("idx_bad");
  auto put = [&](const std::string& name, const std::string& bytes) {
    write_bytes(tmp.file(name), bytes);
    return tmp.file(name);
  };
  AG_CHECK_ERROR(read_idx(tmp.file("none.gz")), "idx", "none.gz", "no such file");
  AG_CHECK_ERROR(read_idx(put("empty", "")), "idx", "empty", "truncated", "0 bytes");
  AG_CHECK_ERROR(read_idx(put("short", u8s({0, 0, 8}))), "short", "truncated", "3 bytes");
  AG_CHECK_ERROR(read_idx(put("magic", u8s({0x1f, 0x00, 8, 1, 0, 0, 0, 1, 5}))), "magic", "bad magic", "0x1f");
  AG_CHECK_ERROR(read_idx(put("float", idx_bytes(0x0D, {1}, "abcd"))), "float", "0x0d", "(float)", "not supported");
  AG_CHECK_ERROR(read_idx(put("type", idx_bytes(0x42, {1}, "a"))), "type", "unknown element type 0x42");
  AG_CHECK_ERROR(read_idx(put("nd0", idx_bytes(0x08, {}, ""))), "nd0", "ndims is 0");
  AG_CHECK_ERROR(read_idx(put("dims", u8s({0, 0, 8, 3, 0, 0, 0, 2, 0, 0}))), "dims", "truncated header", "3 dims",
                 "12 bytes", "got 6");
  // the header promises 60000x28x28 bytes: the reader must not believe it before the bytes arrive
  AG_CHECK_ERROR(read_idx(put("lie", idx_bytes(0x08, {60000, 28, 28}, ramp(10)))), "lie", "truncated",
                 "60000, 28, 28", "47040000", "only 10 follow");
  AG_CHECK_ERROR(read_idx(put("huge", idx_bytes(0x08, {0xFFFFFFFFu, 0xFFFFFFFFu}, "x"))), "huge", "2^40");
  AG_CHECK_ERROR(read_idx(put("extra", idx_bytes(0x08, {2, 2}, ramp(7)))), "extra", "3 bytes after the 4 data bytes");
  // gzipped: data cut short inside a valid stream, then the stream itself cut short, then garbled
  write_gz(tmp.file("trunc.gz"), idx_bytes(0x08, {4, 4}, ramp(15)));
  AG_CHECK_ERROR(read_idx(tmp.file("trunc.gz")), "trunc.gz", "truncated", "16 data bytes", "only 15 follow");
  write_gz(tmp.file("whole.gz"), idx_bytes(0x08, {64, 64}, ramp(4096)));
  const std::string gz = read_bytes(tmp.file("whole.gz"));
  AG_CHECK_ERROR(read_idx(put("cut.gz", gz.substr(0, gz.size() / 2))), "cut.gz", "truncated gzip stream",
                 "unexpected end of file");
  std::string garbled = gz;
  for (size_t i = 12; i < garbled.size() - 8; ++i) garbled[i] = char(~garbled[i]);
  AG_CHECK_ERROR(read_idx(put("garbled.gz", garbled)), "garbled.gz", "gzip stream");
}

TEST_CASE("idx: images and labels as one dataset") {
  TempDir tmp("idx_ds");
  const std::string imgs = ramp(3 * 2 * 2);
  write_gz(tmp.file("im.gz"), idx_bytes(0x08, {3, 2, 2}, imgs));
  write_bytes(tmp.file("lb"), idx_bytes(0x08, {3}, u8s({2, 0, 1})));
  ImageDataset ds = load_idx_dataset(tmp.file("im.gz"), tmp.file("lb"), {"a", "b", "c"});
  CHECK(ds.size() == 3);
  CHECK(ds.channels == 1);
  CHECK(ds.height == 2);
  CHECK(ds.width == 2);
  CHECK(ds.num_classes == 3);
  CHECK(ds.labels == std::vector<int64_t>{2, 0, 1});
  CHECK(as_ints(ds.images) == as_ints(imgs));
  CHECK(int(ds.image(2)[0]) == 8);  // image 2 starts at byte 2*4

  write_bytes(tmp.file("lb4"), idx_bytes(0x08, {4}, u8s({0, 1, 2, 0})));
  AG_CHECK_ERROR(load_idx_dataset(tmp.file("im.gz"), tmp.file("lb4"), {"a", "b", "c"}), "im.gz", "3 images",
                 "lb4", "4 labels");
  write_bytes(tmp.file("lb_big"), idx_bytes(0x08, {3}, u8s({0, 3, 1})));
  AG_CHECK_ERROR(load_idx_dataset(tmp.file("im.gz"), tmp.file("lb_big"), {"a", "b", "c"}), "lb_big", "label 3",
                 "image 1", "3 classes");
  AG_CHECK_ERROR(load_idx_dataset(tmp.file("lb"), tmp.file("lb"), {"a", "b", "c"}), "images need 3 dims", "[3]");
  AG_CHECK_ERROR(load_idx_dataset(tmp.file("im.gz"), tmp.file("im.gz"), {"a", "b", "c"}), "labels need 1 dim",
                 "[3, 2, 2]");
  write_bytes(tmp.file("im0"), idx_bytes(0x08, {3, 0, 2}, ""));
  AG_CHECK_ERROR(load_idx_dataset(tmp.file("im0"), tmp.file("lb"), {"a", "b", "c"}), "im0", "image size 0x2");
}

TEST_CASE("hold_out: a fixed part of a training set for validation, the rest in order") {
  ImageDataset ds;
  ds.n = 50, ds.channels = 1, ds.height = 1, ds.width = 2, ds.num_classes = 5, ds.class_names = {"a", "b", "c", "d", "e"};
  for (int i = 0; i < 50; ++i) {
    ds.images.push_back(uint8_t(i)), ds.images.push_back(uint8_t(100 + i));  // image i is (i, 100 + i)
    ds.labels.push_back(i % 5);
  }
  const HeldOut h = hold_out(ds, 12, 7);
  REQUIRE(h.held.size() == 12);
  REQUIRE(h.rest.size() == 38);
  for (const ImageDataset* p : {&h.held, &h.rest}) {
    CHECK(p->images.size() == size_t(p->n) * 2);
    CHECK(p->labels.size() == size_t(p->n));
    CHECK(p->class_names == ds.class_names);
    CHECK(p->width == 2);
  }
  // every image once, in one part or the other, with its own label and bytes, in the original order
  std::vector<int> seen(50, 0);
  for (const ImageDataset* p : {&h.held, &h.rest}) {
    int previous = -1;
    for (int64_t k = 0; k < p->size(); ++k) {
      const int i = p->image(k)[0];
      CHECK(int(p->image(k)[1]) == 100 + i);
      CHECK(p->labels[size_t(k)] == i % 5);
      CHECK(i > previous);
      previous = i, ++seen[size_t(i)];
    }
  }
  CHECK(std::count(seen.begin(), seen.end(), 1) == 50);
  // the same seed holds out the same images; another seed others; not simply the first or last 12
  CHECK(hold_out(ds, 12, 7).held.images == h.held.images);
  CHECK(hold_out(ds, 12, 8).held.images != h.held.images);
  std::vector<int> held;
  for (int64_t k = 0; k < 12; ++k) held.push_back(h.held.image(k)[0]);
  CHECK(held.back() - held.front() > 12);
  CHECK(hold_out(ds, 0, 7).rest.images == ds.images);
  AG_CHECK_ERROR(hold_out(ds, 50, 7), "hold_out", "50 images held out of 50", "0 to train on");
  AG_CHECK_ERROR(hold_out(ds, -1, 7), "hold_out", "-1");
}

TEST_CASE("load_fashion_mnist: a synthetic folder, and a missing one") {
  TempDir tmp("fmnist");
  write_mnist_folder(tmp.dir.string(), 20, 10, 4, 3);
  CHECK(fashion_mnist_available(tmp.dir.string()));
  ImageSplits s = load_fashion_mnist(tmp.dir.string());
  CHECK(s.train.size() == 20);
  CHECK(s.test.size() == 10);
  CHECK(s.train.height == 4);
  CHECK(s.train.width == 3);
  CHECK(s.train.labels[13] == 3);
  CHECK(int(s.test.image(0)[0]) == 100);  // the test ramp starts at 100
  CHECK(s.train.class_names.at(9) == "Ankle boot");
  CHECK(load_mnist(tmp.dir.string()).train.class_names.at(7) == "7");

  // missing: the distinguishable type, naming the Debian package
  fs::remove(tmp.file("t10k-labels-idx1-ubyte"));
  CHECK_FALSE(fashion_mnist_available(tmp.dir.string()));
  std::string msg;
  try {
    load_fashion_mnist(tmp.dir.string());
  } catch (const DatasetNotFound& e) {
    msg = e.what();
  }
  CHECK(msg.find("t10k-labels-idx1-ubyte") != std::string::npos);
  CHECK(msg.find("dataset-fashion-mnist") != std::string::npos);
  AG_CHECK_ERROR(load_fashion_mnist(tmp.file("nowhere")), "fashion-mnist", "nowhere", "not found",
                 "apt install dataset-fashion-mnist");
  CHECK_THROWS_AS(load_mnist(tmp.file("nowhere")), DatasetNotFound);
  // a corrupt file is an ag::Error but not DatasetNotFound
  write_bytes(tmp.file("t10k-labels-idx1-ubyte"), "garbage");
  CHECK(fashion_mnist_available(tmp.dir.string()));
  bool not_found = false, other = false;
  try {
    load_fashion_mnist(tmp.dir.string());
  } catch (const DatasetNotFound&) {
    not_found = true;
  } catch (const Error&) {
    other = true;
  }
  CHECK_FALSE(not_found);
  CHECK(other);
}

// ---- CIFAR-10 --------------------------------------------------------------------------------

namespace {
// One record: label, then red, green, blue planes; pixel (c, y, x) = (c*50 + y + x + seed) % 256.
std::string cifar_record(int label, int seed) {
  std::string s(1, char(label));
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x) s += char(uint8_t((c * 50 + y + x + seed) % 256));
  return s;
}
}  // namespace

TEST_CASE("cifar10: batch files and a whole folder") {
  TempDir tmp("cifar");
  write_bytes(tmp.file("b.bin"), cifar_record(3, 0) + cifar_record(9, 7));
  ImageDataset ds = read_cifar10_batch(tmp.file("b.bin"));
  CHECK(ds.size() == 2);
  CHECK(ds.channels == 3);
  CHECK(ds.height == 32);
  CHECK(ds.width == 32);
  CHECK(ds.labels == std::vector<int64_t>{3, 9});
  CHECK(ds.class_names.at(3) == "cat");
  // record 1, green (c=1), y=2, x=5: (50 + 2 + 5 + 7) = 64, at 1*1024 + 2*32 + 5 of image 1
  CHECK(int(ds.image(1)[1024 + 2 * 32 + 5]) == 64);
  // record 0, blue (c=2), y=31, x=31: (100 + 62) = 162
  CHECK(int(ds.image(0)[3 * 1024 - 1]) == 162);
  write_gz(tmp.file("b.bin.gz"), cifar_record(3, 0) + cifar_record(9, 7));
  CHECK(read_cifar10_batch(tmp.file("b.bin.gz")).images == ds.images);

  write_bytes(tmp.file("empty.bin"), "");
  AG_CHECK_ERROR(read_cifar10_batch(tmp.file("empty.bin")), "cifar10", "empty.bin", "empty");
  write_bytes(tmp.file("short.bin"), cifar_record(1, 0) + cifar_record(2, 0).substr(0, 100));
  AG_CHECK_ERROR(read_cifar10_batch(tmp.file("short.bin")), "short.bin", "size 3173", "3073-byte", "1 records",
                 "100 bytes left");
  write_bytes(tmp.file("label.bin"), cifar_record(1, 0) + cifar_record(10, 0));
  AG_CHECK_ERROR(read_cifar10_batch(tmp.file("label.bin")), "label.bin", "label 10", "record 1");
  AG_CHECK_ERROR(read_cifar10_batch(tmp.file("missing.bin")), "cifar10", "missing.bin", "no such file");

  // the folder the official tarball unpacks to, five training batches of 1..5 records
  const fs::path dir = tmp.dir / "cifar-10-batches-bin";
  fs::create_directories(dir);
  CHECK_FALSE(cifar10_available(tmp.dir.string()));
  write_bytes((dir / "test_batch.bin").string(), cifar_record(0, 1));
  CHECK_FALSE(cifar10_available(tmp.dir.string()));
  AG_CHECK_ERROR(load_cifar10(tmp.dir.string()), "cifar10", "data_batch_1.bin", "not found");
  for (int i = 1; i <= 5; ++i) {
    std::string recs;
    for (int r = 0; r < i; ++r) recs += cifar_record(i, r);
    write_bytes((dir / fmt::format("data_batch_{}.bin", i)).string(), recs);
  }
  CHECK(cifar10_available(tmp.dir.string()));
  ImageSplits s = load_cifar10(tmp.dir.string());
  CHECK(s.train.size() == 15);                     // 1+2+3+4+5
  CHECK(s.train.labels[0] == 1);
  CHECK(s.train.labels[14] == 5);
  CHECK(int(s.train.image(14)[0]) == 4);           // batch 5, record r=4: (0 + 0 + 0 + 4)
  CHECK(s.test.size() == 1);
  CHECK(load_cifar10(dir.string()).train.size() == 15);  // the inner folder works too
  CHECK_THROWS_AS(load_cifar10(tmp.file("nowhere")), DatasetNotFound);

  // concat refuses different image shapes
  AG_CHECK_ERROR(concat({s.train, tiny_dataset(1, 1, 2, {{0, 1}})}), "concat", "part 1", "[1, 1, 2]", "[3, 32, 32]");
}

// ---- normalisation and batches ---------------------------------------------------------------

TEST_CASE("make_batch: normalisation values") {
  // one channel, two 1x2 images: pixels {0, 255} and {51, 204}
  ImageDataset ds = tiny_dataset(1, 1, 2, {{0, 255}, {51, 204}});
  // channel_stats: x/255 = {0, 1, 0.2, 0.8}: mean 0.5; E[x^2] = (0 + 1 + 0.04 + 0.64)/4 = 0.42,
  // var = 0.42 - 0.25 = 0.17, std = sqrt(0.17)
  Normalization st = channel_stats(ds);
  check_close(st.mean, {0.5}, 1e-12);
  check_close(st.std, {std::sqrt(0.17)}, 1e-12);

  // (x/255 - 0.5)/0.25: 0 -> -2, 255 -> 2, 51 -> (0.2-0.5)/0.25 = -1.2, 204 -> (0.8-0.5)/0.25 = 1.2
  const std::vector<int64_t> idx = {1, 0, 1};
  Batch b = make_batch(ds, idx, {{0.5}, {0.25}});
  CHECK(b.images.shape() == Shape{3, 1, 1, 2});
  CHECK(b.images.dtype() == DType::f32);
  check_close(b.images, {-1.2, 1.2, -2, 2, -1.2, 1.2}, 1e-6);
  CHECK(b.labels.dtype() == DType::i64);
  CHECK(b.labels.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 1});

  // three channels, each with its own mean and std; one 1x1 image with pixels (255, 0, 102)
  ImageDataset rgb = tiny_dataset(3, 1, 1, {{255, 0, 102}});
  // red (1 - 0.5)/0.5 = 1; green (0 - 0.25)/0.125 = -2; blue (0.4 - 0.4)/2 = 0
  const std::vector<int64_t> zero = {0};
  check_close(make_batch(rgb, zero, {{0.5, 0.25, 0.4}, {0.5, 0.125, 2.0}}).images, {1, -2, 0}, 1e-6);
  Normalization s3 = channel_stats(rgb);
  check_close(s3.mean, {1.0, 0.0, 0.4}, 1e-12);
  check_close(s3.std, {0, 0, 0}, 1e-7);

  CHECK(fashion_mnist_stats().mean.size() == 1);
  CHECK(cifar10_stats().std.size() == 3);
  // an empty batch is fine
  CHECK(make_batch(ds, std::vector<int64_t>{}, st).images.shape() == Shape{0, 1, 1, 2});
}

TEST_CASE("make_batch: errors") {
  ImageDataset ds = tiny_dataset(1, 1, 2, {{0, 255}, {51, 204}});
  const Normalization n1 = {{0.5}, {0.25}};
  AG_CHECK_ERROR(make_batch(ds, std::vector<int64_t>{0, 2}, n1), "make_batch", "index 2", "position 1", "2 images");
  AG_CHECK_ERROR(make_batch(ds, std::vector<int64_t>{-1}, n1), "make_batch", "index -1");
  AG_CHECK_ERROR(make_batch(ds, std::vector<int64_t>{0}, cifar10_stats()), "make_batch", "3 means", "1 channels");
  AG_CHECK_ERROR(make_batch(ds, std::vector<int64_t>{0}, {{0.5}, {0.0}}), "make_batch", "std of channel 0 is 0");
  AG_CHECK_ERROR(make_batch(ds, std::vector<int64_t>{0}, n1, {.pad = -1}), "make_batch", "padding -1");
  ImageDataset broken = ds;
  broken.images.pop_back();
  AG_CHECK_ERROR(make_batch(broken, std::vector<int64_t>{0}, n1), "make_batch", "3 pixel bytes", "2 labels");
  AG_CHECK_ERROR(channel_stats(ImageDataset{}), "channel_stats", "empty");
}

TEST_CASE("make_batch: crop and flip on a known image") {
  // the 3x3 image        pad 1 lets the window move one pixel each way; e.g. window offset
  //   1 2 3              dy = -1 (shifted up), dx = -1 (left):  out(y,x) = in(y-1, x-1)
  //   4 5 6                0 0 0
  //   7 8 9                0 1 2
  //                        0 4 5
  ImageDataset ds = tiny_dataset(1, 3, 3, {{1, 2, 3, 4, 5, 6, 7, 8, 9}});
  const Normalization id = {{0.0}, {1.0}};  // output = x/255: raw_pixels() gives the bytes back
  const std::vector<int64_t> one = {0};

  // no augmentation: the image itself, and the generator is not touched
  Generator g(5);
  CHECK(raw_pixels(make_batch(ds, one, id, {}, &g).images) == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(g.offset() == 0);

  // hand-derived outputs for some (dy, dx, flip); flip mirrors after the crop: out(y,x) = crop(y, 2-x)
  const std::vector<int> up_left = {0, 0, 0, 0, 1, 2, 0, 4, 5};         // dy=-1, dx=-1
  const std::vector<int> down_right = {5, 6, 0, 8, 9, 0, 0, 0, 0};      // dy=+1, dx=+1
  const std::vector<int> center_flip = {3, 2, 1, 6, 5, 4, 9, 8, 7};     // dy=0, dx=0, flipped
  const std::vector<int> up_left_flip = {0, 0, 0, 2, 1, 0, 5, 4, 0};    // dy=-1, dx=-1, flipped
  const std::vector<int> center = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  // all 18 possible outputs, from the definition in images.h
  auto shifted = [](int dy, int dx, bool flip) {
    std::vector<int> o(9);
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 3; ++x) {
        const int sy = y + dy, sx = (flip ? 2 - x : x) + dx;
        o[size_t(y * 3 + x)] = (sy >= 0 && sy < 3 && sx >= 0 && sx < 3) ? sy * 3 + sx + 1 : 0;
      }
    return o;
  };
  CHECK(shifted(-1, -1, false) == up_left);
  CHECK(shifted(1, 1, false) == down_right);
  CHECK(shifted(0, 0, true) == center_flip);
  CHECK(shifted(-1, -1, true) == up_left_flip);
  std::map<std::vector<int>, int> possible;
  for (int dy = -1; dy <= 1; ++dy)
    for (int dx = -1; dx <= 1; ++dx)
      for (bool f : {false, true}) possible[shifted(dy, dx, f)] = 0;
  REQUIRE(possible.size() == 18);

  // 400 draws of the same image: every output is one of the 18, and all 18 appear
  const std::vector<int64_t> many(400, 0);
  Batch b = make_batch(ds, many, id, {.pad = 1, .flip = true}, &g);
  CHECK(g.offset() == 400);  // one Philox block per image
  const std::vector<int> px = raw_pixels(b.images);
  for (int i = 0; i < 400; ++i) {
    std::vector<int> img(px.begin() + i * 9, px.begin() + (i + 1) * 9);
    auto it = possible.find(img);
    REQUIRE_MESSAGE(it != possible.end(), "image " << i << " is no crop/flip of the input");
    ++it->second;
  }
  for (const auto& [img, count] : possible) CHECK(count > 0);
  CHECK(possible[up_left] > 0);
  CHECK(possible[down_right] > 0);

  // flip only: the centre image or its mirror, each about half the time
  Batch f = make_batch(ds, many, id, {.pad = 0, .flip = true}, &g);
  const std::vector<int> fp = raw_pixels(f.images);
  int mirrored = 0;
  for (int i = 0; i < 400; ++i) {
    std::vector<int> img(fp.begin() + i * 9, fp.begin() + (i + 1) * 9);
    CHECK((img == center || img == center_flip));
    mirrored += img == center_flip;
  }
  CHECK(mirrored > 150);
  CHECK(mirrored < 250);

  // crop only: never mirrored
  Batch c = make_batch(ds, many, id, {.pad = 1, .flip = false}, &g);
  const std::vector<int> cp = raw_pixels(c.images);
  for (int i = 0; i < 400; ++i) {
    std::vector<int> img(cp.begin() + i * 9, cp.begin() + (i + 1) * 9);
    bool unflipped = false;
    for (int dy = -1; dy <= 1; ++dy)
      for (int dx = -1; dx <= 1; ++dx) unflipped |= img == shifted(dy, dx, false);
    CHECK(unflipped);
  }

  // padding normalises like a 0 pixel: (0 - 0.5)/0.25 = -2 in the zeroed corner of up_left
  Generator g2(5);
  Batch n = make_batch(ds, many, {{0.5}, {0.25}}, {.pad = 1, .flip = true}, &g2);
  const std::vector<float> nv = n.images.to_vector<float>();
  for (int i = 0; i < 400; ++i)
    if (std::vector<int>(px.begin() + i * 9, px.begin() + (i + 1) * 9) == up_left) {
      CHECK(nv[size_t(i * 9)] == doctest::Approx(-2.0));
      CHECK(nv[size_t(i * 9 + 4)] == doctest::Approx((1 / 255.0 - 0.5) / 0.25));
    }
}

TEST_CASE("make_batch: augmentation is reproducible from the seed") {
  // 32x32 images so that a batch of 64 spans several parallel_for chunks (kGrain / 1024 = 32)
  std::vector<std::vector<int>> pixels(8, std::vector<int>(32 * 32));
  for (size_t i = 0; i < pixels.size(); ++i)
    for (size_t k = 0; k < pixels[i].size(); ++k) pixels[i][k] = int((i * 37 + k * 11) % 256);
  ImageDataset ds = tiny_dataset(1, 32, 32, pixels);
  std::vector<int64_t> idx(64);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int64_t((i * 5) % 8);
  const Normalization norm = channel_stats(ds);
  const Augment aug = {.pad = 4, .flip = true};

  Generator a(42), b(42), c(43);
  const std::vector<float> a1 = make_batch(ds, idx, norm, aug, &a).images.to_vector<float>();
  const std::vector<float> a2 = make_batch(ds, idx, norm, aug, &a).images.to_vector<float>();
  CHECK(a1 == make_batch(ds, idx, norm, aug, &b).images.to_vector<float>());  // same seed, same batch
  CHECK(a1 != a2);                                                             // next step, new draws
  CHECK(a1 != make_batch(ds, idx, norm, aug, &c).images.to_vector<float>());  // other seed
  // resuming from a saved (seed, offset) replays step 2
  Generator resumed(42);
  resumed.set_offset(64);
  CHECK(a2 == make_batch(ds, idx, norm, aug, &resumed).images.to_vector<float>());

  // the thread count does not change anything
  const int threads = num_threads();
  set_num_threads(1);
  Generator one(42);
  const std::vector<float> single = make_batch(ds, idx, norm, aug, &one).images.to_vector<float>();
  set_num_threads(std::max(threads, 2));
  Generator two(42);
  const std::vector<float> multi = make_batch(ds, idx, norm, aug, &two).images.to_vector<float>();
  set_num_threads(threads);
  CHECK(single == a1);
  CHECK(multi == a1);
}

// ---- the real data, when installed --------------------------------------------------------------

TEST_CASE("load_fashion_mnist: the Debian package's files") {
  if (!fashion_mnist_available()) {
    MESSAGE("[skipped: dataset-fashion-mnist not installed]");
    return;
  }
  ImageSplits s = load_fashion_mnist();
  CHECK(s.train.size() == 60000);
  CHECK(s.test.size() == 10000);
  CHECK(s.train.channels == 1);
  CHECK(s.train.height == 28);
  CHECK(s.train.width == 28);
  CHECK(s.train.images.size() == size_t(60000 * 784));  // compact: one byte a pixel
  std::vector<int64_t> train_hist(10), test_hist(10);
  for (int64_t l : s.train.labels) ++train_hist[size_t(l)];
  for (int64_t l : s.test.labels) ++test_hist[size_t(l)];
  CHECK(train_hist == std::vector<int64_t>(10, 6000));
  CHECK(test_hist == std::vector<int64_t>(10, 1000));
  // the published constants are the training set's statistics
  Normalization st = channel_stats(s.train);
  check_close(st.mean, fashion_mnist_stats().mean, 1e-4);
  check_close(st.std, fashion_mnist_stats().std, 1e-4);
}
