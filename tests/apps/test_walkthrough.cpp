// apps/walkthrough as a user runs it: the binary (ATTOGRAD_APP_DIR) spawned, its output read.
//   - every gradient's check passes (autograd == formula == finite differences), and so do the
//     softmax row sums, the row identity D = rowsum(dO * O) = rowsum(dP * P) and the
//     fused-attention comparison; exit 0
//   - each option (--causal, --padding N, --cross, --kv-cache, and their combinations) passes every
//     check and prints what it adds: the mask, the masked scores, the shapes of cross-attention,
//     the KV cache growing; the numbers printed are parsed back and checked here: the mask is the
//     rule of docs/math/attention.md (the program's checks could not catch a wrong one: finite
//     differences agree with whatever forward they get), hidden keys have score -inf and weight 0,
//     D equals rowsum(dP * P) recomputed from the printed P and dP, and the tokens decoded with
//     the KV cache equal the full causal pass
//   - a --padding outside [0, Tk - 1], and --cross with --kv-cache or --causal, exit 2 with one
//     line naming the option
//   - <out>/scaling.svg holds its three charts and eight series
//   - the table backs the articles' claim: with 1/sqrt(d_k) the mean max softmax weight stays
//     about flat over d_k = 16..1024, and so do the gradient norms; without it the weights approach
//     one-hot and a typical query's gradient (the median |dQ_i|) collapses
//   - --no-experiment writes nothing, --precision sets the decimals, a bad value exits 2
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/ranges.h>

#include "tests/helpers.h"

extern char** environ;

using namespace ag;
using namespace ag::test;
namespace fs = std::filesystem;

namespace {

struct Result {
  int rc = -1;  // the exit code, 128 + signal, or -1 when it ran past the timeout (then killed)
  std::string output;  // stdout and stderr
};

// Runs the walkthrough with `args`, stdout and stderr into one file of `dir`.
Result run_walkthrough(const std::vector<std::string>& args, const TempDir& dir, double timeout_s = 120) {
  std::vector<std::string> argv_s = {std::string(ATTOGRAD_APP_DIR) + "/walkthrough"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  const std::string log = dir.file("output.txt");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int err = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE_MESSAGE(err == 0, "cannot spawn ", argv_s[0], ": ", std::strerror(err));
  Result r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int status = 0;
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w < 0) FAIL("waitpid: ", std::strerror(errno));
    if (w == pid) {
      r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.output = read_bytes(log);
  return r;
}

// One full run (walkthrough and experiment), shared by the cases below.
struct FullRun {
  TempDir dir{"walkthrough"};
  std::string out = dir.file("run");
  Result result = run_walkthrough({"--out", out, "--seed", "3"}, dir);
};
const FullRun& full_run() {
  static FullRun run;
  return run;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + what.size())) ++n;
  return n;
}

// The experiment's table: the rows after the header line that starts with "d_k", up to the first
// line that is not one.
struct Row {
  double dk, score_std, maxw_scaled, maxw_unscaled, dq_scaled, dq_unscaled, dk_scaled, dk_unscaled, dq_median_scaled,
      dq_median_unscaled;
};
std::vector<Row> parse_table(const std::string& output) {
  std::vector<Row> rows;
  std::istringstream in(output);
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (!in_table) {
      std::string first;
      std::istringstream(line) >> first;
      in_table = first == "d_k";
      continue;
    }
    Row r{};
    std::istringstream rs(line);
    if (!(rs >> r.dk >> r.score_std >> r.maxw_scaled >> r.maxw_unscaled >> r.dq_scaled >> r.dq_unscaled >>
          r.dk_scaled >> r.dk_unscaled >> r.dq_median_scaled >> r.dq_median_unscaled))
      break;
    rows.push_back(r);
  }
  return rows;
}

// The numbers of a line, or none when the line holds anything else.
std::vector<double> numbers(const std::string& line) {
  std::vector<double> v;
  const char* p = line.c_str();
  for (char* end = nullptr;; p = end) {
    const double x = std::strtod(p, &end);
    if (end == p) break;
    v.push_back(x);
  }
  while (*p == ' ') ++p;
  return *p == '\0' ? v : std::vector<double>();
}

