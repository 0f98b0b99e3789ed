#include "apps/common/app.h"

#include <algorithm>
#include <exception>
#include <limits>

#include "data/images.h"

namespace ag::apps {

App::App(std::string name, const std::string& description) : cli(name + ": " + description), name_(std::move(name)) {
  cli.option_defaults()->always_capture_default();
}

void App::add_run_options() { apps::add_run_options(cli, o); }

void App::add_val_size_option(int64_t& val_size, const std::string& what) {
  cli.add_option("--val-size", val_size,
                 fmt::format("training {} held out for validation, which picks the best model (best.safetensors) and "
                             "stops early (--patience); the test set is evaluated once, at the end, on that model "
                             "(-1: {}% of the training set, at most {}; 0: none, the last model is tested)",
                             what, kValPercent, kValCap))
      ->check(CLI::Range(int64_t(-1), std::numeric_limits<int64_t>::max()));
}

int App::main(int argc, const char* const* argv, const std::function<void()>& check,
              const std::function<int()>& body) {
  if (const int rc = parse_command_line(cli, argc, argv, name_); rc >= 0) return rc;
  o.command_line.assign(argv, argv + argc);
  o.given = given_options(cli);
  try {  // every option is checked before any data is read
    apply_run_options(o, name_);
    if (check) check();
    return body();
  } catch (const UsageError& e) {
    // every rank finds the same usage error and exits alike: nothing waits in a collective
    print_usage_error(name_, e.what());
    return kExitUsage;
  } catch (const data::DatasetNotFound& e) {
    print_error(name_, e.what());
    return error_exit(kExitNoData);
  } catch (const std::exception& e) {  // ag::Error, and a malformed file's JSON
    print_error(name_, e.what());
    return error_exit(kExitError);
  }
}

}  // namespace ag::apps
