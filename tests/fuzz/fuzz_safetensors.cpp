// libFuzzer target: the safetensors reader (core/serialize.h), on any bytes as a file.
// What loads must save again and load back with the same names, order, dtypes, shapes, bytes and
// metadata.
#include <cstring>

#include "core/serialize.h"
#include "tests/fuzz/fuzz_common.h"

using namespace ag;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_file("in.safetensors", fuzz::as_view(data, size));
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> meta;
  if (!fuzz::ok_or_error("safetensors", [&] { tensors = load_safetensors(path, &meta); })) return 0;

  const std::string again = fuzz::scratch_path("again.safetensors");
  std::vector<std::pair<std::string, Tensor>> back;
  std::map<std::string, std::string> meta_back;
  fuzz::must("safetensors", "saving what was loaded", [&] { save_safetensors(again, tensors, meta); });
  fuzz::must("safetensors", "loading what was saved", [&] { back = load_safetensors(again, &meta_back); });
  fuzz::expect("safetensors", back.size() == tensors.size() && meta_back == meta,
               "save + load changed the tensor count or the metadata");
  for (size_t i = 0; i < back.size(); ++i) {
    const Tensor &a = tensors[i].second, &b = back[i].second;
    fuzz::expect("safetensors", back[i].first == tensors[i].first,
                 "save + load changed the order: '" + tensors[i].first + "' came back as '" + back[i].first + "'");
    fuzz::expect("safetensors", a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
                                    (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0),
                 "save + load changed tensor '" + tensors[i].first + "'");
  }
  return 0;
}