// The values printed below the first line that starts with `header` (a tensor, or the mask),
// row after row, the "head h" lines skipped, up to the first line that is not numbers.
std::vector<double> values_after(const std::string& output, const std::string& header) {
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(header, 0) == 0) break;
  std::vector<double> values;
  while (std::getline(in, line)) {
    if (line.rfind("  head ", 0) == 0) continue;
    const std::vector<double> row = numbers(line);
    if (row.empty()) break;
    values.insert(values.end(), row.begin(), row.end());
  }
  return values;
}

// The rows of the table of backward step 2: head, row, D = rowsum(dO * O), rowsum(dP * P), |diff|.
std::vector<std::vector<double>> d_table(const std::string& output) {
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("head  row", 0) == 0) break;
  std::vector<std::vector<double>> rows;
  while (std::getline(in, line)) {
    std::vector<double> row = numbers(line);
    if (row.size() != 5) break;
    rows.push_back(std::move(row));
  }
  return rows;
}

// The walkthrough alone, with `options`, 12 decimals so that printed values can be recomputed.
Result run_options(const std::vector<std::string>& options) {
  TempDir dir("walkthrough_case");
  std::vector<std::string> args = {"--no-experiment", "--precision", "12"};
  args.insert(args.end(), options.begin(), options.end());
  return run_walkthrough(args, dir);
}

// Exit 0, `n` checks, each PASS.
void check_all_pass(const Result& r, int n) {
  CHECK(r.rc == 0);
  CHECK(count(r.output, "\nPASS ") == size_t(n));
  CHECK(r.output.find("FAIL") == std::string::npos);
  CHECK(r.output.find(fmt::format("{} checks passed, 0 failed", n)) != std::string::npos);
}

// The table of backward step 2 against the printed P and dP: one row per head and query, its two
// columns equal, and D_i = sum_j P_ij dP_ij recomputed here from the matrices as printed.
void check_row_identity(const std::string& out, int64_t H, int64_t Tq, int64_t Tk) {
  const std::vector<std::vector<double>> table = d_table(out);
  const std::vector<double> P = values_after(out, "P = softmax("), dP = values_after(out, "dP (dWeights) [");
  REQUIRE(table.size() == size_t(H * Tq));
  REQUIRE(P.size() == size_t(H * Tq * Tk));
  REQUIRE(dP.size() == P.size());
  CHECK(out.find("PASS D = rowsum(dO * O) equals rowsum(dP * P): ") != std::string::npos);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < Tq; ++i) {
      const std::vector<double>& row = table[size_t(h * Tq + i)];
      CAPTURE(h);
      CAPTURE(i);
      CHECK(row[0] == double(h));
      CHECK(row[1] == double(i));
      CHECK(std::abs(row[2] - row[3]) <= 1e-14);
      double rowsum = 0;  // the values carry 12 decimals: Tk products of rounded numbers
      for (int64_t j = 0; j < Tk; ++j) rowsum += P[size_t((h * Tq + i) * Tk + j)] * dP[size_t((h * Tq + i) * Tk + j)];
      CHECK(std::abs(row[2] - rowsum) <= 1e-10);
    }
}

// The mask printed (1 = seen, 0 = hidden) equals `hidden`; the masked scores are -inf exactly
// there and Z elsewhere, and the weights 0 there.
void check_mask(const std::string& out, int64_t H, int64_t Tq, int64_t Tk, auto hidden) {
  const std::vector<double> mask = values_after(out, fmt::format("mask [{},{}]", Tq, Tk));
  const std::vector<double> Z = values_after(out, "Z = S / sqrt(hs)"), Zm = values_after(out, "Z masked ["),
                            P = values_after(out, "P = softmax(Z masked) over the keys [");
  REQUIRE(mask.size() == size_t(Tq * Tk));
  REQUIRE(Z.size() == size_t(H * Tq * Tk));
  REQUIRE(Zm.size() == Z.size());
  REQUIRE(P.size() == Z.size());
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t j = 0; j < Tk; ++j) {
      CAPTURE(i);
      CAPTURE(j);
      CHECK(mask[size_t(i * Tk + j)] == (hidden(i, j) ? 0.0 : 1.0));
      for (int64_t h = 0; h < H; ++h) {
        const size_t at = size_t((h * Tq + i) * Tk + j);
        if (hidden(i, j)) {
          CHECK(Zm[at] == -INFINITY);
          CHECK(P[at] == 0.0);
        } else {
          CHECK(Zm[at] == Z[at]);
          CHECK(P[at] > 0.0);
        }
      }
    }
}

