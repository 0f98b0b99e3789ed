// snippets: keeps the code a Markdown page quotes equal to the source files it quotes.
//
//   snippets [--root DIR] [--check] PAGE.md|FOLDER...
//
// A FOLDER stands for every *.md page directly inside it, in name order, so a test over
// docs/math/ covers a page added there without a change to the test.
//
// In the page, a quoted block is an HTML comment naming the file (and a region of it) on the line
// right above a fenced code block:
//
//   <!-- snippet: examples/extending/softplus.cpp#front -->
//   ```cpp
//   ...the lines of the region...
//   ```
//
// In the source, a region is the lines strictly between two marker lines, whatever the comment
// leader of the language (//, #, <!-- -->):
//
//   // snippet-begin: front
//   ...
//   // snippet-end: front
//
// Without "#region" the whole file is quoted, with its marker lines left out.
//
// By default the blocks of each page are rewritten from their sources (the text around them is
// kept as it is). --check writes nothing: it exits 1 when a block differs from its source, naming
// the page's line and the first line that differs (the CTests "docs: extending.md quotes
// examples/extending as it is" and "docs: the math pages quote the kernels as they are"). A quoted file or region that does not exist, a region opened and
// not closed (or opened twice), or a snippet comment without a fence right below exits 2, in both
// modes. Paths are relative to DIR, which defaults to the source tree this binary was configured
// from. Standard library only.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#ifndef ATTOGRAD_SOURCE_DIR
#define ATTOGRAD_SOURCE_DIR "."
#endif

namespace fs = std::filesystem;

namespace {

struct SnippetError {
  std::string where, what;  // "docs/extending.md:12", "the region 'front' ..."
};

using Lines = std::vector<std::string>;

bool read_lines(const fs::path& path, Lines& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.clear();
  for (std::string s; std::getline(in, s);) out.push_back(s);
  return true;
}

// The name after `key` when the line, trimmed, ends with "key NAME" (and an optional "-->").
bool marker(const std::string& line, const std::string& key, std::string& name) {
  const size_t at = line.find(key);
  if (at == std::string::npos) return false;
  std::string rest = line.substr(at + key.size());
  if (const size_t close = rest.find("-->"); close != std::string::npos) rest.resize(close);
  const size_t b = rest.find_first_not_of(" \t"), e = rest.find_last_not_of(" \t\r");
  if (b == std::string::npos) return false;
  name = rest.substr(b, e - b + 1);
  return name.find_first_of(" \t") == std::string::npos;
}

// The regions of a source file, and the file without its marker lines ("" = the whole file).
std::map<std::string, Lines> regions_of(const std::string& rel, const Lines& lines) {
  std::map<std::string, Lines> out;
  Lines& whole = out[""];
  std::vector<std::string> open;  // regions may nest; each collects the lines inside it
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string where = rel + ":" + std::to_string(i + 1);
    std::string name;
    if (marker(lines[i], "snippet-begin:", name)) {
      if (name.empty() || out.count(name)) throw SnippetError{where, "the region '" + name + "' is opened twice"};
      out[name];
      open.push_back(name);
      continue;
    }
    if (marker(lines[i], "snippet-end:", name)) {
      if (open.empty() || open.back() != name)
        throw SnippetError{where, "'snippet-end: " + name + "' closes no open region of that name"};
      open.pop_back();
      continue;
    }
    whole.push_back(lines[i]);
    for (const std::string& r : open) out[r].push_back(lines[i]);
  }
  if (!open.empty()) throw SnippetError{rel, "the region '" + open.back() + "' is never closed (snippet-end)"};
  return out;
}

struct Block {
  size_t comment;       // index of the "<!-- snippet: ... -->" line
  size_t first, last;   // the code lines: [first, last), between the two fence lines
  std::string source;   // "examples/extending/softplus.cpp#front"
  Lines want;           // what the source says
};

// Every snippet block of a page, each with the lines its source gives.
std::vector<Block> blocks_of(const fs::path& root, const std::string& page_rel, const Lines& page) {
  std::vector<Block> out;
  std::map<std::string, std::map<std::string, Lines>> sources;  // file -> its regions
  for (size_t i = 0; i < page.size(); ++i) {
    std::string ref;
    if (page[i].rfind("<!-- snippet:", 0) != 0) continue;
    const std::string where = page_rel + ":" + std::to_string(i + 1);
    if (!marker(page[i], "<!-- snippet:", ref) || ref.empty())
      throw SnippetError{where, "expected <!-- snippet: path/to/file[#region] -->"};
    if (i + 1 >= page.size() || page[i + 1].rfind("```", 0) != 0)
      throw SnippetError{where, "the snippet comment must be right above a fenced block (```)"};
    size_t end = i + 2;
    while (end < page.size() && page[end].rfind("```", 0) != 0) ++end;
    if (end >= page.size()) throw SnippetError{where, "the fenced block below is never closed"};
    const size_t hash = ref.find('#');
    const std::string file = ref.substr(0, hash), region = hash == std::string::npos ? "" : ref.substr(hash + 1);
    if (!sources.count(file)) {
      Lines lines;
      if (!read_lines(root / file, lines)) throw SnippetError{where, "cannot read " + file};
      sources[file] = regions_of(file, lines);
    }
    const auto& regions = sources[file];
    auto it = regions.find(region);
    if (it == regions.end()) throw SnippetError{where, file + " has no region '" + region + "' (snippet-begin)"};
    out.push_back({i, i + 2, end, ref, it->second});
    i = end;
  }
  return out;
}

