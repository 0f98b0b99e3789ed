// apps/walkthrough as a user runs it: the binary (ATTOGRAD_APP_DIR) spawned, its output read.
//   - every gradient's check passes (autograd == formula == finite differences), and so do the
//     softmax row sums and the fused-attention comparison; exit 0
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

}  // namespace

TEST_CASE("walkthrough: every gradient matches its formula and finite differences, exit 0") {
  const FullRun& run = full_run();
  INFO("output:\n" << run.result.output);
  REQUIRE(run.result.rc == 0);
  const std::string& out = run.result.output;
  for (const char* name : {"dOut", "dWo", "dC", "dO_h", "dP (dWeights)", "dV", "dZ", "dS (dScores)", "dQ", "dK",
                           "dWq", "dWk", "dWv", "dX", "softmax rows sum to 1", "fused attention output",
                           "fused attention gradients"})
    CHECK_MESSAGE(out.find(fmt::format("PASS {}: ", name)) != std::string::npos, "no PASS line for ", name);
  CHECK(count(out, "\nPASS ") == 17);  // one line each
  CHECK(out.find("FAIL") == std::string::npos);
  CHECK(out.find("17 checks passed, 0 failed") != std::string::npos);
  // the forward is printed step by step, each with its shape
  for (const char* step : {"X [4,8]", "Q = X Wq [4,8]", "S = Q_h K_h^T [2,4,4]", "P = softmax(Z) over the keys [2,4,4]",
                           "O_h = P V_h [2,4,4]", "Out = C Wo [4,8]", "L = mean((Out - Y)^2) []"})
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
  const size_t at = r.output.find("L = mean((Out - Y)^2)");
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
