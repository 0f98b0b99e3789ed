// libFuzzer target: a training checkpoint as the apps read it. First the metadata alone
// (apps/common/run.h read_checkpoint_info) and what the apps rebuild from it: each app's config
// (vit, gpt, textclf model + data) and the tokenizer stored with it; then the whole checkpoint
// into a model (training/checkpoint.h load_checkpoint: weights, AdamW state, RNG). The seeds are
// checkpoints of the model below, so mutations reach past the name and shape checks.
#include "apps/common/run.h"
#include "apps/gpt/lib.h"
#include "apps/textclf/lib.h"
#include "apps/vit/lib.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "tests/fuzz/fuzz_common.h"
#include "training/checkpoint.h"

using namespace ag;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* kTarget = "checkpoint";
  const std::string path = fuzz::write_file("checkpoint.safetensors", fuzz::as_view(data, size));

  apps::CheckpointInfo info;
  if (fuzz::ok_or_error(kTarget, [&] { info = apps::read_checkpoint_info(path); })) {
    const nlohmann::json& c = info.config;
    fuzz::ok_or_error(kTarget, [&] { apps::vit_config_from_json(c); });
    if (c.is_object() && c.contains("model")) {
      fuzz::ok_or_error(kTarget, [&] { apps::gpt_config_from_json(c.at("model")); });
      fuzz::ok_or_error(kTarget, [&] { apps::textclf::config_from_json(c.at("model")); });
    }
    if (c.is_object() && c.contains("data")) fuzz::ok_or_error(kTarget, [&] { apps::textclf::data_from_json(c.at("data")); });
    if (info.extra.count("tokenizer")) {
      const std::string& t = info.extra.at("tokenizer");
      fuzz::ok_or_error(kTarget, [&] { apps::textclf::TextTokenizer::from_json(t, "fuzz: tokenizer"); });
      fuzz::ok_or_error(kTarget, [&] { data::CharTokenizer::from_json(t, "fuzz: tokenizer"); });
    }
  }

  nn::Linear model(2, 3);
  optim::AdamW opt(model.parameters(), {});
  Generator gen;
  fuzz::ok_or_error(kTarget, [&] { training::load_checkpoint(path, model, &opt, &gen); });
  return 0;
}
