#include "training/checkpoint.h"

#include <charconv>
#include <limits>
#include <utility>
#include <vector>

#include "core/serialize.h"

namespace ag::training {

namespace {

constexpr const char* kFormat = "attograd-checkpoint-1";
constexpr const char* kModel = "model.";
constexpr const char* kOptim = "optim.";
constexpr const char* kExtra = "extra.";
// save_model's files say so: they hold no optimizer state and cannot resume training
constexpr const char* kContents = "contents";
constexpr const char* kModelOnly = "model";

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

template <class... Args>
[[noreturn]] void load_error(const std::string& path, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format("load_checkpoint: '{}': {}", path, fmt::format(f, std::forward<Args>(args)...)));
}

// The metadata entry `key` as an unsigned decimal no larger than `max`: digits only, no sign,
// no spaces, no overflow.
uint64_t parse_decimal(const std::string& path, const std::map<std::string, std::string>& meta, const std::string& key,
                       uint64_t max) {
  auto it = meta.find(key);
  if (it == meta.end()) load_error(path, "metadata entry '{}' is missing", key);
  const std::string& s = it->second;
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v > max)
    load_error(path, "metadata entry '{}' must be a whole number in [0, {}], got '{}'", key, max, s);
  return v;
}

}  // namespace

namespace {

// save_checkpoint and save_model: the model's tensors, the optimizer's when given, the metadata.
void save(const std::string& path, const char* op, const nn::Module& model, const optim::Optimizer* opt, int64_t step,
          const Generator& rng, const std::map<std::string, std::string>& extra, FloatStorage weights) {
  check(step >= 0, "{}: '{}': step must be >= 0, got {}", op, path, step);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, t] : model.state_dict()) tensors.emplace_back(kModel + name, t);
  if (opt)
    for (auto& [name, t] : opt->state_dict()) tensors.emplace_back(kOptim + name, t);

  std::map<std::string, std::string> meta{{"format", kFormat},
                                          {"step", std::to_string(step)},
                                          {"rng.seed", std::to_string(rng.seed())},
                                          {"rng.offset", std::to_string(rng.offset())}};
  if (!opt) meta[kContents] = kModelOnly;
  for (const auto& [key, value] : extra) meta[kExtra + key] = value;
  save_safetensors(path, tensors, meta, weights);
}

}  // namespace

void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& opt, int64_t step,
                     const Generator& rng, const std::map<std::string, std::string>& extra) {
  save(path, "save_checkpoint", model, &opt, step, rng, extra, FloatStorage::f32);
}

void save_model(const std::string& path, const nn::Module& model, int64_t step, const Generator& rng,
                const std::map<std::string, std::string>& extra, FloatStorage weights) {
  save(path, "save_model", model, nullptr, step, rng, extra, weights);
}

Checkpoint load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* opt, Generator* rng) {
  // 1. The file: load_safetensors validates it entirely and names the file in its errors.
  std::map<std::string, std::string> meta;
  std::vector<std::pair<std::string, Tensor>> tensors;
  try {
    tensors = load_safetensors(path, &meta);
  } catch (const Error& e) {
    load_error(path, "{}", e.what());
  }

  // 2. The metadata, before any tensor: is this a checkpoint at all?
  auto format = meta.find("format");
  if (format == meta.end()) load_error(path, "not an attograd checkpoint (no 'format' in its metadata)");
  if (format->second != kFormat)
    load_error(path, "not an attograd checkpoint: format '{}', expected '{}'", format->second, kFormat);
  if (opt && meta.count(kContents) && meta.at(kContents) == kModelOnly)
    load_error(path, "holds a model without optimizer state (written by save_model, for evaluation and generation): "
                     "it cannot resume training");
  Checkpoint out;
  out.step = int64_t(parse_decimal(path, meta, "step", uint64_t(std::numeric_limits<int64_t>::max())));
  const uint64_t seed = parse_decimal(path, meta, "rng.seed", std::numeric_limits<uint64_t>::max());
  const uint64_t offset = parse_decimal(path, meta, "rng.offset", std::numeric_limits<uint64_t>::max());
  for (const auto& [key, value] : meta)
    if (starts_with(key, kExtra)) out.extra[key.substr(std::string(kExtra).size())] = value;

  // 3. The tensors, split by prefix.
  nn::NamedTensors model_dict;
  optim::StateDict optim_dict;
  for (auto& [name, t] : tensors) {
    if (starts_with(name, kModel))
      model_dict.emplace_back(name.substr(std::string(kModel).size()), std::move(t));
    else if (starts_with(name, kOptim))
      optim_dict.emplace_back(name.substr(std::string(kOptim).size()), std::move(t));
    else
      load_error(path, "tensor '{}' is neither 'model.*' nor 'optim.*'", name);
  }

  // 4. Validate everything before changing anything. A strict load_state_dict checks every name
  // before it copies, but loading the model and then failing on the optimizer would leave the
  // model half-restored; so the model is compared first, the optimizer loaded (it validates, then
  // replaces), and the model loaded last, when it can no longer fail.
  bool model_matches = true;
  {
    nn::NamedTensors own = model.state_dict();
    std::map<std::string, const Tensor*> given;
    for (const auto& [n, t] : model_dict) given[n] = &t;
    model_matches = own.size() == model_dict.size() && given.size() == model_dict.size();
    for (const auto& [n, dst] : own) {
      auto it = given.find(n);
      if (it == given.end() || it->second->shape() != dst.shape() || !nn::loads_into(it->second->dtype(), dst.dtype()))
        model_matches = false;
    }
  }
  try {
    if (!model_matches) model.load_state_dict(model_dict, /*strict=*/true);  // throws, copies nothing
    if (opt) opt->load_state_dict(optim_dict);
    model.load_state_dict(model_dict, /*strict=*/true);
  } catch (const Error& e) {
    load_error(path, "{}", e.what());
  }
  if (rng) {
    rng->manual_seed(seed);
    rng->set_offset(offset);
  }
  return out;
}

}  // namespace ag::training
