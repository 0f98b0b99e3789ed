// libFuzzer target: one CIFAR-10 binary batch (data/images.h read_cifar10_batch), plain or gzipped,
// and a batch made from what it read (data/images.h make_batch, with augmentation).
#include "data/images.h"
#include "tests/fuzz/fuzz_common.h"

using namespace ag;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* kTarget = "cifar10";
  const std::string path = fuzz::write_file("data_batch_1.bin", fuzz::as_view(data, size));
  data::ImageDataset ds;
  if (!fuzz::ok_or_error(kTarget, [&] { ds = data::read_cifar10_batch(path); })) return 0;
  fuzz::expect(kTarget, ds.n >= 1 && int64_t(ds.images.size()) == ds.n * 3 * 32 * 32 && int64_t(ds.labels.size()) == ds.n,
               "read_cifar10_batch: sizes disagree");
  const std::vector<int64_t> idx = {0, ds.n - 1};
  Generator gen(1);
  fuzz::must(kTarget, "make_batch", [&] {
    data::Batch b = data::make_batch(ds, idx, data::cifar10_stats(), {.pad = 4, .flip = true}, &gen);
    fuzz::expect(kTarget, b.images.shape() == Shape{2, 3, 32, 32}, "make_batch: wrong shape");
  });
  return 0;
}
