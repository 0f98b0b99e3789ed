// opsdoc: renders the spec comments of attograd's op headers into docs/ops.md.
//
//   opsdoc [--root DIR] [--check]
//
// Reads the spec blocks of autograd/ops.h and autograd/recompute.h (the format is written down at
// the top of autograd/ops.h), finds the Tensor methods they name in core/tensor.h, and writes
// docs/ops.md: a table of contents of every op by family, then each op's declarations, its spec
// and links to its declaration lines and to the file of its backward.
//
// --check writes nothing: it compares the existing docs/ops.md with what it would write and exits
// 1, naming the first op that differs, when the file is out of date (the CTest "docs: ops.md is up
// to date"). A malformed spec (a missing or misplaced field, a declaration without a block, a name
// that matches no declaration) exits 2 with its file:line, in both modes.
//
// DIR defaults to the source tree this binary was configured from. Standard library only.
#include <algorithm>
#include <cctype>
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

namespace {

namespace fs = std::filesystem;

// The headers whose spec blocks make the table, in this order, and where Tensor's methods are.
const std::vector<std::string> kHeaders = {"autograd/ops.h", "autograd/recompute.h"};
const std::string kTensorHeader = "core/tensor.h";
const std::string kOutput = "docs/ops.md";
// The fields of a block, in their order; the last two are optional.
const std::vector<std::string> kFields = {"forward", "vjp", "shapes", "saves", "note", "math"};
constexpr size_t kRequiredFields = 4;

// A malformed header: reported as "file:line: message", exit 2.
struct SpecError {
  std::string where, what;
};

// One source line of code, with where it is.
struct Code {
  std::string file;
  int line;  // 1-based
  std::string text;
};

struct Op {
  std::vector<std::string> names;  // as written in the block's head: "relu", "Tensor::view"
  std::string file;                // the header of the block
  int line = 0;                    // the block's head line
  std::vector<std::string> spec;   // the block's lines without their leading "// " (but the math field)
  std::string math;                // the math field: the walkthrough deriving it, docs/math/<page>.md
  std::vector<Code> code;          // the declarations (and structs) right below the block
  std::vector<Code> decls;         // the first line of each function declaration among them
  std::vector<Code> methods;       // Tensor methods of the same names, in core/tensor.h
};

struct Family {
  std::string title;     // "views"
  std::string backward;  // "autograd/ops/view.cpp": the fronts and backwards of its ops
  std::vector<std::string> intro;  // prose under the section header, one entry per paragraph
  std::vector<Op> ops;
};

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw SpecError{path.string(), "cannot read this file"};
  std::vector<std::string> lines;
  for (std::string s; std::getline(in, s);) lines.push_back(s);
  return lines;
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

bool is_word(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The identifier starting at s[pos] (empty when there is none); pos moves past it.
std::string word_at(const std::string& s, size_t& pos) {
  const size_t b = pos;
  while (pos < s.size() && is_word(s[pos])) ++pos;
  return s.substr(b, pos - b);
}

// "//   name: text" (exactly three spaces) -> "name"; "" for any other line.
std::string field_name(const std::string& s) {
  if (!starts_with(s, "//   ")) return "";
  size_t pos = 5;
  const std::string name = word_at(s, pos);
  if (name.empty() || pos == s.size() || s[pos] != ':' || (pos + 1 < s.size() && s[pos + 1] != ' ')) return "";
  return name;
}

// A block's head "// a, b, Tensor::c: summary" -> {"a", "b", "Tensor::c"}; {} for any other line.
std::vector<std::string> head_names(const std::string& s) {
  if (!starts_with(s, "// ")) return {};
  std::vector<std::string> names;
  for (size_t pos = 3;;) {
    const bool method = s.compare(pos, 8, "Tensor::") == 0;
    if (method) pos += 8;
    const std::string w = word_at(s, pos);
    if (w.empty()) return {};
    names.push_back(method ? "Tensor::" + w : w);
    if (s.compare(pos, 2, ", ") == 0) {
      pos += 2;
    } else if (s.compare(pos, 2, ": ") == 0 && pos + 2 < s.size() && s[pos + 2] != ' ') {
      return names;
    } else {
      return {};
    }
  }
}

// "// ==== title (file) ====" -> "title (file)"; "" for any other line.
std::string section_title(const std::string& s) {
  if (!starts_with(s, "// =") || s.back() != '=') return "";
  const size_t b = s.find_first_not_of("= ", 3), e = s.find_last_not_of("= ");
  return b == std::string::npos || e < b ? "" : s.substr(b, e - b + 1);
}

// The name of the function a declaration declares: the identifier before its first '('.
std::string function_name(const std::string& decl) {
  size_t e = decl.find('(');
  if (e == std::string::npos) return "";
  size_t b = e;
  while (b > 0 && is_word(decl[b - 1])) --b;
  return decl.substr(b, e - b);
}

// ---- core/tensor.h: the methods of class Tensor ---------------------------------------------
// name -> its declarations, shown as "Tensor Tensor::reshape(const Shape& shape) const;"
std::map<std::string, std::vector<Code>> tensor_methods(const fs::path& root) {
  const std::vector<std::string> lines = read_lines(root / kTensorHeader);
  std::map<std::string, std::vector<Code>> out;
  bool inside = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (starts_with(lines[i], "class Tensor {")) inside = true;
    else if (inside && starts_with(lines[i], "};")) break;
    if (!inside || lines[i].empty() || lines[i][0] != ' ') continue;
    // "  Tensor name(...) const;  // comment", the return type Tensor, Tensor& or std::vector<Tensor>
    std::string decl = trim(lines[i]);
    std::string type;
    for (const char* t : {"Tensor ", "Tensor& ", "std::vector<Tensor> "})
      if (starts_with(decl, t)) type = trim(t);
    if (type.empty()) continue;
    size_t pos = type.size() + 1;
    const std::string name = word_at(decl, pos);
    if (name.empty() || pos == decl.size() || decl[pos] != '(') continue;
    std::string rest = decl.substr(pos);
    if (size_t c = rest.find("//"); c != std::string::npos) rest = rest.substr(0, c);  // its comment
    if (size_t b = rest.find(" {"); b != std::string::npos) rest = rest.substr(0, b);  // an inline body
    rest = trim(rest);
    if (rest.back() != ';') rest += ';';
    out[name].push_back({kTensorHeader, int(i) + 1, type + " Tensor::" + name + rest});
  }
  return out;
}

// ---- the spec blocks of one header ------------------------------------------------------------
class HeaderParser {
 public:
  HeaderParser(fs::path root, std::string file, std::vector<std::string> lines,
               const std::map<std::string, std::vector<Code>>& methods)
      : root_(std::move(root)), file_(std::move(file)), lines_(std::move(lines)), methods_(methods) {}

