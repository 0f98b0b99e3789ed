#pragma once
// Training checkpoints: everything a run needs to continue exactly where it stopped, in ONE
// safetensors file (core/serialize.h), written atomically (a crash mid-save leaves the previous
// checkpoint intact).
//
//   tensors    "model.<name>"   the model's state_dict()       e.g. "model.0.weight"
//              "optim.<name>"   the optimizer's state_dict()   e.g. "optim.state.0.exp_avg",
//                                                                    "optim.param_groups.0.lr"
//   metadata   "format"         "attograd-checkpoint-1"
//              "step"           the number of updates done so far, decimal
//              "rng.seed"       the Generator's seed, decimal
//              "rng.offset"     the Generator's offset (Philox blocks used so far), decimal
//              "extra.<key>"    the caller's own entries (data position, config, ...)
//              "contents"       "model" in save_model's files (no "optim." tensors), else absent
//
// There is no schedule state to save: a schedule (optim/schedule.h) is a pure function of the
// step, so the saved step IS the schedule's position. A resumed loop runs
//
//   Checkpoint c = load_checkpoint(path, model, &opt, &gen);
//   for (int64_t step = c.step; step < total; ++step) { sched.set_lr(opt, step); ... opt.step(); }
//
// and produces bit for bit the parameters and losses of a run that never stopped, provided the
// dropout masks draw from `gen` (a Generator is just (seed, offset), core/random.h).
#include <cstdint>
#include <map>
#include <string>

#include "core/random.h"
#include "core/serialize.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace ag::training {

// Saves `model`, `opt`, `step` and `rng` to `path` (see the layout above); `extra` goes to the
// metadata under "extra.<key>". Errors are those of save_safetensors (ag::Error naming the file).
void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& opt, int64_t step,
                     const Generator& rng, const std::map<std::string, std::string>& extra = {});

// The model alone, without optimizer state, for evaluation and generation: the same layout and
// metadata (plus "contents": "model"), its f32 tensors stored as `weights` (FloatStorage::bf16 or
// f16: half the file, rounded to nearest even). load_checkpoint reads it with opt == nullptr (the
// 16-bit tensors come back as f32), and refuses it with an optimizer: it cannot resume training.
void save_model(const std::string& path, const nn::Module& model, int64_t step, const Generator& rng,
                const std::map<std::string, std::string>& extra = {}, FloatStorage weights = FloatStorage::f32);

// What load_checkpoint returns besides what it writes into the model, optimizer and generator.
struct Checkpoint {
  int64_t step = 0;                          // the step to continue from
  std::map<std::string, std::string> extra;  // the caller's entries, "extra." removed
};

// Loads a checkpoint written by save_checkpoint into `model` (strictly: every name, shape and
// dtype must match), into `opt` when not null (its state and hyper-parameters) and into `rng`
// when not null (manual_seed(seed), then set_offset(offset)). Everything is validated before
// anything is changed. Every problem is an ag::Error starting "load_checkpoint: '<path>'": an
// unreadable or corrupt file, a file that is not an attograd checkpoint (no or another "format"),
// a missing or non-numeric step / rng entry, a tensor outside "model." and "optim.", a model
// mismatch (load_state_dict's list of missing, unexpected and mis-shaped names) or an optimizer
// mismatch (its load_state_dict's message).
Checkpoint load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* opt, Generator* rng);

}  // namespace ag::training
