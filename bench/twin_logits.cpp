// The attograd side of the twin check (scripts/check-twins.sh, bench/check_twins.py): builds one of
// the sample models (apps/<app>/model.h) from a JSON config, loads its weights from a
// safetensors file (a PyTorch twin's state_dict, or an app checkpoint's "model." tensors), runs
// it on the inputs of another safetensors file in eval mode and writes the logits.
//
//   twin_logits --model gpt --config '{"vocab": 96, ...}' --weights w.safetensors [--prefix model.]
//               --inputs in.safetensors --out logits.safetensors
//   inputs: gpt "idx" i64 (B, T);  vit "images" f32 (B, C, H, W);  textclf "tokens" i64 (B, T), "lengths" i64 (B)
//           and, for a config with ngram_buckets > 0, "ngrams" i64 (B, T, G);  longseq "tokens" i64 (B, T),
//           "lengths" i64 (B);  imagetext "images" f32 (B, C, H, W), "idx" i64 (B, T)
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "apps/common/run.h"
#include "apps/gpt/model.h"
#include "apps/imagetext/model.h"
#include "apps/longseq/model.h"
#include "apps/textclf/model.h"
#include "apps/vit/model.h"
#include "attograd.h"
#include "core/serialize.h"

using namespace ag;

namespace {

nn::NamedTensors weights_under(const std::string& path, const std::string& prefix) {
  nn::NamedTensors out;
  for (auto& [name, t] : load_safetensors(path))
    if (name.rfind(prefix, 0) == 0) out.emplace_back(name.substr(prefix.size()), t);
  check(!out.empty(), "twin_logits: no tensor named '{}...' in {}", prefix, path);
  return out;
}

Tensor input(const std::map<std::string, Tensor>& in, const std::string& name, const std::string& path) {
  auto it = in.find(name);
  check(it != in.end(), "twin_logits: {} has no tensor '{}'", path, name);
  return it->second;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"Logits of a sample model with given weights and inputs (the C++ side of the twin check)"};
  std::string model_name, config_text, weights, prefix, inputs, out;
  cli.add_option("--model", model_name, "gpt, vit, textclf, longseq or imagetext")
      ->required()
      ->check(CLI::IsMember({"gpt", "vit", "textclf", "longseq", "imagetext"}));
  cli.add_option("--config", config_text, "the model config as JSON (the keys of apps/<app>/model.h)")->required();
  cli.add_option("--weights", weights, "safetensors file with the model's tensors")->required();
  cli.add_option("--prefix", prefix, "only tensors whose name starts with this, prefix removed (\"model.\" for checkpoints)");
  cli.add_option("--inputs", inputs, "safetensors file with the inputs")->required();
  cli.add_option("--out", out, "where to write \"logits\"")->required();
  if (const int rc = ag::apps::parse_command_line(cli, argc, argv, "twin_logits"); rc >= 0) return rc;
  try {
    const auto config = nlohmann::json::parse(config_text);
    const auto in = load_safetensors_map(inputs);
    Tensor logits;
    NoGradGuard no_grad;
    if (model_name == "gpt") {
      apps::GPT m(config.get<apps::GPTConfig>());
      m.load_state_dict(weights_under(weights, prefix));
      m.eval();
      logits = m.forward(input(in, "idx", inputs));
    } else if (model_name == "vit") {
      apps::ViT m(config.get<apps::ViTConfig>());
      m.load_state_dict(weights_under(weights, prefix));
      m.eval();
      logits = m.forward(input(in, "images", inputs));
    } else if (model_name == "imagetext") {
      apps::ImageText m(config.get<apps::ImageTextConfig>());
      m.load_state_dict(weights_under(weights, prefix));
      m.eval();
      logits = m.forward(input(in, "images", inputs), input(in, "idx", inputs));
    } else if (model_name == "longseq") {
      apps::longseq::LongSeqClassifier m(config.get<apps::longseq::LongSeqConfig>());
      m.load_state_dict(weights_under(weights, prefix));
      m.eval();
      logits = m.forward(input(in, "tokens", inputs), input(in, "lengths", inputs));
    } else {
      apps::TextClassifier m(config.get<apps::TextClassifierConfig>());
      m.load_state_dict(weights_under(weights, prefix));
      m.eval();
      const Tensor ngrams = m.cfg.ngram_buckets > 0 ? input(in, "ngrams", inputs) : Tensor();
      logits = m.forward(input(in, "tokens", inputs), input(in, "lengths", inputs), ngrams);
    }
    save_safetensors(out, {{"logits", logits}});
  } catch (const std::exception& e) {
    fmt::print(stderr, "twin_logits: {}\n", e.what());
    return 1;
  }
  return 0;
}