  void parse(std::vector<Family>& families) {
    Family* family = nullptr;  // null before the first section, and in a section without a file
    for (i_ = 0; i_ < lines_.size();) {
      const std::string& s = lines_[i_];
      if (const std::string title = section_title(s); !title.empty()) {
        const size_t open = title.rfind(" (");
        family = nullptr;
        ++i_;
        if (open != std::string::npos && title.back() == ')') {
          families.push_back({title.substr(0, open), title.substr(open + 2, title.size() - open - 3), {}, {}});
          family = &families.back();
          family->intro = intro();
        }
      } else if (is_head(i_)) {
        if (!family) fail(i_, "a spec block outside a section that names its file \"// ==== family (file) ====\"");
        family->ops.push_back(block());
      } else if (!field_name(s).empty()) {
        fail(i_, "a spec field outside a block: the block's head \"// name: summary\" must come first");
      } else if (is_code(s) && !is_operator(s)) {
        fail(i_, "a declaration without a spec block above it: \"" + trim(s) + "\"");
      } else {
        ++i_;
      }
    }
  }

 private:
  fs::path root_;
  std::string file_;
  std::vector<std::string> lines_;
  const std::map<std::string, std::vector<Code>>& methods_;
  size_t i_ = 0;

  [[noreturn]] void fail(size_t i, const std::string& what) const {
    throw SpecError{file_ + ":" + std::to_string(i + 1), what};
  }

  // Code at the top level of the header: what a spec block must cover.
  static bool is_code(const std::string& s) {
    return !s.empty() && s[0] != ' ' && !starts_with(s, "//") && !starts_with(s, "#") &&
           !starts_with(s, "namespace ") && !starts_with(s, "}");
  }
  // The shorthands a + b, -x, ...: sugar for ops that have their blocks.
  static bool is_operator(const std::string& s) {
    return starts_with(s, "inline ") && s.find(" operator") != std::string::npos;
  }
  // "// name: summary" (or "// a, b, Tensor::c: summary") followed by the forward field.
  bool is_head(size_t i) const {
    return !head_names(lines_[i]).empty() && i + 1 < lines_.size() && field_name(lines_[i + 1]) == "forward";
  }

