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
// no trailing bytes. attograd reads and writes the dtypes F32, F64, I64, BOOL, BF16 and F16 (the
// 16-bit formats models are shared in for inference) as the tensors of that dtype (DType::bf16,
// DType::f16: core/half.h); nn::Module::load_state_dict widens 16-bit ones into f32 parameters
// exactly. It also writes f32 tensors as BF16 or F16 when asked (FloatStorage): half the bytes,
// rounded to nearest even (pw::round_bf16, pw::round_fp16).
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ag {

// How save_safetensors stores the f32 tensors: as they are, or rounded to bfloat16 ("BF16") or
// IEEE half ("F16"). The 16-bit forms are for inference (evaluation, generation, sharing a model):
// a checkpoint to resume training from keeps its f32 weights and optimizer state.
enum class FloatStorage : uint8_t { f32, bf16, f16 };

// Writes `tensors` in the given order (names must be unique and non-empty; tensors on a device
// are copied to the host, non-contiguous ones laid out row-major) and `metadata` to `path`.
// The write is atomic: the bytes go to `path + ".tmp.<pid>"`, which is fsynced and then renamed
// over `path`, so a crash mid-save leaves the previous file intact. The temporary files that
// killed saves left next to `path` (their process gone) are removed by the next save.
// With `f32_as` bf16 or f16, f32 tensors are written rounded (other dtypes, 16-bit ones included,
// as they are); a finite value beyond half's range (|x| > 65504 rounds to inf) is refused for
// F16, naming the tensor.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      FloatStorage f32_as = FloatStorage::f32);

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