void check_fused_and_grads(const std::string& out, bool cross) {
  std::vector<std::string> names = {"dOut", "dWo", "dC", "dO_h", "dP (dWeights)", "dV", "dZ", "dS (dScores)", "dQ",
                                    "dK", "dWq", "dWk", "dWv", "dX", "softmax rows sum to 1",
                                    "fused attention output", "fused attention gradients"};
  if (cross) names.push_back("dY");
  for (const std::string& name : names)
    CHECK_MESSAGE(out.find(fmt::format("\nPASS {}: ", name)) != std::string::npos, "no PASS line for ", name);
}

}  // namespace

TEST_CASE("walkthrough: every gradient matches its formula and finite differences, exit 0") {
  const FullRun& run = full_run();
  INFO("output:\n" << run.result.output);
  REQUIRE(run.result.rc == 0);
  const std::string& out = run.result.output;
  for (const char* name : {"dOut", "dWo", "dC", "dO_h", "dP (dWeights)", "dV", "dZ", "dS (dScores)", "dQ", "dK",
                           "dWq", "dWk", "dWv", "dX", "softmax rows sum to 1", "fused attention output",
                           "fused attention gradients", "D = rowsum(dO * O) equals rowsum(dP * P)"})
    CHECK_MESSAGE(out.find(fmt::format("PASS {}: ", name)) != std::string::npos, "no PASS line for ", name);
  CHECK(count(out, "\nPASS ") == 18);  // one line each
  CHECK(out.find("FAIL") == std::string::npos);
  CHECK(out.find("18 checks passed, 0 failed") != std::string::npos);
  // no mask without --causal or --padding
  CHECK(out.find("mask [") == std::string::npos);
  CHECK(out.find("Z masked") == std::string::npos);
  // the forward is printed step by step, each with its shape
  for (const char* step : {"X [4,8]", "Q = X Wq [4,8]", "S = Q_h K_h^T [2,4,4]", "P = softmax(Z) over the keys [2,4,4]",
                           "O_h = P V_h [2,4,4]", "Out = C Wo [4,8]", "L = mean((Out - Target)^2) []"})
    CHECK_MESSAGE(out.find(step) != std::string::npos, "missing step ", step);
}

TEST_CASE("walkthrough: scaling.svg holds the scaled and unscaled series") {
  const FullRun& run = full_run();
  REQUIRE(run.result.rc == 0);
  const std::string svg_path = run.out + "/scaling.svg";
  REQUIRE(fs::exists(svg_path));
  const std::string svg = read_bytes(svg_path);
  CHECK(svg.find("<svg") != std::string::npos);
  CHECK(svg.find("</svg>") != std::string::npos);
  // three charts: max weight (scaled, unscaled), gradient norms (dQ and dK of each), a typical
  // query's gradient (scaled, unscaled); a point per d_k = 16 .. 1024
  CHECK(count(svg, "<polyline class=\"series\"") == 8);
  CHECK(count(svg, "<circle class=\"point\"") == 8 * 7);
  for (const char* name : {">scaled 1/sqrt(d_k)<", ">unscaled<", ">|dQ| scaled<", ">|dK| scaled<", ">|dQ| unscaled<",
                           ">|dK| unscaled<", "Mean max softmax weight", "Gradient norm reaching Q and K",
                           "Gradient of a typical query"})
    CHECK_MESSAGE(svg.find(name) != std::string::npos, "missing ", name);
}