  // The prose after a section header, up to the first block or code: paragraphs split at "//".
  std::vector<std::string> intro() {
    std::vector<std::string> paragraphs(1);
    for (; i_ < lines_.size() && starts_with(lines_[i_], "//") && !is_head(i_); ++i_) {
      const std::string text = trim(lines_[i_].substr(2));
      if (text.empty()) {
        if (!paragraphs.back().empty()) paragraphs.emplace_back();
      } else {
        paragraphs.back() += (paragraphs.back().empty() ? "" : " ") + text;
      }
    }
    if (paragraphs.back().empty()) paragraphs.pop_back();
    return paragraphs;
  }

  Op block() {
    Op op;
    op.file = file_;
    op.line = int(i_) + 1;
    op.names = head_names(lines_[i_]);
    op.spec.push_back(lines_[i_].substr(3));
    ++i_;
    size_t next = 0;  // index into kFields of the field expected next
    for (; i_ < lines_.size() && starts_with(lines_[i_], "//   "); ++i_) {
      const std::string& s = lines_[i_];
      if (const std::string name = field_name(s); !name.empty()) {
        if (trim(s.substr(s.find(':') + 1)).empty()) fail(i_, "the field \"" + name + ":\" is empty");
        while (next >= kRequiredFields && next < kFields.size() && name != kFields[next]) ++next;  // optional
        if (next == kFields.size() || name != kFields[next]) {
          const std::string want = next < kFields.size() ? "the field \"" + kFields[next] + ":\"" : "no more fields";
          fail(i_, "expected " + want + ", got \"" + name + ":\" (fields: forward, vjp, shapes, saves, then an optional "
                   "note and math)");
        }
        ++next;
        if (name == "math") {
          op.math = trim(s.substr(s.find(':') + 1));
          if (!starts_with(op.math, "docs/math/") || !fs::exists(root_ / op.math))
            fail(i_, "math: \"" + op.math + "\" is not a page under docs/math/");
          continue;
        }
      } else if (!starts_with(s, "//    ") || next == 0) {
        fail(i_, "expected a field \"//   name: text\" or its continuation, indented deeper");
      }
      op.spec.push_back(s.substr(3));
    }
    if (next < kRequiredFields)
      fail(i_, "the block of line " + std::to_string(op.line) + " lacks \"" + kFields[next] + ":\"");
    while (i_ < lines_.size() && is_code(lines_[i_])) declaration(op);
    check_names(op);
    return op;
  }

  // One declaration (up to its ';') or struct definition (up to "};"), appended to op.code.
  void declaration(Op& op) {
    const bool is_struct = starts_with(lines_[i_], "struct ");
    if (!is_struct) op.decls.push_back({file_, int(i_) + 1, lines_[i_]});
    for (bool first = true; i_ < lines_.size(); ++i_, first = false) {
      const std::string& s = lines_[i_];
      if (!first && !is_struct && (s.empty() || s[0] != ' ')) fail(i_, "a declaration without its closing ';'");
      op.code.push_back({file_, int(i_) + 1, s});
      const std::string t = trim(s);
      if (is_struct ? t == "};" : (!t.empty() && (t.back() == ';' || t.back() == '}'))) break;
    }
    if (i_ == lines_.size()) fail(i_ - 1, "the header ends inside a declaration");
    ++i_;
  }

  // The block's names are exactly the functions declared below it (plus methods of Tensor).
  void check_names(Op& op) {
    std::vector<std::string> declared;
    for (const Code& d : op.decls) {
      declared.push_back(function_name(d.text));
      if (declared.back().empty()) fail(size_t(d.line - 1), "cannot read a function name here");
    }
    auto at = [&](const std::string& what) { fail(size_t(op.line - 1), what); };
    for (const std::string& n : op.names) {
      if (starts_with(n, "Tensor::")) {
        auto it = methods_.find(n.substr(8));
        if (it == methods_.end()) at("\"" + n + "\": no such method in class Tensor (" + kTensorHeader + ")");
        op.methods.insert(op.methods.end(), it->second.begin(), it->second.end());
      } else {
        if (std::find(declared.begin(), declared.end(), n) == declared.end())
          at("\"" + n + "\" is named by the block but not declared right below it");
        if (auto it = methods_.find(n); it != methods_.end())
          op.methods.insert(op.methods.end(), it->second.begin(), it->second.end());
      }
    }
    for (const std::string& d : declared)
      if (std::find(op.names.begin(), op.names.end(), d) == op.names.end())
        at("\"" + d + "\" is declared below the block but not named in its head");
  }
};

// ---- rendering ----------------------------------------------------------------------------------
// GitHub's heading anchors: lowercase, punctuation dropped, spaces to '-', "-1", "-2" on repeats.
class Anchors {
 public:
  std::string operator()(const std::string& heading) {
    std::string slug;
    for (char c : heading) {
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')
        slug += char(std::tolower(static_cast<unsigned char>(c)));
      else if (c == ' ')
        slug += '-';
    }
    const int n = seen_[slug]++;
    return n == 0 ? slug : slug + "-" + std::to_string(n);
  }

