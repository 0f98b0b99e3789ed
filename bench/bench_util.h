#pragma once
// Helpers shared by the benchmarks: the median of repeated runs after warm-up, and the PyTorch
// column: finding a Python that has torch, running bench/torch_reference.py with the same shapes
// and thread count, and reading back its one line of JSON; redrawing a figure from the result lines
// a bench wrote (--plot-only).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "apps/common/plot.h"
#include "core/error.h"
#include "core/tensor.h"
#include "cuda/memory.h"

namespace bench {

// A benchmark's --device: the device it names, or nullopt after printing "tool: --device: why" on
// stderr (a name that does not parse, or a GPU this machine does not have).
inline std::optional<ag::Device> parse_device(const char* tool, const std::string& name) {
  try {
    const ag::Device dev = ag::Device::parse(name);
    ag::check(dev.is_cpu() || ag::cuda::device_count() > dev.index, "{}: {} CUDA GPU(s) visible", name,
              ag::cuda::device_count());
    return dev;
  } catch (const ag::Error& e) {
    fmt::print(stderr, "{}: --device: {}\n", tool, e.what());
    return std::nullopt;
  }
}

// The median of v (the upper one of an even count); v is not empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Wall time in seconds of one call of fn().
template <class F>
double seconds_of(F&& fn) {
  const auto a = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

// Median wall time in seconds of fn() over `reps` runs after `warmup` runs.
template <class F>
double median_seconds(F&& fn, int reps = 20, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(seconds_of(fn));
  return median(std::move(t));
}

// ---- the PyTorch column ------------------------------------------------------------------------

// s quoted for /bin/sh: inside single quotes every character is literal except ' itself.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `command` through the shell and returns its stdout, or nullopt if it could not start or
// exited non-zero. Its stderr goes to ours, so a failing script shows its traceback.
inline std::optional<std::string> shell_output(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return std::nullopt;
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = pclose(pipe);
  if (status != 0) return std::nullopt;
  return out;
}

// OMP_WAIT_POLICY as this process (and the PyTorch child, which inherits it) sees it. On a shared
// machine the default (spin for a while) can stall both sides; see bench/torch_reference.py.
inline std::string omp_wait_policy() {
  const char* p = std::getenv("OMP_WAIT_POLICY");
  return p && *p ? p : "unset";
}

// The first of $ATTOGRAD_PYTHON, python3, /usr/bin/python3 for which `import torch` works;
// empty when none does.
inline std::string find_torch_python() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("ATTOGRAD_PYTHON"); env && *env) candidates.push_back(env);
  candidates.push_back("python3");
  candidates.push_back("/usr/bin/python3");
  for (const auto& py : candidates)
    if (std::system((shell_quote(py) + " -c 'import torch' > /dev/null 2>&1").c_str()) == 0) return py;
  return {};
}

// bench/torch_reference.py, found next to the benchmark's source file (pass __FILE__, which CMake
// makes absolute), else relative to the binary (build-*/bench_x -> ../bench/), else the working
// directory. `override_path` (a --script option) wins when set. Empty when not found.
inline std::string torch_script_path(const char* source_file, const char* argv0, const std::string& override_path) {
  namespace fs = std::filesystem;
  if (!override_path.empty()) return fs::exists(override_path) ? override_path : std::string();
  const std::string name = "torch_reference.py";
  std::error_code ec;
  for (const fs::path& p : {fs::path(source_file).parent_path() / name,
                            fs::absolute(argv0, ec).parent_path().parent_path() / "bench" / name,
                            fs::path("bench") / name})
    if (fs::exists(p, ec)) return p.string();
  return {};
}

// PyTorch's fastest set-up (docs/benchmarks.md, "Training step beside PyTorch"):
// OMP_WAIT_POLICY=PASSIVE and Debian's tcmalloc preloaded when installed; as a prefix of the
// command torch_reference runs, so only the PyTorch process gets it. The describing half goes
// into the benchmark's printout.
struct TorchEnv {
  std::string prefix;    // "env OMP_WAIT_POLICY=PASSIVE [LD_PRELOAD=...] "
  std::string describe;  // "OMP_WAIT_POLICY=PASSIVE, tcmalloc" (or "..., glibc malloc")
};
inline TorchEnv torch_fastest_env() {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const char* dir : {"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib"}) {
    const fs::path lib = fs::path(dir) / "libtcmalloc_minimal.so.4";
    if (fs::exists(lib, ec))
      return {"env OMP_WAIT_POLICY=PASSIVE LD_PRELOAD=" + shell_quote(lib.string()) + " ",
              "OMP_WAIT_POLICY=PASSIVE, tcmalloc"};
  }
  return {"env OMP_WAIT_POLICY=PASSIVE ", "OMP_WAIT_POLICY=PASSIVE, glibc malloc (no libtcmalloc-minimal4)"};
}

