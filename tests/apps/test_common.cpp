// apps/common: the metrics files (JSONL, tfevents), SVG plots, the progress bar, the report and
// the stop flag. The files are read back here by small independent readers: a minimal XML
// well-formedness checker below, nlohmann::json for JSONL, and read_tfevents (whose protobuf
// decoding is itself checked against hand-encoded bytes).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <map>
#include <regex>
#include <sstream>

#include "apps/common/metrics.h"
#include "apps/common/plot.h"
#include "apps/common/progress.h"
#include "apps/common/report.h"
#include "apps/common/signal.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::apps;
using ag::test::TempDir;

namespace {

// ---- a minimal XML well-formedness checker -------------------------------------------------
// Tags balance and nest, attribute values are quoted, text and attributes hold no raw '<' and only
// the five named entities or numeric references after '&'. Counts elements by name and by
// "name.class", and collects every attribute `points`.
struct XmlCheck {
  bool ok = true;
  std::string error;
  std::map<std::string, int> count;
  std::vector<std::string> points;
  std::vector<std::string> texts;  // character data between tags
};

bool entity_ok(const std::string& s, size_t amp) {
  static const char* named[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
  for (const char* e : named)
    if (s.compare(amp, std::strlen(e), e) == 0) return true;
  if (s.compare(amp, 2, "&#") != 0) return false;
  size_t i = amp + 2;
  if (i < s.size() && s[i] == 'x') ++i;
  const size_t digits = i;
  while (i < s.size() && std::isxdigit(static_cast<unsigned char>(s[i]))) ++i;
  return i > digits && i < s.size() && s[i] == ';';
}

XmlCheck check_xml(const std::string& s) {
  XmlCheck r;
  auto bad = [&](std::string why, size_t at) {
    if (r.ok) r.ok = false, r.error = fmt::format("{} at byte {}", why, at);
  };
  std::vector<std::string> stack;
  size_t i = 0;
  bool root_seen = false;
  while (i < s.size() && r.ok) {
    if (s[i] != '<') {
      const size_t end = std::min(s.find('<', i), s.size());
      const std::string text = s.substr(i, end - i);
      for (size_t k = 0; k < text.size(); ++k)
        if (text[k] == '&' && !entity_ok(text, k)) bad("bare '&' in text", i + k);
        else if (text[k] == '>') bad("raw '>' in text", i + k);
      if (stack.empty() && text.find_first_not_of(" \n\r\t") != std::string::npos) bad("text outside the root", i);
      if (!stack.empty()) r.texts.push_back(text);
      i = end;
      continue;
    }
    if (s.compare(i, 5, "<?xml") == 0) {
      const size_t e = s.find("?>", i);
      if (e == std::string::npos || i != 0) bad("bad XML declaration", i);
      i = e + 2;
      continue;
    }
    if (s.compare(i, 4, "<!--") == 0) {
      const size_t e = s.find("-->", i);
      if (e == std::string::npos) return bad("unterminated comment", i), r;
      i = e + 3;
      continue;
    }
    const bool closing = i + 1 < s.size() && s[i + 1] == '/';
    size_t j = i + (closing ? 2 : 1);
    const size_t name_start = j;
    while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '-' || s[j] == ':' || s[j] == '_'))
      ++j;
    const std::string name = s.substr(name_start, j - name_start);
    if (name.empty()) return bad("empty tag name", i), r;
    std::string cls;
    bool self_closing = false;
    // attributes: name="value" separated by whitespace, then '>' or '/>'
    while (r.ok) {
      while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j]))) ++j;
      if (j >= s.size()) return bad("unterminated tag <" + name, i), r;
      if (s[j] == '>') { ++j; break; }
      if (s[j] == '/' && j + 1 < s.size() && s[j + 1] == '>' && !closing) { self_closing = true, j += 2; break; }
      if (closing) return bad("attributes in a closing tag", j), r;
      const size_t an = j;
      while (j < s.size() && s[j] != '=' && !std::isspace(static_cast<unsigned char>(s[j])) && s[j] != '>') ++j;
      const std::string attr = s.substr(an, j - an);
      if (attr.empty() || j + 1 >= s.size() || s[j] != '=' || (s[j + 1] != '"' && s[j + 1] != '\''))
        return bad("attribute without a quoted value in <" + name, j), r;
      const char q = s[j + 1];
      const size_t vs = j + 2, ve = s.find(q, vs);
      if (ve == std::string::npos) return bad("unterminated attribute value", vs), r;
      const std::string value = s.substr(vs, ve - vs);
      for (size_t k = 0; k < value.size(); ++k)
        if (value[k] == '<' || (value[k] == '&' && !entity_ok(value, k))) bad("'<' or bare '&' in attribute", vs + k);
      if (attr == "class") cls = value;
      if (attr == "points") r.points.push_back(value);
      j = ve + 1;
    }
    if (closing) {
      if (stack.empty() || stack.back() != name)
        return bad(fmt::format("</{}> does not close <{}>", name, stack.empty() ? "" : stack.back()), i), r;
      stack.pop_back();
    } else {
      if (stack.empty() && root_seen) return bad("second root element", i), r;
      root_seen = true;
      ++r.count[name];
      if (!cls.empty()) ++r.count[name + "." + cls];
      if (!self_closing) stack.push_back(name);
    }
    i = j;
  }
  if (r.ok && !stack.empty()) bad("unclosed <" + stack.back() + ">", s.size());
  if (r.ok && !root_seen) bad("no root element", 0);
  return r;
}

int count_pairs(const std::string& points) {  // "x,y x,y ..." -> number of pairs
  int n = 0;
  for (char c : points) n += c == ',';
  return n;
}

std::string read_stream(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
  return s;
}

std::string hex(const std::string& bytes) {
  std::string h;
  for (unsigned char c : bytes) h += fmt::format("{:02x}", c);
  return h;
}

}  // namespace