 private:
  std::map<std::string, int> seen_;
};

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string link(const std::string& file, int line) {
  return "[" + file + ":" + std::to_string(line) + "](../" + file + "#L" + std::to_string(line) + ")";
}

// The paragraphs of the top comment of ops.h that a reader of the table needs.
std::vector<std::string> preamble(const fs::path& root) {
  std::vector<std::string> out;
  std::string para;
  for (const std::string& s : read_lines(root / kHeaders[0])) {
    if (!starts_with(s, "//") && !starts_with(s, "#pragma")) break;
    const std::string text = s.size() > 2 ? trim(s.substr(2)) : "";
    if (text.empty()) {
      if (starts_with(para, "Notation:") || starts_with(para, "Conventions:")) out.push_back(para);
      para.clear();
    } else {
      para += (para.empty() ? "" : " ") + text;
    }
  }
  if (starts_with(para, "Notation:") || starts_with(para, "Conventions:")) out.push_back(para);
  return out;
}

std::string render(const fs::path& root, const std::vector<Family>& families) {
  std::ostringstream md;
  Anchors anchor;
  anchor("Ops");
  anchor("Contents");
  // anchors in document order: every family heading, then its ops'
  std::vector<std::string> family_anchor;
  std::vector<std::vector<std::string>> op_anchor;
  for (const Family& f : families) {
    family_anchor.push_back(anchor(f.title));
    op_anchor.emplace_back();
    for (const Op& op : f.ops) op_anchor.back().push_back(anchor(join(op.names, ", ")));
  }
  size_t n_ops = 0;
  for (const Family& f : families) n_ops += f.ops.size();

  md << "<!-- Generated by tools/opsdoc.cpp from the spec comments of " << join(kHeaders, " and ")
     << ": do not edit. -->\n";
  md << "# Ops\n\n";
  md << "Every op of attograd (" << n_ops << " entries), from the spec comment above its declaration: the "
        "forward formula, the vector-Jacobian product (VJP) its backward computes, the shapes, and what it "
        "saves for backward. Each entry links to its declaration and to the file of its front and backward, "
        "which names the CPU kernels it calls (in `core/cpu/`, declared in `core/kernels/`).\n\n";
  md << "This file is generated. Edit the comments in the headers (the format is at the top of "
        "[autograd/ops.h](../autograd/ops.h)), then run `build/opsdoc` (CMake target `opsdoc`). The test "
        "`docs: ops.md is up to date` (`opsdoc --check`) fails when this file is stale.\n\n";
  for (const std::string& p : preamble(root)) md << p << "\n\n";

  md << "## Contents\n\n| family | ops |\n| --- | --- |\n";
  for (size_t k = 0; k < families.size(); ++k) {
    std::vector<std::string> links;
    for (size_t j = 0; j < families[k].ops.size(); ++j)
      for (const std::string& n : families[k].ops[j].names) links.push_back("[" + n + "](#" + op_anchor[k][j] + ")");
    md << "| [" << families[k].title << "](#" << family_anchor[k] << ") | " << join(links, ", ") << " |\n";
  }

  for (size_t k = 0; k < families.size(); ++k) {
    const Family& f = families[k];
    md << "\n## " << f.title << "\n\n";
    md << "Fronts and backwards: [" << f.backward << "](../" << f.backward << ").";
    for (const std::string& p : f.intro) md << (&p == &f.intro.front() ? " " : "\n\n") << p;
    md << "\n";
    for (const Op& op : f.ops) {
      md << "\n### " << join(op.names, ", ") << "\n\n";
      if (!op.code.empty() || !op.methods.empty()) {
        md << "```cpp\n";
        for (const Code& d : op.code) md << d.text << "\n";
        for (const Code& d : op.methods) md << d.text << "\n";
        md << "```\n\n";
      }
      md << "```text\n" << join(op.spec, "\n") << "\n```\n\n";
      std::vector<std::string> declared;
      for (const Code& d : op.decls) declared.push_back(link(d.file, d.line));
      for (const Code& d : op.methods) declared.push_back(link(d.file, d.line));
      md << "Spec: " << link(op.file, op.line) << " · declared: " << join(declared, ", ") << " · backward: ["
         << f.backward << "](../" << f.backward << ")";
      if (!op.math.empty()) md << " · derivation: [" << op.math << "](" << op.math.substr(5) << ")";
      md << "\n";
    }
  }
  return md.str();
}

// ---- --check --------------------------------------------------------------------------------------
// A document cut at its "## " and "### " headings: what a difference is attributed to.
struct Chunk {
  std::string heading;  // "### relu", or "(top of the file)"
  int line;             // 1-based line of the heading
  std::vector<std::string> lines;
};

std::vector<Chunk> chunks(const std::string& text) {
  std::vector<Chunk> out{{"(top of the file)", 1, {}}};
  std::istringstream in(text);
  int n = 0;
  for (std::string s; std::getline(in, s);) {
    ++n;
    if (starts_with(s, "## ") || starts_with(s, "### ")) out.push_back({s, n, {}});
    out.back().lines.push_back(s);
  }
  return out;
}

std::string describe(const std::string& heading) {
  if (starts_with(heading, "### ")) return "op " + heading.substr(4);
  if (starts_with(heading, "## ")) return "section " + heading.substr(3);
  return heading;
}

// Exit status 1 and a message naming the first op that differs; 0 when the file is up to date.
int check(const std::string& path, const std::string& expected, const std::string& regenerate) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "opsdoc: %s does not exist.\nGenerate it with: %s\n", path.c_str(), regenerate.c_str());
    return 1;
  }
  const std::string actual((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (actual == expected) {
    std::printf("opsdoc: %s is up to date\n", path.c_str());
    return 0;
  }
  const std::vector<Chunk> want = chunks(expected), have = chunks(actual);
  std::string what, detail;
  // the ops first (a new op also changes the contents, but the op is the news), then the rest
  for (int pass = 0; pass < 2 && what.empty(); ++pass) {
    for (const Chunk& w : want) {
      if (starts_with(w.heading, "### ") != (pass == 0)) continue;
      auto h = std::find_if(have.begin(), have.end(), [&](const Chunk& c) { return c.heading == w.heading; });
      if (h == have.end()) {
        what = describe(w.heading) + " is missing from it";
        break;
      }
      if (h->lines == w.lines) continue;
      what = describe(w.heading) + " differs";
      for (size_t j = 0; j < std::max(w.lines.size(), h->lines.size()); ++j) {
        const std::string a = j < h->lines.size() ? h->lines[j] : "(end of entry)";
        const std::string b = j < w.lines.size() ? w.lines[j] : "(end of entry)";
        if (a == b) continue;
        detail = "  line " + std::to_string(h->line + int(j)) + " of the file: " + a + "\n";
        detail += "  the headers give:   " + b + "\n";
        break;
      }
      break;
    }
  }
  if (what.empty()) {
    for (const Chunk& h : have)
      if (std::none_of(want.begin(), want.end(), [&](const Chunk& c) { return c.heading == h.heading; })) {
        what = describe(h.heading) + " is in it but no longer in the headers";
        break;
      }
  }
  if (what.empty()) what = "its entries are in another order than the headers'";
  std::fprintf(stderr, "opsdoc: %s is out of date: %s.\n%sRegenerate it with: %s\n", path.c_str(), what.c_str(),
               detail.c_str(), regenerate.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path root = ATTOGRAD_SOURCE_DIR;
  bool check_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--check") {
      check_only = true;
    } else if (a == "--root" && i + 1 < argc) {
      root = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: opsdoc [--root DIR] [--check]\n"
                   "  writes DIR/%s from the spec comments of the op headers (DIR: %s);\n"
                   "  --check only compares, and exits 1 when the file is out of date\n",
                   kOutput.c_str(), ATTOGRAD_SOURCE_DIR);
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  try {
    const auto methods = tensor_methods(root);
    std::vector<Family> families;
    for (const std::string& h : kHeaders) HeaderParser(root, h, read_lines(root / h), methods).parse(families);
    for (const Family& f : families)
      if (!fs::exists(root / f.backward))
        throw SpecError{f.title, "section names the file " + f.backward + ", which does not exist"};
    const std::string md = render(root, families);
    const std::string out = (root / kOutput).string();
    if (check_only) {
      std::string regenerate = argv[0];
      if (root != fs::path(ATTOGRAD_SOURCE_DIR)) regenerate += " --root " + root.string();
      return check(out, md, regenerate);
    }
    std::ofstream file(out, std::ios::binary);
    if (!(file << md).flush()) throw SpecError{out, "cannot write this file"};
    size_t n = 0;
    for (const Family& f : families) n += f.ops.size();
    std::printf("opsdoc: wrote %s (%zu entries in %zu families)\n", out.c_str(), n, families.size());
    return 0;
  } catch (const SpecError& e) {
    std::fprintf(stderr, "%s: %s\n", e.where.c_str(), e.what.c_str());
    return 2;
  }
}