TEST_CASE("walkthrough: scaled weights stay spread over d_k, unscaled ones go one-hot and most queries lose their gradient") {
  const FullRun& run = full_run();
  REQUIRE(run.result.rc == 0);
  INFO("output:\n" << run.result.output);
  const std::vector<Row> rows = parse_table(run.result.output);
  REQUIRE(rows.size() == 7);
  const Row &first = rows.front(), &last = rows.back();
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    CAPTURE(r.dk);
    CHECK(r.dk == double(16 << i));
    // q . k sums d_k products of unit variance: its standard deviation is sqrt(d_k)
    CHECK(r.score_std == doctest::Approx(std::sqrt(r.dk)).epsilon(0.15));
    // scaled: unit-variance scores over 64 keys whatever d_k; the largest weight is ~0.1, the
    // gradient of the whole and of a typical query about constant
    CHECK(r.maxw_scaled > 0.05);
    CHECK(r.maxw_scaled < 0.2);
    CHECK(r.maxw_scaled == doctest::Approx(first.maxw_scaled).epsilon(0.25));
    CHECK(r.dq_scaled == doctest::Approx(first.dq_scaled).epsilon(0.3));
    CHECK(r.dk_scaled == doctest::Approx(first.dk_scaled).epsilon(0.3));
    CHECK(r.dq_median_scaled == doctest::Approx(first.dq_median_scaled).epsilon(0.3));
    // unscaled: more peaked than scaled at every d_k, and more so as d_k grows (up to noise)
    CHECK(r.maxw_unscaled > r.maxw_scaled + 0.3);
    if (i > 0) CHECK(r.maxw_unscaled >= rows[i - 1].maxw_unscaled - 0.02);
  }
  // unscaled: near one-hot at d_k = 1024 (scores of standard deviation 32)
  CHECK(last.maxw_unscaled > 0.9);
  CHECK(last.maxw_unscaled > first.maxw_unscaled + 0.3);
  // a typical query's gradient collapses, while the few unsaturated rows make the whole norm grow
  CHECK(last.dq_median_unscaled < 0.1 * last.dq_median_scaled);
  CHECK(last.dq_median_unscaled < 0.1 * first.dq_median_unscaled);
  CHECK(last.dq_unscaled > 2 * first.dq_unscaled);
}

TEST_CASE("walkthrough: --no-experiment writes nothing, --precision sets the decimals, a bad value exits 2") {
  TempDir dir("walkthrough_opts");
  const std::string out = dir.file("run");
  const Result r = run_walkthrough({"--out", out, "--no-experiment", "--precision", "7"}, dir);
  INFO("output:\n" << r.output);
  CHECK(r.rc == 0);
  CHECK_FALSE(fs::exists(out));
  CHECK(r.output.find("why divide by sqrt(d_k)") == std::string::npos);
  CHECK(r.output.find("plot:") == std::string::npos);
  CHECK(r.output.find("0 failed") != std::string::npos);
  // the loss is printed alone on its line, with 7 decimals
  const size_t at = r.output.find("L = mean((Out - Target)^2)");
  REQUIRE(at != std::string::npos);
  const size_t line = r.output.find('\n', at) + 1;
  const std::string value = r.output.substr(line, r.output.find('\n', line) - line);
  CHECK(value.size() - value.find('.') - 1 == 7);

  const Result bad = run_walkthrough({"--precision", "0"}, dir);
  CHECK(bad.rc == 2);
  CHECK(bad.output.find("walkthrough:") == 0);
  CHECK(bad.output.find("--precision") != std::string::npos);
  CHECK(bad.output.find("--help") != std::string::npos);
}

