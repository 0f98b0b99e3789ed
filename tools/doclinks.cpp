// doclinks: checks that the reader's paths through README.md and docs/ lead somewhere.
//
//   doclinks [--root DIR] [--readme-lines N]
//   doclinks --self-test
//
// It reads README.md and every .md file under docs/ and checks:
//   - every relative link or image ([text](path), ![alt](path), [label]: path, href="path",
//     src="path") resolves to a committed file, or to a folder that holds one: a figure that
//     links docs/results/ or bench/results/ links a raw result that a clean clone has;
//   - a link to a heading of a Markdown page (page.md#anchor, or #anchor in the same page) names a
//     heading that page has, by GitHub's rule for anchors (lower case, punctuation dropped, spaces
//     to hyphens, a repeated heading gets -1, -2, ...) or an explicit <a id="..."> / <a name="...">;
//   - a citation of a section by title (a page, a comma and the title in double quotes), in those
//     pages or in a source comment (the form the code uses to name the benchmark behind a speed
//     trick), names a heading of that page whose text is the title or starts with it;
//   - README.md has at most N lines (150 by default): a front door, with the details in docs/.
// Links inside fenced code blocks and `code spans` are not links; http(s) and mailto links are not
// checked (nothing is downloaded). "Committed" is what `git ls-files` lists when DIR is a git work
// tree, else what exists on disk.
//
// Exit 0 when all hold; 1 with one line per problem (page:line, the link and what is wrong); 2 for
// bad usage. --self-test plants each kind of problem in a temporary tree and exits 1 unless every
// one is reported (the CTest "docs: the link check reports planted broken links"). Standard
// library only. DIR defaults to the source tree this binary was configured from.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#ifndef ATTOGRAD_SOURCE_DIR
#define ATTOGRAD_SOURCE_DIR "."
#endif

namespace fs = std::filesystem;

namespace {

using Lines = std::vector<std::string>;

Lines read_lines(const fs::path& path) {
  Lines out;
  std::ifstream in(path, std::ios::binary);
  for (std::string s; std::getline(in, s);) {
    if (!s.empty() && s.back() == '\r') s.pop_back();
    out.push_back(s);
  }
  return out;
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// The committed files of the tree, as paths relative to the root ('/' separated), and every folder
// above them. Without git (an exported tree, the self-test) every file on disk counts.
struct Tree {
  fs::path root;
  std::set<std::string> entries;

  explicit Tree(const fs::path& r) : root(r) {
    const std::string cmd = "git -C '" + root.string() + "' ls-files -z 2>/dev/null";
    if (FILE* p = popen(cmd.c_str(), "r")) {
      std::string all;
      char buf[65536];
      for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) all.append(buf, n);
      if (pclose(p) == 0)
        for (size_t at = 0; at < all.size();) {
          const size_t end = all.find('\0', at);
          add(all.substr(at, end - at));
          at = end == std::string::npos ? all.size() : end + 1;
        }
    }
    if (!entries.empty()) return;
    for (const auto& e : fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied))
      if (e.is_regular_file()) add(fs::relative(e.path(), root).generic_string());
  }
  void add(const std::string& rel) {
    if (rel.empty()) return;
    entries.insert(rel);
    for (size_t slash = rel.rfind('/'); slash != std::string::npos && slash > 0; slash = rel.rfind('/', slash - 1))
      entries.insert(rel.substr(0, slash));
  }
  bool has(const std::string& rel) const { return rel.empty() || entries.count(rel) > 0; }
};

// "a/b/../c/./d" -> "a/c/d"; false when the path climbs above the root.
bool normalize(const std::string& path, std::string& out) {
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '/');) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (parts.empty()) return false;
      parts.pop_back();
    } else {
      parts.push_back(part);
    }
  }
  out.clear();
  for (const std::string& p : parts) out += (out.empty() ? "" : "/") + p;
  return true;
}

std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The text a heading renders to: `code` loses its backticks, [text](url) keeps its text, HTML tags
// go.
std::string heading_text(std::string s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '`') continue;
    if (s[i] == '<') {
      const size_t close = s.find('>', i);
      if (close != std::string::npos) { i = close; continue; }
    }
    if (s[i] == ']' && i + 1 < s.size() && s[i + 1] == '(') {
      const size_t close = s.find(')', i);
      if (close != std::string::npos) { i = close; continue; }
    }
    if (s[i] == '[') continue;
    out += s[i];
  }
  return trim(out);
}