// ---- the checker itself must reject what it is there to catch ------------------------------
TEST_CASE("xml check: accepts well-formed and rejects broken documents") {
  CHECK(check_xml("<?xml version=\"1.0\"?>\n<svg a=\"1\"><g class=\"x\"><rect/></g>&amp;</svg>\n").ok);
  CHECK_FALSE(check_xml("<svg><g></svg></g>").ok);
  CHECK_FALSE(check_xml("<svg><g>").ok);
  CHECK_FALSE(check_xml("<svg>a & b</svg>").ok);
  CHECK_FALSE(check_xml("<svg>a < b</svg>").ok);
  CHECK_FALSE(check_xml("<svg t=\"<\"/>").ok);
  CHECK_FALSE(check_xml("<svg t=1/>").ok);
  CHECK_FALSE(check_xml("<svg/><svg/>").ok);
  XmlCheck c = check_xml("<svg><rect class=\"cell\"/><rect class=\"cell\"/><rect/></svg>");
  CHECK(c.count["rect"] == 3);
  CHECK(c.count["rect.cell"] == 2);
}

// ---- CRC-32C -------------------------------------------------------------------------------
TEST_CASE("crc32c: known vectors") {
  // The CRC catalogue's check value, and RFC 3720 (iSCSI) appendix B.4's 32-byte vectors.
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c("") == 0u);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc32c(std::string(32, '\xFF')) == 0x62A8AB43u);
  std::string inc(32, 0);
  for (int k = 0; k < 32; ++k) inc[size_t(k)] = char(k);
  CHECK(crc32c(inc) == 0x46DD794Eu);
  // Continuing over a second piece equals the CRC of the whole.
  CHECK(crc32c("56789", 5, crc32c("1234")) == 0xE3069283u);
  // masked(c) = rotr15(c) + 0xa282ead8: masked(0) is the constant itself; unmask inverts it.
  CHECK(mask_crc32c(0) == 0xa282ead8u);
  CHECK(mask_crc32c(0x00008000u) == 0xa282ead9u);  // bit 15 rotates to bit 0
  for (uint32_t c : {0u, 1u, 0xE3069283u, 0xFFFFFFFFu}) CHECK(unmask_crc32c(mask_crc32c(c)) == c);
}

// ---- tfevents ------------------------------------------------------------------------------
TEST_CASE("tfevents: scalar event bytes match a hand encoding") {
  // Event{wall_time = 1.0, step = 5, summary = Summary{value = [Value{tag = "a", simple_value = 0.5}]}}
  //   09 <1.0 as LE double: 00 00 00 00 00 00 f0 3f>   key (1 << 3 | 1): field 1, fixed64
  //   10 05                                             key (2 << 3 | 0): field 2, varint 5
  //   2a 0a                                             key (5 << 3 | 2), 10 bytes of Summary:
  //     0a 08                                           Summary.value (1 << 3 | 2), 8 bytes of Value:
  //       0a 01 61                                      Value.tag (1 << 3 | 2) "a"
  //       15 00 00 00 3f                                Value.simple_value (2 << 3 | 5), 0.5f LE
  CHECK(hex(encode_scalars_event(1.0, 5, {{"a", 0.5}})) == "09000000000000f03f10052a0a0a080a016115" "0000003f");
  // file_version: 09 <wall_time> 1a 0d "brain.Event:2" (3 << 3 | 2, 13 bytes); step 0 is left out.
  CHECK(hex(encode_file_version_event(0.0)) == "0900000000000000001a0d" + hex("brain.Event:2"));
  // Step 300 = 0b1'0010'1100: varint ac 02 (low 7 bits with the continuation bit, then 2).
  CHECK(hex(encode_scalars_event(0.0, 300, {})).substr(18, 8) == "10ac022a");
  // A record of 2 data bytes: length 02 00.. (8 bytes), masked crc of those 8 bytes, data, masked crc.
  const std::string rec = tfrecord("hi");
  REQUIRE(rec.size() == 8 + 4 + 2 + 4);
  CHECK(hex(rec.substr(0, 8)) == "0200000000000000");
  uint32_t len_crc, data_crc;
  std::memcpy(&len_crc, rec.data() + 8, 4);
  std::memcpy(&data_crc, rec.data() + 14, 4);
  CHECK(len_crc == mask_crc32c(crc32c(rec.data(), 8)));
  CHECK(data_crc == mask_crc32c(crc32c("hi")));
  CHECK(rec.substr(12, 2) == "hi");
}

TEST_CASE("tfevents: writer and reader round trip") {
  TempDir tmp("tfevents");
  std::string path;
  {
    TfEventsWriter w(tmp.file("run"));
    path = w.path();
    w.add_scalars(0, {{"train/loss", 2.5}, {"train/lr", 1e-3}}, 1000.0);
    w.add_scalar("val/accuracy", 100, 0.8125, 1001.5);
    w.add_scalars(-1, {{"neg", -3.0}});  // a negative step is a 10-byte varint
    // Flushed after every event: readable while the writer is still open.
    CHECK(read_tfevents(path).scalars.size() == 4);
  }
  const std::string file = std::filesystem::path(path).filename().string();
  CHECK(std::regex_match(file, std::regex(R"(events\.out\.tfevents\.\d{10}\..+)")));
  TfEvents ev = read_tfevents(path);
  CHECK(ev.file_version == "brain.Event:2");
  CHECK(ev.events == 4);
  REQUIRE(ev.scalars.size() == 4);
  CHECK(ev.scalars[0].tag == "train/loss");
  CHECK(ev.scalars[0].step == 0);
  CHECK(ev.scalars[0].value == 2.5f);
  CHECK(ev.scalars[0].wall_time == 1000.0);
  CHECK(ev.scalars[1].tag == "train/lr");
  CHECK(ev.scalars[1].value == 1e-3f);
  CHECK(ev.scalars[2].tag == "val/accuracy");
  CHECK(ev.scalars[2].step == 100);
  CHECK(ev.scalars[2].value == 0.8125f);
  CHECK(ev.scalars[2].wall_time == 1001.5);
  CHECK(ev.scalars[3].step == -1);
  CHECK(ev.scalars[3].value == -3.0f);
  CHECK(ev.scalars[3].wall_time > 1.6e9);  // "now"

  // A second writer in the same second does not overwrite the first file.
  TfEventsWriter a(tmp.file("same")), b(tmp.file("same"));
  CHECK(a.path() != b.path());
}

