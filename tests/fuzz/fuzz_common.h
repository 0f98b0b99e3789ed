#pragma once
// What every libFuzzer target in tests/fuzz/ shares.
//
// A target gets bytes, turns them into the file (or folder of files) its parser reads, and calls
// the parser the way the library or an app does. The contract under test, for every input:
//   - the parser returns, or raises ag::Error (a message naming the file: the expected outcome
//     for bad input);
//   - nothing else happens: no other exception (abort, so libFuzzer keeps the input), no crash,
//     no sanitizer report, no leak, no hang, no allocation beyond -rss_limit_mb.
// Whatever parses must also survive the writer: saved again and read back, it gives the same
// values (a target checks this where the library has a writer).
//
// Files go to a private folder of this process (under /dev/shm when it exists, so that millions of
// executions do not write to disk), removed when the process exits normally.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "core/error.h"

namespace ag::fuzz {

namespace fs = std::filesystem;

// The scratch folder of this process: <tmp>/attograd-fuzz-<pid>.
class Scratch {
 public:
  Scratch() {
    std::error_code ec;
    fs::path base = fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
    dir_ = base / ("attograd-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
};

inline const fs::path& scratch_dir() {
  static Scratch s;
  return s.dir();
}

// `rel` under the scratch folder (its parent folders created).
inline std::string scratch_path(const std::string& rel) {
  fs::path p = scratch_dir() / rel;
  fs::create_directories(p.parent_path());
  return p.string();
}

// Writes `bytes` to scratch_path(rel) and returns that path.
inline std::string write_file(const std::string& rel, std::string_view bytes) {
  const std::string path = scratch_path(rel);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  f.close();
  if (f.fail()) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

// Empties scratch folder `rel` (for targets that lay out a folder tree per input).
inline std::string fresh_dir(const std::string& rel) {
  const fs::path p = scratch_dir() / rel;
  std::error_code ec;
  fs::remove_all(p, ec);
  fs::create_directories(p);
  return p.string();
}

// The separator of the multi-file targets: the input is the files' contents joined by it. The
// targets' dictionaries hold it, so libFuzzer splits and joins files easily.
inline constexpr std::string_view kSplit = "\n=====\n";

// `data` cut at every kSplit, at most `max_parts` parts (the last one keeps any further separators).
inline std::vector<std::string_view> split_parts(std::string_view data, size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    size_t at = data.find(kSplit);
    if (at == std::string_view::npos) break;
    parts.push_back(data.substr(0, at));
    data.remove_prefix(at + kSplit.size());
  }
  parts.push_back(data);
  return parts;
}

[[noreturn]] inline void finding(const char* target, const std::string& what) {
  std::fprintf(stderr, "\nfuzz_%s: FINDING: %s\n", target, what.c_str());
  std::fflush(stderr);
  std::abort();  // libFuzzer saves the input as crash-<sha1>
}

// Runs `fn`: returning or raising ag::Error is fine (true when it returned); any other exception
// is a finding.
template <class F>
bool ok_or_error(const char* target, F&& fn) {
  try {
    fn();
    return true;
  } catch (const Error&) {
    return false;
  } catch (const std::exception& e) {
    finding(target, std::string("an exception that is not ag::Error (") + typeid(e).name() + "): " + e.what());
  } catch (...) {
    finding(target, "an exception that is not a std::exception");
  }
}

// Runs `fn`, which must not raise at all (e.g. saving again what was just loaded).
template <class F>
void must(const char* target, const char* step, F&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    finding(target, std::string(step) + " raised (" + typeid(e).name() + "): " + e.what());
  }
}

// `cond` must hold (a round trip gave other values, ...).
inline void expect(const char* target, bool cond, const std::string& what) {
  if (!cond) finding(target, what);
}

inline std::string_view as_view(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace ag::fuzz
