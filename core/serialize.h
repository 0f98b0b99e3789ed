#pragma once
// Checkpoints in the safetensors format (https://github.com/huggingface/safetensors), the format
// PyTorch models are shared in, so a state_dict saved here loads there and back.
//
// A file is three parts, nothing else:
//
//   [ N: u64, little-endian ][ N bytes: a JSON object, padded with spaces ][ raw data ]
//
//   {"__metadata__": {"step": "100"},                                      (optional, str -> str)
//    "wte.weight": {"dtype": "F32", "shape": [50, 8], "data_offsets": [0, 1600]},
//    "wte.bias":   {"dtype": "F32", "shape": [8],     "data_offsets": [1600, 1632]}}
//
// data_offsets are [begin, end) in bytes, counted from the first byte after the header. The
// tensors' bytes (row-major, little-endian) tile the data part exactly: no gaps, no overlaps,
// no trailing bytes. attograd reads and writes the dtypes F32, F64, I64 and BOOL.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ag {

// Writes `tensors` in the given order (names must be unique and non-empty; tensors on a device
// are copied to the host, non-contiguous ones laid out row-major) and `metadata` to `path`.
// The write is atomic: the bytes go to `path + ".tmp.<pid>"`, which is fsynced and then renamed
// over `path`, so a crash mid-save leaves the previous file intact. The temporary files that
// killed saves left next to `path` (their process gone) are removed by the next save.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of a safetensors file onto the CPU, in the order of their data in the file
// (the order save_safetensors was given). The whole header is validated before any data is read,
// and every problem (truncation, malformed JSON, unknown dtype, bad shape or offsets, trailing
// data) raises ag::Error naming the file and, where there is one, the tensor.
// When `metadata` is not null it receives the "__metadata__" entries (empty when there are none).
std::vector<std::pair<std::string, Tensor>> load_safetensors(const std::string& path,
                                                             std::map<std::string, std::string>* metadata = nullptr);

// The same, keyed by name.
std::map<std::string, Tensor> load_safetensors_map(const std::string& path,
                                                   std::map<std::string, std::string>* metadata = nullptr);

}  // namespace ag