TEST_CASE("tfevents: reader rejects corrupt files naming the file and the values") {
  TempDir tmp("tfevents_bad");
  std::string good = tfrecord(encode_file_version_event(1.0)) + tfrecord(encode_scalars_event(2.0, 7, {{"x", 1.0}}));
  REQUIRE(parse_tfevents(good).scalars.size() == 1);

  const std::string path = tmp.file("bad.tfevents");
  ag::test::write_bytes(path, good.substr(0, good.size() - 1));
  AG_CHECK_ERROR(read_tfevents(path), "read_tfevents", "bad.tfevents", "truncated record");

  ag::test::write_bytes(path, good + std::string(5, '\0'));
  AG_CHECK_ERROR(read_tfevents(path), "truncated record header", "5 bytes left");

  std::string flipped = good;
  flipped[good.size() - 6] ^= 0x01;  // a data byte of the second record
  ag::test::write_bytes(path, flipped);
  AG_CHECK_ERROR(read_tfevents(path), "data CRC mismatch", "bad.tfevents");

  flipped = good;
  flipped[1] ^= 0x01;  // the first record's length
  AG_CHECK_ERROR(parse_tfevents(flipped, "f"), "length CRC mismatch", "at byte 0");

  // Valid CRCs around a malformed Event: summary (2a) claims 127 bytes but the record ends.
  AG_CHECK_ERROR(parse_tfevents(tfrecord(std::string("\x2a\x7f\x0a", 3)), "f"), "Event.summary", "127 bytes",
                 "runs past");
  // An unfinished varint, and wire type 7 (which does not exist).
  AG_CHECK_ERROR(parse_tfevents(tfrecord(std::string("\x10\x80", 2)), "f"), "varint runs past");
  AG_CHECK_ERROR(parse_tfevents(tfrecord(std::string("\x0f", 1)), "f"), "wire type 7");
  // A known field with the wrong wire type: step (field 2) as fixed64.
  AG_CHECK_ERROR(parse_tfevents(tfrecord(std::string("\x11", 1) + std::string(8, '\0')), "f"), "Event.step",
                 "wire type 1");
  AG_CHECK_ERROR(read_tfevents(tmp.file("missing")), "cannot open", "missing");
  // Unknown fields are skipped: Event field 6 (length-delimited) before the summary.
  TfEvents ev = parse_tfevents(tfrecord(std::string("\x32\x02zz", 4) + encode_scalars_event(3.0, 9, {{"y", 2.0}})));
  REQUIRE(ev.scalars.size() == 1);
  CHECK(ev.scalars[0].step == 9);
}

// ---- JSONL ---------------------------------------------------------------------------------
TEST_CASE("metrics: JSONL lines parse as JSON with the fields, tfevents alongside") {
  TempDir tmp("jsonl");
  std::string jsonl, events;
  {
    MetricsLogger log(tmp.file("run"));
    jsonl = log.jsonl_path(), events = log.tfevents_path();
    log.log(10, {{"train/loss", 1.5}, {"val/accuracy", 0.25}});
    log.log(20, {{"train/loss", std::nan("")}, {"lr", 3e-4}});
  }
  std::ifstream f(jsonl);
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(f, line)) rows.push_back(nlohmann::json::parse(line));  // throws on bad JSON
  REQUIRE(rows.size() == 2);
  CHECK(rows[0]["step"] == 10);
  CHECK(rows[0]["train/loss"] == 1.5);
  CHECK(rows[0]["val/accuracy"] == 0.25);
  CHECK(rows[0]["time"].is_number());
  CHECK(rows[1]["step"] == 20);
  CHECK(rows[1]["train/loss"].is_null());  // NaN is not JSON
  CHECK(rows[1]["lr"] == 3e-4);
  TfEvents ev = read_tfevents(events);
  REQUIRE(ev.scalars.size() == 4);
  CHECK(ev.scalars[3].tag == "lr");
  CHECK(ev.scalars[3].step == 20);
  CHECK(std::isnan(ev.scalars[2].value));  // tfevents keeps the NaN (TensorBoard shows it)

  // Appending keeps the old lines.
  {
    JsonlWriter w(jsonl, /*append=*/true);
    w.write({{"step", 30}, {"note", "x\"y"}});
  }
  std::ifstream g(jsonl);
  int n = 0;
  while (std::getline(g, line)) n += nlohmann::json::parse(line).is_object();
  CHECK(n == 3);
  // A line a killed process left half written: the next process's first line starts on a line
  // of its own, whole.
  {
    std::ofstream cut(jsonl, std::ios::app | std::ios::binary);
    cut << "{\"step\": 40, \"lo";
  }
  {
    JsonlWriter w(jsonl, /*append=*/true);
    w.write({{"step", 50}});
  }
  std::ifstream h(jsonl);
  std::vector<std::string> lines;
  while (std::getline(h, line)) lines.push_back(line);
  REQUIRE(lines.size() == 5);
  CHECK(lines[3] == "{\"step\": 40, \"lo");
  CHECK(nlohmann::json::parse(lines[4]) == nlohmann::json{{"step", 50}});
}