// GitHub's anchor of a heading: lower case; letters, digits, '-' and '_' kept, spaces become '-',
// other ASCII punctuation dropped. Of the other characters, Latin, Greek and Cyrillic letters are
// kept and everything else (dashes, arrows, math signs) dropped.
std::string slug(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (std::isalnum(c) || c == '-' || c == '_') out += static_cast<char>(std::tolower(c));
      else if (c == ' ') out += '-';
      ++i;
      continue;
    }
    const int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    unsigned cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (int k = 1; k < len && i + k < text.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
    const bool letter = (cp >= 0xC0 && cp <= 0x24F && cp != 0xD7 && cp != 0xF7) || (cp >= 0x370 && cp <= 0x4FF);
    if (letter) out += text.substr(i, static_cast<size_t>(len));
    i += static_cast<size_t>(len);
  }
  return out;
}

struct Page {
  Lines lines;
  std::vector<bool> code;            // line i is inside a fenced block (or is a fence)
  std::set<std::string> anchors;     // the anchors its headings and <a id> tags define
  std::vector<std::string> headings; // the rendered text of its headings
};

Page read_page(const fs::path& path) {
  Page p;
  p.lines = read_lines(path);
  std::map<std::string, int> seen;
  std::string fence;
  for (const std::string& line : p.lines) {
    const std::string t = trim(line);
    if (fence.empty() && (starts_with(t, "```") || starts_with(t, "~~~"))) {
      fence = t.substr(0, 3);
      p.code.push_back(true);
      continue;
    }
    if (!fence.empty()) {
      if (starts_with(t, fence)) fence.clear();
      p.code.push_back(true);
      continue;
    }
    p.code.push_back(false);
    for (const char* attr : {"<a id=\"", "<a name=\""})
      for (size_t at = line.find(attr); at != std::string::npos; at = line.find(attr, at + 1)) {
        const size_t b = at + std::string(attr).size(), e = line.find('"', b);
        if (e != std::string::npos) p.anchors.insert(line.substr(b, e - b));
      }
    if (!starts_with(line, "#")) continue;
    const size_t level = line.find_first_not_of('#');
    if (level == std::string::npos || level > 6 || line[level] != ' ') continue;
    const std::string text = heading_text(line.substr(level + 1));
    p.headings.push_back(text);
    const std::string base = slug(text);
    const int n = seen[base]++;
    p.anchors.insert(n == 0 ? base : base + "-" + std::to_string(n));
  }
  return p;
}

// A line without its `code spans`.
std::string without_code_spans(const std::string& line) {
  std::string out;
  bool in = false;
  for (char c : line) {
    if (c == '`') { in = !in; continue; }
    if (!in) out += c;
  }
  return out;
}

// The link targets of one line of Markdown prose.
std::vector<std::string> link_targets(const std::string& raw) {
  const std::string line = without_code_spans(raw);
  std::vector<std::string> out;
  for (size_t at = line.find("]("); at != std::string::npos; at = line.find("](", at + 2)) {
    size_t i = at + 2;
    int depth = 1;
    std::string target;
    for (; i < line.size(); ++i) {
      if (line[i] == '(') ++depth;
      if (line[i] == ')' && --depth == 0) break;
      target += line[i];
    }
    if (i == line.size()) continue;  // the link goes on past this line: not one we can read
    target = trim(target);
    if (const size_t sp = target.find(' '); sp != std::string::npos) target.resize(sp);  // a "title"
    if (target.size() >= 2 && target.front() == '<' && target.back() == '>') target = target.substr(1, target.size() - 2);
    out.push_back(target);
  }
  const std::string t = trim(line);
  if (starts_with(t, "[") && t.find("]: ") != std::string::npos && t.find("](") == std::string::npos) {
    std::string target = trim(t.substr(t.find("]: ") + 3));
    if (const size_t sp = target.find(' '); sp != std::string::npos) target.resize(sp);
    out.push_back(target);
  }
  for (const char* attr : {"href=\"", "src=\""})
    for (size_t at = line.find(attr); at != std::string::npos; at = line.find(attr, at + 1)) {
      const size_t b = at + std::string(attr).size(), e = line.find('"', b);
      if (e != std::string::npos) out.push_back(line.substr(b, e - b));
    }
  return out;
}

bool external(const std::string& target) {
  return target.find("://") != std::string::npos || starts_with(target, "mailto:");
}

struct Checker {
  const Tree& tree;
  std::map<std::string, Page> pages;  // by path relative to the root
  std::vector<std::string> problems;

