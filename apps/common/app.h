#pragma once
// The frame of every training app's main(): a command line whose --help shows each default, the
// checks before any work starts, and one line and one exit code for each way a run can fail. An
// app's main.cpp then holds its recipe alone (apps/vit/main.cpp):
//
//   int main(int argc, char** argv) {
//     apps::App app("vit", "a vision transformer on Fashion-MNIST");
//     app.o = {.steps = 6000, .batch = 128, .lr = 2e-3};   // the app's defaults, shown in --help
//     app.add_run_options();                              // --steps, --lr, --resume, ... (options.h)
//     app.cli.add_option("--patch", cfg.patch, "patch size in pixels")->check(positive());
//     return app.main(argc, argv, [&] { validate(cfg); }, [&] { return train(app.o, cfg); });
//   }
//
// Exit codes (options.h): 0 done, or stopped by Ctrl-C or --stop-at after saving; 2 a usage
// error (a bad flag or value, an option --eval-only or --resume would ignore, another app's
// checkpoint) or missing data; 1 any other error.
#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "apps/common/options.h"

namespace ag::apps {

class App {
 public:
  App(std::string name, const std::string& description);

  const std::string& name() const { return name_; }
  CLI::App cli;  // every option added to it shows its default in --help
  RunOptions o;  // set the app's defaults here before add_run_options

  // Registers the options every app has (add_run_options) with the defaults now in `o`.
  void add_run_options();
  // Adds --val-size, held out of the training set for validation (validation_size).
  void add_val_size_option(int64_t& val_size, const std::string& what);

  // Parses the command line, then, with every failure turned into one line on stderr and its exit
  // code: apply_run_options, `check` (the app's own options; it throws UsageError) and `body`,
  // whose return value is the exit code. --help prints the options and returns 0.
  int main(int argc, const char* const* argv, const std::function<void()>& check, const std::function<int()>& body);

 private:
  std::string name_;
};

}  // namespace ag::apps