// ---- SVG -----------------------------------------------------------------------------------
TEST_CASE("svg: xml_escape and colormap") {
  CHECK(xml_escape("a<b>&\"c'") == "a&lt;b&gt;&amp;&quot;c&apos;");
  CHECK(xml_escape("\n\t\x01") == "\\n\\t\\x01");
  CHECK(xml_escape("caf\xC3\xA9 \xE2\x86\x92") == "caf\xC3\xA9 \xE2\x86\x92");  // valid UTF-8 passes
  CHECK(xml_escape("\xC3") == "\\xC3");                                         // cut sequence
  CHECK(xml_escape("\xFF" "a") == "\\xFFa");                                    // never valid
  CHECK(xml_escape("\xC0\xAF") == "\\xC0\\xAF");                                // overlong '/'
  CHECK(xml_escape("\xED\xA0\x80") == "\\xED\\xA0\\x80");                       // a surrogate
  CHECK(colormap(0) == "#440154");
  CHECK(colormap(1) == "#fde725");
  CHECK(colormap(-3) == "#440154");
  CHECK(colormap(0.5) == "#21918c");
  CHECK(colormap(0.125) == "#402a70");  // halfway between #440154 and #3b528b: 63.5, 41.5, 111.5 rounded up
}

TEST_CASE("svg: line chart is well-formed, one point per finite value, escaped text") {
  LineChart c;
  c.title = "loss <train & val>";
  c.y_label = "loss";
  c.series.push_back({"train", {0, 100, 200, 300}, {2.0, 1.5, std::nan(""), 1.0}});
  c.series.push_back({"val \"set\"", {100, 300}, {1.8, 1.2}});
  XmlCheck x = check_xml(svg_line_chart(c));
  INFO(x.error);
  REQUIRE(x.ok);
  REQUIRE(x.points.size() == 2);
  CHECK(count_pairs(x.points[0]) == 3);  // the NaN point is left out
  CHECK(count_pairs(x.points[1]) == 2);
  CHECK(x.count["circle.point"] == 5);
  CHECK(x.count["svg"] == 1);
  const std::string svg = svg_line_chart(c);
  CHECK(svg.find("loss &lt;train &amp; val&gt;") != std::string::npos);
  CHECK(svg.find("val &quot;set&quot;") != std::string::npos);
  CHECK(svg.find("http") == svg.find("http://www.w3.org/2000/svg"));  // no other external reference

  // log-y: a non-positive value cannot be drawn; decade ticks appear as text.
  c.log_y = true;
  c.series[0].y = {10.0, 1.0, 0.0, 0.1};
  x = check_xml(svg_line_chart(c));
  REQUIRE(x.ok);
  CHECK(count_pairs(x.points[0]) == 3);
  int decades = 0;
  for (const auto& t : x.texts) decades += t == "0.1" || t == "1" || t == "10";
  CHECK(decades == 3);

  // Nothing drawable yet (first eval): still a valid file with axes.
  LineChart empty;
  empty.series.push_back({"train", {}, {}});
  CHECK(check_xml(svg_line_chart(empty)).ok);

  c.series[1].y.push_back(1.0);
  AG_CHECK_ERROR(svg_line_chart(c), "svg_line_chart", "val \"set\"", "2 x values but 3 y values");
}

TEST_CASE("svg: a log-log chart draws a power law as a straight line, with the ticks asked for") {
  LineChart c;
  c.log_x = c.log_y = true;
  c.x_ticks = {512, 1024, 2048, 4096, 3};  // 3 lies outside the data: no tick
  Series sq{"T^2", {512, 1024, 2048, 4096}, {}};
  for (double t : sq.x) sq.y.push_back(t * t);
  Series ref{"reference", {0, 1024, 4096}, {1.0, 5e6, 2e7}, /*colour=*/0, /*dashed=*/true};  // x = 0 cannot be drawn
  c.series = {sq, ref};
  const std::string svg = svg_line_chart(c);
  XmlCheck x = check_xml(svg);
  INFO(x.error);
  REQUIRE(x.ok);
  REQUIRE(x.points.size() == 2);
  CHECK(count_pairs(x.points[1]) == 2);
  // the four points of T^2: equal steps in x and in y between neighbours
  std::vector<double> v;
  std::istringstream in(x.points[0]);
  for (std::string pair; in >> pair;) {
    const size_t comma = pair.find(',');
    v.push_back(std::stod(pair.substr(0, comma)));
    v.push_back(std::stod(pair.substr(comma + 1)));
  }
  REQUIRE(v.size() == 8);
  for (int i = 1; i < 3; ++i) {
    CHECK(v[2 * (i + 1)] - v[2 * i] == doctest::Approx(v[2] - v[0]).epsilon(0.01));
    CHECK(v[2 * (i + 1) + 1] - v[2 * i + 1] == doctest::Approx(v[3] - v[1]).epsilon(0.01));
  }
  CHECK(v[3] < v[1]);  // growing y goes up the page
  int ticks = 0;
  for (const auto& t : x.texts) ticks += t == "512" || t == "1024" || t == "2048" || t == "4096" || t == "3";
  CHECK(ticks == 4);
  CHECK(svg.find("(log scale)") != std::string::npos);
  // the dashed reference has the first series' colour (palette 0), in the plot and in the legend
  CHECK(svg.find("stroke=\"#1f77b4\" stroke-width=\"1.8\" stroke-linejoin=\"round\" stroke-dasharray") !=
        std::string::npos);
  CHECK(svg.find("stroke=\"#ff7f0e\"") == std::string::npos);  // no series took the second colour
}