TEST_CASE("walkthrough: --causal prints the mask and the masked scores, every check passes") {
  const Result r = run_options({"--causal"});
  INFO("output:\n" << r.output);
  check_all_pass(r, 19);  // the 18 of the plain run and "hidden keys get weight 0"
  check_fused_and_grads(r.output, false);
  CHECK(r.output.find("causal self-attention, T = 4 tokens") != std::string::npos);
  CHECK(r.output.find("PASS hidden keys get weight 0: ") != std::string::npos);
  CHECK(r.output.find("scaled_dot_product_attention(Q_h, K_h, V_h, {causal = true})") != std::string::npos);
  check_mask(r.output, 2, 4, 4, [](int64_t i, int64_t j) { return j > i; });
  check_row_identity(r.output, 2, 4, 4);
}

TEST_CASE("walkthrough: --padding hides the last keys from every query, alone and with --causal") {
  {
    const Result r = run_options({"--padding", "1"});
    INFO("output:\n" << r.output);
    check_all_pass(r, 19);
    check_fused_and_grads(r.output, false);
    CHECK(r.output.find("key 3 of 4 padding") != std::string::npos);
    CHECK(r.output.find("{key_padding_lengths = [3]}") != std::string::npos);
    check_mask(r.output, 2, 4, 4, [](int64_t, int64_t j) { return j >= 3; });
    check_row_identity(r.output, 2, 4, 4);
  }
  {
    const Result r = run_options({"--causal", "--padding", "2"});
    INFO("output:\n" << r.output);
    check_all_pass(r, 19);
    CHECK(r.output.find("{causal = true, key_padding_lengths = [2]}") != std::string::npos);
    check_mask(r.output, 2, 4, 4, [](int64_t i, int64_t j) { return j > i || j >= 2; });
    check_row_identity(r.output, 2, 4, 4);
  }
}

TEST_CASE("walkthrough: --cross takes keys and values from Y of 6 tokens and checks dX and dY") {
  {
    const Result r = run_options({"--cross"});
    INFO("output:\n" << r.output);
    check_all_pass(r, 19);  // the 18 of the plain run and dY
    check_fused_and_grads(r.output, true);
    for (const char* line : {"shapes: X (Tq, D) = [4,8] gives the queries, Y (Tk, D) = [6,8] the keys and values",
                             "S, Z, P are (H, Tq, Tk) = [2,4,6]", "Y [6,8]", "Q = X Wq [4,8]", "K = Y Wk [6,8]",
                             "V = Y Wv [6,8]", "S = Q_h K_h^T [2,4,6]", "P = softmax(Z) over the keys [2,4,6]",
                             "O_h = P V_h [2,4,4]", "Out = C Wo [4,8]", "dX [4,8]  X feeds Q only",
                             "dY [6,8]  Y feeds K and V", "over dX, dY, dWq, dWk, dWv, dWo"})
      CHECK_MESSAGE(r.output.find(line) != std::string::npos, "missing ", line);
    CHECK(r.output.find("mask [") == std::string::npos);
    check_row_identity(r.output, 2, 4, 6);
  }
  {
    const Result r = run_options({"--cross", "--padding", "2"});
    INFO("output:\n" << r.output);
    check_all_pass(r, 20);  // and "hidden keys get weight 0"
    check_fused_and_grads(r.output, true);
    check_mask(r.output, 2, 4, 6, [](int64_t, int64_t j) { return j >= 4; });
    check_row_identity(r.output, 2, 4, 6);
  }
}