// The PyTorch side of one benchmark: `python script <subcommand> --json <args>`, parsed from the
// last line of its output, which must hold results[v].ms and results[v].peak_rss_mb for every
// variant v; env_prefix (e.g. torch_fastest_env().prefix) goes before the command. python: the
// interpreter, when the caller found it already (empty: find_torch_python, which imports torch once). nullopt (after printing why, visibly) when torch or the script is missing or the run
// failed; the benchmark then prints its own numbers alone and still exits 0.
inline std::optional<nlohmann::json> torch_reference(const std::string& script, const std::string& subcommand,
                                                     const std::vector<std::string>& args,
                                                     const std::vector<std::string>& variants,
                                                     const std::string& env_prefix = "",
                                                     std::string python = "") {
  if (python.empty()) python = find_torch_python();
  if (python.empty()) {
    fmt::print("PyTorch: not found (set ATTOGRAD_PYTHON to a Python that has torch)\n");
    return std::nullopt;
  }
  if (script.empty()) {
    fmt::print("PyTorch: bench/torch_reference.py not found (pass --script PATH)\n");
    return std::nullopt;
  }
  std::string cmd = env_prefix + shell_quote(python) + " " + shell_quote(script) + " " + shell_quote(subcommand) + " --json";
  for (const auto& a : args) cmd += " " + shell_quote(a);
  std::fflush(stdout);  // our lines first, then whatever the child prints to stderr
  const auto out = shell_output(cmd);
  if (!out) {
    fmt::print("PyTorch: `{}` failed (see its error above)\n", cmd);
    return std::nullopt;
  }
  std::string line;  // the last non-empty line
  for (size_t a = 0, b; a < out->size(); a = b + 1) {
    b = out->find('\n', a);
    if (b == std::string::npos) b = out->size();
    if (b > a) line = out->substr(a, b - a);
  }
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  auto complete = [&] {
    if (!j.is_object() || !j.contains("results") || !j["results"].is_object()) return false;
    for (const auto& v : variants) {
      if (!j["results"].contains(v)) return false;
      const auto& r = j["results"][v];
      if (!r.is_object() || !r.contains("ms") || !r["ms"].is_number() || !r.contains("peak_rss_mb") ||
          !r["peak_rss_mb"].is_number())
        return false;
    }
    return j.contains("torch") && j["torch"].is_string() && j.contains("threads") && j["threads"].is_number() &&
           j.contains("impl") && j["impl"].is_string();
  };
  if (j.is_discarded() || !complete()) {
    fmt::print("PyTorch: could not read the JSON line of `{}`: '{}'\n", cmd, line);
    return std::nullopt;
  }
  return j;
}

// The result lines a bench wrote to a JSONL file (--out), read back to redraw its figure: every
// non-empty line must be a JSON object holding each of `keys`, else ag::Error names the file and line.
inline std::vector<nlohmann::json> read_result_lines(const char* tool, const std::string& path,
                                                     std::initializer_list<const char*> keys) {
  std::ifstream in(path);
  ag::check(bool(in), "{}: --plot-only: cannot read {}", tool, path);
  std::vector<nlohmann::json> rows;
  std::string line;
  for (int i = 1; std::getline(in, line); ++i) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    const bool ok = j.is_object() && std::all_of(keys.begin(), keys.end(), [&](const char* k) { return j.contains(k); });
    ag::check(ok, "{}: {} line {}: not a result line", tool, path, i);
    rows.push_back(std::move(j));
  }
  return rows;
}

// --plot-only FILE --svg FILE: draw(the result lines of FILE, read_result_lines with `keys`) written
// to the SVG file, measuring nothing. Returns the exit code: 0, 1 when FILE does not read, 2 when
// only one of the two is given; -1 when neither is given and the bench measures.
template <class Draw>
int plot_only(const char* tool, const std::string& jsonl, const std::string& svg,
              std::initializer_list<const char*> keys, Draw&& draw) {
  if (jsonl.empty() && svg.empty()) return -1;
  if (jsonl.empty() || svg.empty()) {
    fmt::print(stderr, "{}: --plot-only FILE and --svg FILE go together\n", tool);
    return 2;
  }
  try {
    ag::apps::write_file_atomic(svg, draw(read_result_lines(tool, jsonl, keys)));
  } catch (const ag::Error& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
  fmt::print("wrote {}\n", svg);
  return 0;
}

}  // namespace bench