TEST_CASE("svg: training curves put one chart per metric in one file") {
  TempDir tmp("curves");
  TrainingCurves curves;
  CHECK(check_xml(curves.svg()).ok);  // before the first evaluation
  for (int step : {100, 200, 300}) curves.add("loss", "train", step, 3.0 / step);
  for (int step : {200, 300}) curves.add("loss", "val", step, 4.0 / step);
  for (int step : {200, 300}) curves.add("accuracy", "val", step, step / 400.0);
  REQUIRE(curves.charts().size() == 2);
  CHECK(curves.charts()[0].log_y);
  CHECK_FALSE(curves.charts()[1].log_y);
  curves.write(tmp.file("curves.svg"));
  XmlCheck x = check_xml(ag::test::read_bytes(tmp.file("curves.svg")));
  INFO(x.error);
  REQUIRE(x.ok);
  CHECK(x.count["svg"] == 3);  // the file and one nested chart per metric
  REQUIRE(x.points.size() == 3);
  CHECK(count_pairs(x.points[0]) == 3);
  CHECK(count_pairs(x.points[1]) == 2);
  CHECK(count_pairs(x.points[2]) == 2);
  AG_CHECK_ERROR(svg_line_charts({}), "svg_line_charts", "no charts");
}

TEST_CASE("svg: heatmaps draw one cell per value with labels on both axes") {
  Heatmap h0;
  h0.title = "head 0";
  h0.rows = 3, h0.cols = 4;
  for (int k = 0; k < 12; ++k) h0.values.push_back(k / 11.0);
  h0.row_labels = {"<b>", "\n", "a_very_long_token_name"};
  h0.col_labels = {"x", "&", " ", "z"};
  Heatmap h1 = h0;
  h1.title = "head 1";
  h1.values[5] = std::nan("");
  const std::string svg = svg_heatmaps({h0, h1}, {.title = "attention", .columns = 2, .max_label = 8});
  XmlCheck x = check_xml(svg);
  INFO(x.error);
  REQUIRE(x.ok);
  CHECK(x.count["rect.cell"] == 24);
  CHECK(x.count["g.panel"] == 2);
  CHECK(x.count["rect.colorbar"] == 1);
  // Labels: escaped, the newline token visible, the long one cut to 8 code points with "…".
  const auto has_text = [&](const std::string& t) {
    return std::find(x.texts.begin(), x.texts.end(), t) != x.texts.end();
  };
  CHECK(has_text("&lt;b&gt;"));
  CHECK(has_text("\\n"));
  CHECK(has_text("a_very_\xE2\x80\xA6"));
  CHECK(has_text("&amp;"));
  CHECK(has_text("\xE2\x90\xA3"));  // a space token is drawn as an open box
  CHECK(svg.find("#bbbbbb") != std::string::npos);  // the NaN cell
  // Value 0 gets the bottom colour and 1 the top one (range from the data).
  CHECK(svg.find("fill=\"#440154\"><title>&lt;b&gt; \xE2\x86\x92 x: 0</title>") != std::string::npos);
  CHECK(svg.find("fill=\"#fde725\"><title>a_very_long_token_name \xE2\x86\x92 z: 1</title>") != std::string::npos);

  // From a transposed (non-contiguous) tensor: values follow the logical layout.
  Tensor m = from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}).mT();  // (2,3): [[1,3,5],[2,4,6]]
  Heatmap hm = heatmap_from_tensor(m, "t");
  CHECK(hm.rows == 2);
  CHECK(hm.cols == 3);
  CHECK(hm.values == std::vector<double>{1, 3, 5, 2, 4, 6});
  CHECK(check_xml(svg_heatmaps({hm})).count["rect.cell"] == 6);

  Heatmap wrong = h0;
  wrong.values.pop_back();
  AG_CHECK_ERROR(svg_heatmaps({h0, wrong}), "svg_heatmaps", "panel 1", "3x4", "11 values");
  wrong = h0;
  wrong.col_labels.pop_back();
  AG_CHECK_ERROR(svg_heatmaps({wrong}), "4 columns but 3 column labels");
  AG_CHECK_ERROR(heatmap_from_tensor(from_vector<float>({1, 2, 3})), "heatmap_from_tensor", "[3]");
}

TEST_CASE("svg: image with a patch-grid overlay") {
  // A 1x4x6 grey image from bytes, a 2x3 patch grid (each patch 2x2 pixels).
  std::vector<uint8_t> px(24);
  for (size_t k = 0; k < px.size(); ++k) px[k] = uint8_t(k * 10);
  Image img = image_from_u8(px.data(), 1, 4, 6);
  CHECK(img.pixels[1] == doctest::Approx(10 / 255.0));
  const std::string svg = svg_image_overlay(img, {0.1, 0.2, 0.3, 0.1, 0.2, 0.1}, 2, 3, {.title = "class token"});
  XmlCheck x = check_xml(svg);
  INFO(x.error);
  REQUIRE(x.ok);
  CHECK(x.count["rect.pixel"] == 2 * 24);  // the plain image and the one under the overlay
  CHECK(x.count["rect.patch"] == 6);
  CHECK(svg.find("fill=\"#000000\"") != std::string::npos);  // pixel 0 is black
  CHECK(svg.find("fill=\"#e6e6e6\"") != std::string::npos);  // 230/255 -> e6

  // RGB from a float tensor [3, 2, 2], normalised by its own range: -1 -> 0, 1 -> 255.
  Tensor t = from_vector<float>({-1, 1, 0, 0, 1, -1, 0, 0, 0, 0, 0, 0}, {3, 2, 2});
  Image rgb = image_from_tensor(t);
  CHECK(rgb.channels == 3);
  const std::string s2 = svg_image_overlay(rgb, {1.0}, 1, 1);
  CHECK(check_xml(s2).count["rect.pixel"] == 8);
  CHECK(s2.find("fill=\"#00ff80\"") != std::string::npos);  // pixel 0: r=-1, g=1, b=0 -> 0, 255, 128

  AG_CHECK_ERROR(svg_image_overlay(img, {1, 2, 3}, 2, 3), "svg_image_overlay", "grid 2x3", "3 values");
  AG_CHECK_ERROR(image_from_u8(px.data(), 2, 4, 3), "image_from_u8", "got 2");
  AG_CHECK_ERROR(image_from_tensor(from_vector<float>({1, 2}, {2, 1, 1})), "image_from_tensor", "[2,1,1]");
}

