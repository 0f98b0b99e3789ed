#pragma once
// The pictures a docs generator draws into docs/img/ (build/docpics, build/recipefigs), written
// there, or, with `check_only`, compared with the committed files: the CTests of both tools fail
// when a picture is stale, and `make docs` redraws it.
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "apps/common/plot.h"
#include "data/text.h"

namespace ag::docs {

struct Picture {
  std::string file, text;  // "masks.svg", its SVG
};

// Writes each picture to ROOT/docs/img/ (atomically), or checks that the file there holds exactly
// its text, naming each one that differs or is missing. Returns 0, or 1 when a picture is stale.
inline int write_or_check(const char* tool, const std::filesystem::path& root, const std::vector<Picture>& pictures,
                          bool check_only) {
  const std::filesystem::path dir = root / "docs" / "img";
  int stale = 0;
  for (const Picture& p : pictures) {
    const std::filesystem::path path = dir / p.file;
    if (check_only) {
      if (!std::filesystem::exists(path) || data::read_file_bytes(path.string()) != p.text)
        ++stale, fmt::print(stderr, "{}: docs/img/{} is out of date or missing; run `make docs`\n", tool, p.file);
      continue;
    }
    std::filesystem::create_directories(dir);
    apps::write_file_atomic(path.string(), p.text);
    fmt::print("wrote docs/img/{}\n", p.file);
  }
  return stale ? 1 : 0;
}

}  // namespace ag::docs