  explicit Checker(const Tree& t) : tree(t) {}

  const Page* page(const std::string& rel) {
    auto it = pages.find(rel);
    if (it != pages.end()) return &it->second;
    if (!fs::is_regular_file(tree.root / rel)) return nullptr;
    return &pages.emplace(rel, read_page(tree.root / rel)).first->second;
  }

  void problem(const std::string& where, const std::string& what) { problems.push_back(where + ": " + what); }

  void check_link(const std::string& from, int line, const std::string& target) {
    const std::string where = from + ":" + std::to_string(line);
    if (target.empty() || external(target)) return;
    const size_t hash = target.find('#');
    const std::string path = percent_decode(target.substr(0, hash));
    const std::string anchor = hash == std::string::npos ? "" : target.substr(hash + 1);
    std::string rel = from;
    if (!path.empty()) {
      const std::string dir = fs::path(from).parent_path().generic_string();
      if (path.front() == '/' || !normalize((dir.empty() ? "" : dir + "/") + path, rel)) {
        problem(where, "link '" + target + "' leaves the source tree");
        return;
      }
      if (!tree.has(rel)) {
        problem(where, "link '" + target + "': " + rel + " is not a committed file or folder");
        return;
      }
    }
    if (anchor.empty() || fs::path(rel).extension() != ".md") return;
    const Page* p = page(rel);
    if (p && p->anchors.count(anchor) == 0)
      problem(where, "link '" + target + "': " + rel + " has no heading with the anchor #" + anchor);
  }

  // A page, a comma and a title in double quotes on this line (the title may go on to the next line
  // of the same comment).
  void check_citations(const std::string& from, const Lines& lines) {
    static const std::string kKey = ".md, \"";
    for (size_t i = 0; i < lines.size(); ++i) {
      for (size_t at = lines[i].find(kKey); at != std::string::npos; at = lines[i].find(kKey, at + 1)) {
        size_t b = at;
        while (b > 0 && (std::isalnum(static_cast<unsigned char>(lines[i][b - 1])) || std::string("_./-").find(lines[i][b - 1]) != std::string::npos)) --b;
        const std::string cited = lines[i].substr(b, at + 3 - b);
        std::string title = lines[i].substr(at + kKey.size());
        if (title.find('"') == std::string::npos && i + 1 < lines.size()) {
          std::string next = trim(lines[i + 1]);
          while (!next.empty() && (next[0] == '/' || next[0] == '#' || next[0] == '*')) next.erase(0, 1);
          title += " " + trim(next);
        }
        const size_t close = title.find('"');
        if (close == std::string::npos) continue;
        title = title.substr(0, close);
        check_citation(from + ":" + std::to_string(i + 1), from, cited, title);
      }
    }
  }

  void check_citation(const std::string& where, const std::string& from, const std::string& cited, const std::string& title) {
    std::string rel;
    const std::string dir = fs::path(from).parent_path().generic_string();
    if (!(tree.has(cited) && normalize(cited, rel)) && !normalize((dir.empty() ? "" : dir + "/") + cited, rel)) rel = cited;
    const Page* p = tree.has(rel) ? page(rel) : nullptr;
    if (!p) {
      problem(where, "cites '" + cited + ", \"" + title + "\"': no such page");
      return;
    }
    auto lower = [](std::string s) {
      std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
      return s;
    };
    const std::string want = lower(heading_text(title));
    for (const std::string& h : p->headings) {
      const std::string have = lower(h);
      if (have == want) return;
      if (starts_with(have, want) && !std::isalnum(static_cast<unsigned char>(have[want.size()]))) return;
    }
    problem(where, "cites '" + cited + ", \"" + title + "\"': " + rel + " has no heading that starts so");
  }

  void check_page(const std::string& rel) {
    const Page* p = page(rel);
    for (size_t i = 0; i < p->lines.size(); ++i) {
      if (p->code[i]) continue;
      for (const std::string& target : link_targets(p->lines[i])) check_link(rel, static_cast<int>(i + 1), target);
    }
    check_citations(rel, p->lines);
  }
};

bool is_source(const std::string& rel) {
  static const std::set<std::string> kExt = {".cpp", ".h", ".cu", ".cuh", ".py", ".sh", ".cmake", ".in"};
  const fs::path p(rel);
  const std::string name = p.filename().string();
  return kExt.count(p.extension().string()) > 0 || name == "CMakeLists.txt" || name == "Makefile" ||
         starts_with(rel, "tools/new-layer") || starts_with(rel, "bench/compare_") || starts_with(rel, "bench/profile_step");
}