namespace {
// The numbers of an SVG attribute, in document order, of the elements whose tag starts with `open`.
std::vector<double> attribute_values(const std::string& svg, const std::string& open, const std::string& attr) {
  std::vector<double> out;
  for (size_t p = svg.find(open); p != std::string::npos; p = svg.find(open, p + 1)) {
    const size_t a = svg.find(" " + attr + "=\"", p);
    if (a < svg.find('>', p)) out.push_back(std::stod(svg.substr(a + attr.size() + 3)));
  }
  return out;
}
// "x,y x,y ..." -> the pairs
std::vector<std::pair<double, double>> point_pairs(const std::string& points) {
  std::vector<std::pair<double, double>> out;
  std::istringstream in(points);
  for (std::string xy; in >> xy;) out.emplace_back(std::stod(xy), std::stod(xy.substr(xy.find(',') + 1)));
  return out;
}
}  // namespace

TEST_CASE("svg: a graph puts inputs below their consumers and bends long arrows around the boxes") {
  // a, b leaves; c = f(a, b) on layer 1; d = g(c, a) on layer 2: the arrow a -> d spans two layers.
  const std::vector<GraphBox> g = {{{"a", "[2]"}, true, {}},
                                   {{"b"}, true, {}},
                                   {{"f #0", "[2] f64 cpu"}, false, {0, 1}},
                                   {{"g #1", "<&>"}, false, {2, 0}}};
  const std::string svg = svg_graph(g, "a & b");
  XmlCheck x = check_xml(svg);
  INFO(x.error);
  REQUIRE(x.ok);
  CHECK(x.count["ellipse.leaf"] == 2);
  CHECK(x.count["rect.op"] == 2);
  CHECK(x.count["polyline.edge"] == 4);
  REQUIRE(x.points.size() == 4);
  // edges in the order of the boxes' inputs: a->f, b->f, f->g, a->g; only a->g has a waypoint
  CHECK(point_pairs(x.points[0]).size() == 2);
  CHECK(point_pairs(x.points[1]).size() == 2);
  CHECK(point_pairs(x.points[2]).size() == 2);
  CHECK(point_pairs(x.points[3]).size() == 3);
  for (const std::string& pts : x.points) {  // every arrow runs upwards, input to consumer
    const auto xy = point_pairs(pts);
    for (size_t k = 1; k < xy.size(); ++k) CHECK(xy[k].second < xy[k - 1].second);
  }
  // the waypoint of a->g lies beside f's box on f's layer, not through it
  const std::vector<double> rx = attribute_values(svg, "<rect class=\"op\"", "x");
  const std::vector<double> rw = attribute_values(svg, "<rect class=\"op\"", "width");
  const std::vector<double> ry = attribute_values(svg, "<rect class=\"op\"", "y");
  REQUIRE(rx.size() == 2);
  const std::vector<double> rh = attribute_values(svg, "<rect class=\"op\"", "height");
  const auto way = point_pairs(x.points[3])[1];
  CHECK(way.second == doctest::Approx(ry[0] + rh[0] / 2));
  CHECK((way.first < rx[0] || way.first > rx[0] + rw[0]));
  CHECK(ry[1] < ry[0]);  // g above f
  // the leaves sit below f, the layer under their lowest consumer
  const std::vector<double> ey = attribute_values(svg, "<ellipse class=\"leaf\"", "cy");
  REQUIRE(ey.size() == 2);
  CHECK(ey[0] == ey[1]);
  CHECK(ey[0] > ry[0] + rh[0]);
  // labels, escaped; the first line of a box in bold
  CHECK(svg.find("font-weight=\"bold\">f #0</text>") != std::string::npos);
  CHECK(svg.find(">&lt;&amp;&gt;</text>") != std::string::npos);
  CHECK(svg.find(">a &amp; b</text>") != std::string::npos);

  AG_CHECK_ERROR(svg_graph({{{"x"}, false, {0}}}), "svg_graph", "box 0 reads box 0");
  AG_CHECK_ERROR(svg_graph({{{"x"}, true, {}}, {{"y"}, false, {5}}}), "box 1 reads box 5");
}

TEST_CASE("svg: svg_tape draws the tape of graph_entries with graph_to_dot's labels") {
  // L = sum((x * w)^2), x = [1, 2, 3], w = [0.5, -1, 2]: x.grad = 2 x w^2 = [0.5, 4, 24]
  Tensor x = from_vector<double>({1, 2, 3}, {3}).set_requires_grad(true);
  Tensor w = from_vector<double>({0.5, -1, 2}, {3}).set_requires_grad(true);
  Tensor L = sum(pow(mul(x, w), 2.0));
  {
    TrackGradNormsGuard track;
    L.backward();
  }
  const std::string svg = svg_tape(L, {{"x", x}, {"w", w}}, "tape");
  XmlCheck c = check_xml(svg);
  INFO(c.error);
  REQUIRE(c.ok);
  CHECK(c.count["ellipse.leaf"] == 2);
  CHECK(c.count["rect.op"] == 3);
  CHECK(c.count["polyline.edge"] == 4);
  CHECK(svg.find(">|.grad| 24.3362</text>") != std::string::npos);  // |x.grad| = sqrt 592.25
  CHECK(svg.find(">|grad| 1.73205</text>") != std::string::npos);   // pow's output gradient: ones(3)
  CHECK(svg.find(">mul #") != std::string::npos);
  CHECK(svg.find("font-weight=\"bold\">x</text>") != std::string::npos);
}

TEST_CASE("svg: write_file_atomic replaces the file and leaves no temporary behind") {
  TempDir tmp("atomic");
  const std::string path = tmp.file("plot.svg");
  write_file_atomic(path, "first");
  write_file_atomic(path, "second");
  CHECK(ag::test::read_bytes(path) == "second");
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp.dir)) ++files, (void)e;
  CHECK(files == 1);
  AG_CHECK_ERROR(write_file_atomic(tmp.file("no/such/dir/x.svg"), "x"), "write_file_atomic", "no/such/dir");
}