int run(const fs::path& root, const std::string& page_rel, bool check_only, const std::string& regenerate) {
  Lines page;
  if (!read_lines(root / page_rel, page)) throw SnippetError{page_rel, "cannot read this page"};
  const std::vector<Block> blocks = blocks_of(root, page_rel, page);
  if (check_only) {
    int stale = 0;
    for (const Block& b : blocks) {
      const Lines have(page.begin() + long(b.first), page.begin() + long(b.last));
      if (have == b.want) continue;
      ++stale;
      size_t j = 0;
      while (j < have.size() && j < b.want.size() && have[j] == b.want[j]) ++j;
      std::fprintf(stderr, "snippets: %s:%zu: the block quoting %s differs from its source\n", page_rel.c_str(),
                   b.comment + 1, b.source.c_str());
      std::fprintf(stderr, "  page line %zu:  %s\n  source gives:  %s\n", b.first + j + 1,
                   j < have.size() ? have[j].c_str() : "(end of the block)",
                   j < b.want.size() ? b.want[j].c_str() : "(end of the region)");
    }
    if (stale) {
      std::fprintf(stderr, "snippets: %s: %d of %zu blocks are stale. Rewrite them from the sources with: %s\n",
                   page_rel.c_str(), stale, blocks.size(), regenerate.c_str());
      return 1;
    }
    std::printf("snippets: %s: all %zu quoted blocks match their sources\n", page_rel.c_str(), blocks.size());
    return 0;
  }
  Lines out;
  size_t next = 0;
  for (const Block& b : blocks) {
    out.insert(out.end(), page.begin() + long(next), page.begin() + long(b.first));
    out.insert(out.end(), b.want.begin(), b.want.end());
    next = b.last;
  }
  out.insert(out.end(), page.begin() + long(next), page.end());
  std::ostringstream text;
  for (const std::string& s : out) text << s << '\n';
  std::ofstream file(root / page_rel, std::ios::binary);
  if (!(file << text.str()).flush()) throw SnippetError{page_rel, "cannot write this page"};
  std::printf("snippets: %s: %zu blocks written from their sources\n", page_rel.c_str(), blocks.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path root = ATTOGRAD_SOURCE_DIR;
  bool check_only = false;
  std::vector<std::string> pages;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--check") {
      check_only = true;
    } else if (a == "--root" && i + 1 < argc) {
      root = argv[++i];
    } else if (a.empty() || a[0] == '-') {
      std::fprintf(stderr,
                   "usage: snippets [--root DIR] [--check] PAGE.md|FOLDER...\n"
                   "  rewrites the <!-- snippet: file#region --> blocks of each page (a FOLDER: each *.md in it)\n"
                   "  from the files they quote (paths relative to DIR: %s); --check only compares, and exits 1\n"
                   "  when one differs\n",
                   ATTOGRAD_SOURCE_DIR);
      return a == "--help" || a == "-h" ? 0 : 2;
    } else {
      pages.push_back(a);
    }
  }
  if (pages.empty()) {
    std::fprintf(stderr, "snippets: no page given (usage: snippets [--root DIR] [--check] PAGE.md|FOLDER...)\n");
    return 2;
  }
  // a folder stands for its *.md pages, in name order
  std::vector<std::string> expanded;
  for (const std::string& page : pages) {
    std::error_code ec;
    if (!fs::is_directory(root / page, ec)) {
      expanded.push_back(page);
      continue;
    }
    std::vector<std::string> found;
    for (const fs::directory_entry& e : fs::directory_iterator(root / page, ec))
      if (e.is_regular_file() && e.path().extension() == ".md") found.push_back(e.path().filename().string());
    if (ec || found.empty()) {
      std::fprintf(stderr, "snippets: %s: a folder with no .md page in it\n", page.c_str());
      return 2;
    }
    std::sort(found.begin(), found.end());
    const std::string prefix = page.back() == '/' ? page : page + "/";
    for (const std::string& name : found) expanded.push_back(prefix + name);
  }
  pages = expanded;
  int status = 0;
  for (const std::string& page : pages) {
    std::string regenerate = std::string(argv[0]);
    if (root != fs::path(ATTOGRAD_SOURCE_DIR)) regenerate += " --root " + root.string();
    regenerate += " " + page;
    try {
      status = std::max(status, run(root, page, check_only, regenerate));
    } catch (const SnippetError& e) {
      std::fprintf(stderr, "snippets: %s: %s\n", e.where.c_str(), e.what.c_str());
      status = 2;
    }
  }
  return status;
}