std::vector<std::string> check_tree(const fs::path& root, int readme_lines) {
  const Tree tree(root);
  Checker c(tree);
  std::vector<std::string> md;
  for (const std::string& e : tree.entries)
    if ((e == "README.md" || starts_with(e, "docs/")) && fs::path(e).extension() == ".md" && fs::is_regular_file(root / e))
      md.push_back(e);
  if (std::find(md.begin(), md.end(), "README.md") == md.end()) c.problem("README.md", "missing");
  for (const std::string& rel : md) c.check_page(rel);
  for (const std::string& e : tree.entries)
    if (is_source(e) && !starts_with(e, "docs/") && fs::is_regular_file(root / e)) c.check_citations(e, read_lines(root / e));
  if (const Page* readme = c.page("README.md"); readme && static_cast<int>(readme->lines.size()) > readme_lines)
    c.problem("README.md", std::to_string(readme->lines.size()) + " lines, more than " + std::to_string(readme_lines) +
                               ": the details belong in docs/");
  return c.problems;
}

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// Plants one problem of each kind, and a page of links that are all fine, in a temporary tree.
int self_test() {
  const fs::path root = fs::temp_directory_path() / ("doclinks-self-test-" + std::to_string(getpid()));
  fs::remove_all(root);
  std::string readme = "# t\n\n[ok](docs/a.md#a-heading-with-code--and-a-dash) [ok](docs/results/run/) [ok](#t)\n";
  readme += "[broken](docs/results/missing.json) [no anchor](docs/a.md#nowhere)\n```\n[in code](nowhere.md)\n```\n";
  for (int i = 0; i < 150; ++i) readme += "line\n";
  write(root / "README.md", readme);
  write(root / "docs/a.md", "# A heading with `code` — and a dash\n\n## Small data: the defaults\n\n[up](../README.md) [self](#small-data-the-defaults) [image](img/x.svg)\n");
  write(root / "docs/results/run/report.json", "{}\n");
  write(root / "core/x.cpp", "// why (docs/a.md, \"Small data\"); and (docs/a.md, \"Big data\")\n");
  const std::vector<std::string> got = check_tree(root, 150);
  fs::remove_all(root);
  const std::vector<std::string> want = {"docs/results/missing.json", "#nowhere", "README.md: 15", "img/x.svg", "Big data"};
  int status = 0;
  for (const std::string& w : want) {
    const bool found = std::any_of(got.begin(), got.end(), [&](const std::string& g) { return g.find(w) != std::string::npos; });
    if (!found) { std::fprintf(stderr, "doclinks self-test: FAILED: no report mentioning '%s'\n", w.c_str()); status = 1; }
  }
  if (got.size() != want.size()) {
    std::fprintf(stderr, "doclinks self-test: FAILED: %zu reports, expected %zu:\n", got.size(), want.size());
    for (const std::string& g : got) std::fprintf(stderr, "  %s\n", g.c_str());
    status = 1;
  }
  if (status == 0) std::printf("doclinks self-test: every planted problem reported, nothing else\n");
  return status;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "doclinks: %s (usage: doclinks [--root DIR] [--readme-lines N] | --self-test)\n", why.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  fs::path root = ATTOGRAD_SOURCE_DIR;
  int readme_lines = 150;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--self-test") return self_test();
    if (a == "--help") {
      std::printf("doclinks [--root DIR] [--readme-lines N]: every link of README.md and docs/ resolves\n");
      return 0;
    }
    if ((a == "--root" || a == "--readme-lines") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (a == "--root") {
        root = v;
      } else {
        char* end = nullptr;
        const long n = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || n < 1) usage("--readme-lines: expected a positive count, got '" + v + "'");
        readme_lines = static_cast<int>(n);
      }
      continue;
    }
    usage("unknown or incomplete option '" + a + "'");
  }
  if (!fs::is_directory(root)) usage("--root: '" + root.string() + "' is not a folder");
  const std::vector<std::string> problems = check_tree(root, readme_lines);
  for (const std::string& p : problems) std::printf("%s\n", p.c_str());
  if (!problems.empty()) {
    std::printf("doclinks: %zu problems\n", problems.size());
    return 1;
  }
  std::printf("doclinks: every link and citation of README.md and docs/ resolves; README.md within %d lines\n", readme_lines);
  return 0;
}