// ---- report --------------------------------------------------------------------------------
TEST_CASE("report: human formatting of durations, sizes, counts and rates") {
  CHECK(format_duration(3725) == "1:02:05");  // 1 h, 2 min, 5 s
  CHECK(format_duration(65) == "1:05");
  CHECK(format_duration(5) == "0:05");
  CHECK(format_duration(59.6) == "1:00");     // rounds to whole seconds
  CHECK(format_duration(360000) == "100:00:00");
  CHECK(format_duration(-1) == "--:--");
  CHECK(format_duration(std::nan("")) == "--:--");
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_bytes(3.0 * (1 << 30)) == "3.0 GiB");
  CHECK(format_count(999) == "999");
  CHECK(format_count(1234) == "1.23k");
  CHECK(format_count(12345678) == "12.3M");
  CHECK(format_count(999999) == "1.00M");  // not "1000k"
  CHECK(format_count(2.5) == "2.5");
  CHECK(format_rate(12.34) == "12.3 it/s");
  CHECK(format_rate(45678, "tok") == "45.7k tok/s");
  CHECK(format_rate(0.4) == "2.50 s/it");
  CHECK(format_rate(0) == "? it/s");
  CHECK(truncate_label("abcdef", 4) == "abc\xE2\x80\xA6");
  CHECK(truncate_label("\xC3\xA9\xC3\xA9\xC3\xA9", 2) == "\xC3\xA9\xE2\x80\xA6");  // cut between code points
  CHECK(truncate_label("abc", 3) == "abc");
  CHECK(peak_rss_bytes() > 1024 * 1024);  // this test binary holds more than 1 MiB
}

TEST_CASE("report: confusion matrix numbers") {
  // truth: 0 0 0 1 1 2     pred: 0 0 1 1 2 2
  //   counts: row 0 = [2 1 0], row 1 = [0 1 1], row 2 = [0 0 1]; correct = 2 + 1 + 1 = 4 of 6
  //   recall    class 0: 2/3, class 1: 1/2, class 2: 1/1
  //   precision class 0: 2/2, class 1: 1/2, class 2: 1/2
  //   f1 class 0: 2 (1)(2/3) / (5/3) = 0.8, class 1: 0.5, class 2: 2 (1/2)(1) / (3/2) = 2/3
  ConfusionMatrix cm({"cat", "dog", "bird"});
  cm.add({0, 0, 0, 1, 1, 2}, {0, 0, 1, 1, 2, 2});
  CHECK(cm.at(0, 0) == 2);
  CHECK(cm.at(0, 1) == 1);
  CHECK(cm.at(1, 2) == 1);
  CHECK(cm.at(2, 0) == 0);
  CHECK(cm.total() == 6);
  CHECK(cm.correct() == 4);
  CHECK(cm.accuracy() == doctest::Approx(4.0 / 6));
  CHECK(cm.recall(0) == doctest::Approx(2.0 / 3));
  CHECK(cm.precision(2) == doctest::Approx(0.5));
  CHECK(cm.f1(0) == doctest::Approx(0.8));
  CHECK(cm.f1(2) == doctest::Approx(2.0 / 3));
  CHECK(cm.macro_f1() == doctest::Approx((0.8 + 0.5 + 2.0 / 3) / 3));
  const std::string text = cm.to_text();
  CHECK(text.find("accuracy 66.7%") != std::string::npos);
  CHECK(text.find(" cat    2    1    0    66.7%    100.0%") != std::string::npos);
  nlohmann::json j = cm.to_json();
  CHECK(j["counts"][1] == nlohmann::json({0, 1, 1}));
  CHECK(j["labels"][2] == "bird");

  ConfusionMatrix empty(2);
  CHECK(std::isnan(empty.accuracy()));
  CHECK(std::isnan(empty.recall(0)));
  AG_CHECK_ERROR(cm.add(3, 0), "ConfusionMatrix::add", "[0, 3)", "truth 3");
  AG_CHECK_ERROR(cm.add(std::vector<int64_t>{0, 1}, std::vector<int64_t>{0}), "2 labels but 1 predictions");
  AG_CHECK_ERROR(ConfusionMatrix(0), "ConfusionMatrix", "got 0");
}

TEST_CASE("report: run report text and JSON") {
  RunReport r;
  r.app = "gpt";
  r.wall_seconds = 3725;
  r.train_seconds = 100;
  r.steps = 500;
  r.parameters = 1234567;
  r.samples = 6400;   // 64 samples/s over 100 s
  r.tokens = 819200;  // 8192 tok/s
  r.peak_rss_bytes = int64_t(1536) << 20;
  r.peak_tensor_bytes = int64_t(3) << 20;
  r.accuracy = 0.875;
  r.extra = {{"val_loss", 1.25}};
  CHECK(r.to_text().find("device: cpu, fp32") != std::string::npos);  // the defaults
  r.device = "cuda:1";
  r.precision = "bf16";
  const std::string text = r.to_text();
  for (const char* want : {"device: cuda:1, bf16 autocast", "wall time: 1:02:05", "parameters: 1234567 (1.23M)", "throughput: 64 samples/s",
                           "token throughput: 8.19k tok/s", "peak memory (RSS): 1.5 GiB",
                           "peak tensor memory: 3.0 MiB", "accuracy: 87.50%",
                           "val_loss: 1.25"}) {
    INFO(want);
    CHECK(text.find(want) != std::string::npos);
  }
  nlohmann::json j = r.to_json();
  CHECK(j["samples_per_second"] == 64.0);
  CHECK(j["tokens_per_second"] == 8192.0);
  CHECK(j["accuracy"] == 0.875);
  CHECK(j["val_loss"] == 1.25);
  CHECK(j["device"] == "cuda:1");
  CHECK(j["precision"] == "bf16");
  CHECK_FALSE(j.contains("confusion"));
  r.confusion = ConfusionMatrix(2);
  r.confusion->add(1, 1);
  CHECK(r.to_json()["confusion"]["correct"] == 1);
  CHECK(r.to_text().find("confusion matrix") != std::string::npos);
}