TEST_CASE("walkthrough: --kv-cache decodes token by token and equals the full causal pass") {
  for (const std::vector<std::string>& options : {std::vector<std::string>{"--kv-cache"},
                                                  std::vector<std::string>{"--kv-cache", "--padding", "1"}}) {
    const Result r = run_options(options);
    const bool padded = options.size() > 1;
    INFO("options: " << fmt::format("{}", fmt::join(options, " ")) << "\noutput:\n" << r.output);
    check_all_pass(r, 20);  // the 19 of --causal and the decoding's
    check_fused_and_grads(r.output, false);
    CHECK(r.output.find("PASS KV-cache decoding equals the full causal pass: ") != std::string::npos);
    // the full pass is causal, and checked as --causal's
    check_mask(r.output, 2, 4, 4, [&](int64_t i, int64_t j) { return j > i || (padded && j >= 3); });
    check_row_identity(r.output, 2, 4, 4);
    // the cache grows by one position per token
    for (int t = 0; t < 4; ++t) {
      CHECK(r.output.find(fmt::format("step {}: token {} in, cache length {}: K, V [1,2,{},4]", t, t, t + 1, t + 1)) !=
            std::string::npos);
      CHECK(values_after(r.output, fmt::format("K cache after step {} [2,{},4]", t, t + 1)).size() == size_t(2 * (t + 1) * 4));
    }
    CHECK((r.output.find("key 3 hidden: padding") != std::string::npos) == padded);
    // the decoded rows, as printed, equal the full pass's Out, as printed (12 decimals)
    const std::vector<double> decoded = values_after(r.output, "Out, decoded token by token [4,8]"),
                              full = values_after(r.output, "Out = C Wo [4,8]");
    REQUIRE(decoded.size() == 32);
    REQUIRE(full.size() == 32);
    for (size_t k = 0; k < full.size(); ++k) CHECK(std::abs(decoded[k] - full[k]) <= 2e-12);
    // and each step's row is the matching row of the stack
    for (int t = 0; t < 4; ++t) {
      const std::vector<double> row = values_after(r.output, fmt::format("Out row {} [1,8]", t));
      REQUIRE(row.size() == 8);
      for (size_t c = 0; c < 8; ++c) CHECK(row[c] == decoded[size_t(t) * 8 + c]);
    }
  }
}

TEST_CASE("walkthrough: the row identity of backward step 2 holds with every combination of options") {
  const std::vector<std::vector<std::string>> combinations = {
      {}, {"--causal"}, {"--padding", "3"}, {"--causal", "--padding", "1"}, {"--cross"}, {"--cross", "--padding", "5"},
      {"--kv-cache"}, {"--kv-cache", "--padding", "2"}};
  for (const std::vector<std::string>& options : combinations) {
    const Result r = run_options(options);
    INFO("options: " << fmt::format("{}", fmt::join(options, " ")) << "\noutput:\n" << r.output);
    CHECK(r.rc == 0);
    CHECK(r.output.find("FAIL") == std::string::npos);
    const bool cross = !options.empty() && options[0] == "--cross";
    check_row_identity(r.output, 2, 4, cross ? 6 : 4);
  }
}

TEST_CASE("walkthrough: --padding outside [0, Tk - 1] exits 2 with one line naming it") {
  TempDir dir("walkthrough_bad");
  for (const auto& [options, named] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--padding", "4"}, "--padding 4 is outside [0, 3]"},
           {{"--padding", "-1"}, "--padding -1 is outside [0, 3]"},
           {{"--cross", "--padding", "6"}, "--padding 6 is outside [0, 5]"},
           {{"--padding", "two"}, "--padding"}}) {
    const Result r = run_walkthrough(options, dir);
    INFO("options: " << fmt::format("{}", fmt::join(options, " ")) << "\noutput:\n" << r.output);
    CHECK(r.rc == 2);
    CHECK(r.output.find("walkthrough:") == 0);
    CHECK(r.output.find(named) != std::string::npos);
    CHECK(count(r.output, "\n") == 1);  // one line, and nothing run
  }
}

TEST_CASE("walkthrough: --cross with --kv-cache or --causal exits 2 with one line naming both") {
  TempDir dir("walkthrough_bad");
  for (const std::vector<std::string>& options : {std::vector<std::string>{"--cross", "--kv-cache"},
                                                  std::vector<std::string>{"--kv-cache", "--cross"},
                                                  std::vector<std::string>{"--cross", "--causal"}}) {
    const Result r = run_walkthrough(options, dir);
    INFO("options: " << fmt::format("{}", fmt::join(options, " ")) << "\noutput:\n" << r.output);
    CHECK(r.rc == 2);
    CHECK(r.output.find("walkthrough: --cross with " + (options[0] == "--cross" ? options[1] : options[0])) == 0);
    CHECK(r.output.find("--help") != std::string::npos);
    CHECK(count(r.output, "\n") == 1);
  }
}