// ---- progress bar --------------------------------------------------------------------------
TEST_CASE("progress: format_progress shows step, percent, bar, rate, ETA and fields") {
  // 250 of 1000 at 10 it/s: 750 steps left -> 75 s = 1:15; 25 s elapsed.
  ProgressState s{"train", 250, 1000, 10.0, 25.0, {{"loss", 2.34567}, {"lr", 3e-4}}};
  CHECK(format_progress(s, 8) == "train   250/1000   25.0% |##      |  10 it/s  0:25<1:15  loss 2.346  lr 0.0003");
  CHECK(format_progress(s, 0) == "train   250/1000   25.0%  10 it/s  0:25<1:15  loss 2.346  lr 0.0003");
  // Unknown rate: no ETA yet. Unknown total: the count alone.
  s.rate = 0;
  CHECK(format_progress(s, 0).find("? it/s  0:25<--:--") != std::string::npos);
  ProgressState open{"", 42, 0, 2.0, 21.0, {}};
  CHECK(format_progress(open) == "42  2 it/s  0:21<--:--");
}

TEST_CASE("progress: plain lines every N steps off a terminal, throttled redraws on one") {
  double now = 0;
  auto clock = [&] { return now; };
  {
    std::FILE* f = std::tmpfile();
    REQUIRE(f);
    ProgressBar bar(100, {.label = "t", .log_every = 10, .log_seconds = 1e9, .tty = 0, .out = f, .clock = clock});
    for (int step = 1; step <= 100; ++step) {
      now += 0.1;
      bar.update(step, {{"loss", 1.0 / step}});
    }
    CHECK(bar.rate() == doctest::Approx(10.0));
    bar.finish();
    const std::string out = read_stream(f);
    std::fclose(f);
    CHECK(std::count(out.begin(), out.end(), '\n') == 11);  // step 1 (the first), then 10, 20, ..., 100
    CHECK(out.rfind("t    1/100 ", 0) == 0);
    CHECK(out.find('\r') == std::string::npos);
    // Step 50 at 10 it/s: 5 s elapsed, 50 steps (5 s) left.
    CHECK(out.find("t   50/100   50.0%  10 it/s  0:05<0:05  loss 0.02\n") != std::string::npos);
  }
  {
    // Off a terminal, time also triggers a line: every 1 s at 0.3 s per step.
    now = 0;
    std::FILE* f = std::tmpfile();
    ProgressBar bar(1000, {.log_every = 1000, .log_seconds = 1.0, .tty = 0, .out = f, .clock = clock});
    for (int step = 1; step <= 10; ++step) now += 0.3, bar.update(step);
    bar.finish();
    const std::string out = read_stream(f);
    std::fclose(f);
    // lines at t = 0.3 (first), 1.5, 2.7, then the finish line at step 10 (t = 3.0)
    CHECK(std::count(out.begin(), out.end(), '\n') == 4);
  }
  {
    now = 0;
    std::FILE* f = std::tmpfile();
    ProgressBar bar(100, {.redraw_seconds = 0.1, .tty = 1, .out = f, .clock = clock});
    CHECK(bar.is_terminal());
    for (int step = 1; step <= 100; ++step) {
      now += 0.01;  // 100 updates in 1 s: about 10 redraws, not 100
      bar.update(step);
      if (step == 50) bar.print("eval: ok");
    }
    bar.finish();
    const std::string out = read_stream(f);
    std::fclose(f);
    const auto redraws = std::count(out.begin(), out.end(), '\r');
    CHECK(redraws >= 10);
    CHECK(redraws <= 14);
    CHECK(out.find("\r\x1b[Keval: ok\n") != std::string::npos);  // the message on its own line
    CHECK(std::count(out.begin(), out.end(), '\n') == 2);         // the message and the final newline
    CHECK(out.find("100/100  100.0%") != std::string::npos);       // the last step is always drawn
  }
}

// ---- stop flag -----------------------------------------------------------------------------
TEST_CASE("signal: SIGINT sets the stop flag instead of killing the process") {
  struct sigaction before {};
  sigaction(SIGINT, nullptr, &before);
  clear_stop_request();
  {
    StopGuard guard;
    CHECK_FALSE(stop_requested());
    // The first one only sets the flag (the second, which exits, is the next test). Its message
    // to stderr is sent to /dev/null for the moment.
    const int saved = dup(STDERR_FILENO), devnull = open("/dev/null", O_WRONLY);
    REQUIRE(saved >= 0);
    REQUIRE(devnull >= 0);
    dup2(devnull, STDERR_FILENO);
    std::raise(SIGINT);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(devnull);
    CHECK(stop_requested());
    CHECK(stop_signal() == SIGINT);
    clear_stop_request();
    CHECK_FALSE(stop_requested());
  }
  struct sigaction after {};
  sigaction(SIGINT, nullptr, &after);
  const bool same_handler = after.sa_handler == before.sa_handler;
  CHECK(same_handler);  // the guard restored the old handler
}

TEST_CASE("signal: a second SIGINT exits at once with status 128 + SIGINT") {
  // In a child process: fork() copies only the calling thread, and the child calls only
  // async-signal-safe functions before _exit.
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, STDERR_FILENO);  // keep the handler's messages out of the test log
    install_stop_handlers();
    raise(SIGINT);
    if (!stop_requested()) _exit(1);
    raise(SIGINT);
    _exit(2);  // not reached when the second signal exits
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGINT);
}
