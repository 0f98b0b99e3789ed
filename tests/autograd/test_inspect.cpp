// Inspecting the tape: print_graph (op, shape, dtype, device, gradient norms, leaf names) and the
// same graph as Graphviz DOT.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {

// The lines of s that contain `needle`.
std::vector<std::string> lines_with(const std::string& s, const std::string& needle) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);)
    if (line.find(needle) != std::string::npos) out.push_back(line);
  return out;
}
// The number printed after `key` in `line` (NaN when the key is absent).
double number_after(const std::string& line, const std::string& key) {
  size_t p = line.find(key);
  if (p == std::string::npos) return std::nan("");
  return std::stod(line.substr(p + key.size()));
}

// L = sum((x * w)^2) with x = [1, 2, 3], w = [0.5, -1, 2]:
//   y = x * w = [0.5, -2, 6],  z = y^2 = [0.25, 4, 36],  L = 40.25
// The gradient that flows through each node's output:
//   sum: dL/dL = 1                        |.| = 1
//   pow: dL/dz = [1, 1, 1]                |.| = sqrt 3
//   mul: dL/dy = 2y = [1, -4, 12]         |.| = sqrt 161
// and into the leaves: x.grad = 2y * w = [0.5, 4, 24] (|.| = sqrt 592.25), w.grad = 2y * x = [1, -8, 36]
// (|.| = sqrt 1361).
struct Example {
  Tensor x = tensor<double>({1, 2, 3}).set_requires_grad(true);
  Tensor w = tensor<double>({0.5, -1, 2}).set_requires_grad(true);
  Tensor L = sum(pow(mul(x, w), 2.0));
  LeafNames names{{"x", x}, {"w", w}};
};

}  // namespace

TEST_CASE("inspect: print_graph lists every node with shape, dtype and device, leaves by name") {
  Example e;
  CHECK(e.L.item<double>() == 40.25);
  const std::string s = print_graph(e.L, e.names);
  INFO(s);
  CHECK(std::count(s.begin(), s.end(), '\n') == 3);  // one line per node, no hint before backward
  auto mul_l = lines_with(s, " mul "), pow_l = lines_with(s, " pow "), sum_l = lines_with(s, " sum ");
  REQUIRE(mul_l.size() == 1);
  REQUIRE(pow_l.size() == 1);
  REQUIRE(sum_l.size() == 1);
  CHECK(mul_l[0].find("-> [3] f64 cpu") != std::string::npos);
  CHECK(pow_l[0].find("-> [3] f64 cpu") != std::string::npos);
  CHECK(sum_l[0].find("-> [] f64 cpu") != std::string::npos);
  CHECK(mul_l[0].find("inputs: x[3] w[3]") != std::string::npos);  // names, in argument order
  CHECK(s.find("|grad|") == std::string::npos);                     // no backward yet
  // tape order: mul, pow, sum; each consumer names its producer by sequence number
  CHECK(s.find(" mul ") < s.find(" pow "));
  CHECK(s.find(" pow ") < s.find(" sum "));
  const uint64_t mul_seq = e.L.grad_fn()->next[0].node->next[0].node->seq;
  CHECK(pow_l[0].find(fmt::format("inputs: #{}", mul_seq)) != std::string::npos);
  // without names: "leaf" and the shape; graph_to_string is the same text
  const std::string plain = print_graph(e.L);
  CHECK(plain.find("inputs: leaf[3] leaf[3]") != std::string::npos);
  CHECK(graph_to_string(e.L) == plain);
  CHECK(print_graph(e.x).empty());  // a leaf has no graph
}

TEST_CASE("inspect: with norms tracked, each node shows the norm of the gradient that flowed through it") {
  CHECK_FALSE(track_grad_norms());
  Example e;
  {
    TrackGradNormsGuard track;
    CHECK(track_grad_norms());
    e.L.backward();
  }
  CHECK_FALSE(track_grad_norms());  // the guard restores the previous setting
  const std::string s = print_graph(e.L, e.names);
  INFO(s);
  CHECK(number_after(lines_with(s, " sum ").at(0), "|grad| ") == doctest::Approx(1.0));
  // printed to 6 significant digits
  CHECK(number_after(lines_with(s, " pow ").at(0), "|grad| ") == doctest::Approx(std::sqrt(3.0)).epsilon(1e-5));
  CHECK(number_after(lines_with(s, " mul ").at(0), "|grad| ") == doctest::Approx(std::sqrt(161.0)).epsilon(1e-5));
  CHECK(s.find("not tracked") == std::string::npos);
  CHECK(std::count(s.begin(), s.end(), '\n') == 3);
  // the same numbers on the nodes, unrounded
  const Node& sum_node = *e.L.grad_fn();
  const Node& pow_node = *sum_node.next[0].node;
  const Node& mul_node = *pow_node.next[0].node;
  CHECK(sum_node.debug.grad_norm == 1.0);
  CHECK(pow_node.debug.grad_norm == doctest::Approx(std::sqrt(3.0)).epsilon(1e-12));
  CHECK(mul_node.debug.grad_norm == doctest::Approx(std::sqrt(161.0)).epsilon(1e-12));
  check_close(e.x.grad(), {0.5, 4, 24});
  check_close(e.w.grad(), {1, -8, 36});
}

TEST_CASE("inspect: without tracking, print_graph says how to get the norms") {
  Example e;
  e.L.backward();
  const std::string s = print_graph(e.L);
  INFO(s);
  CHECK(lines_with(s, "|grad| ? (released)").size() == 3);  // every node ran, none measured
  CHECK(s.find("(released)") != std::string::npos);
  CHECK(s.find("not tracked") != std::string::npos);
  CHECK(s.find("ag::set_track_grad_norms(true)") != std::string::npos);
  CHECK(s.find("ag::TrackGradNormsGuard") != std::string::npos);
  CHECK(s.find("ag::detect_anomaly(true)") != std::string::npos);
  CHECK(e.L.grad_fn()->debug.grad_norm == -1);
}

TEST_CASE("inspect: graph_to_dot draws one box per node, the edges, named leaves and the norms") {
  Example e;
  {
    TrackGradNormsGuard track;
    e.L.backward();
  }
  const std::string d = graph_to_dot(e.L, e.names);
  INFO(d);
  CHECK(d.rfind("digraph tape {", 0) == 0);
  CHECK(std::count(d.begin(), d.end(), '{') == 1);
  CHECK(std::count(d.begin(), d.end(), '}') == 1);
  CHECK(d.substr(d.size() - 2) == "}\n");
  CHECK(std::count(d.begin(), d.end(), '"') % 2 == 0);
  // one box line per tape node, labelled op #seq, shape, dtype, device and the gradient norm
  const Node& sum_node = *e.L.grad_fn();
  const Node& pow_node = *sum_node.next[0].node;
  const Node& mul_node = *pow_node.next[0].node;
  CHECK(lines_with(d, "[label=\"").size() == 5);  // 3 nodes + 2 leaves
  CHECK(d.find(fmt::format("n{} [label=\"sum #{}\\n[] f64 cpu\\n|grad| 1\"];", sum_node.seq, sum_node.seq)) !=
        std::string::npos);
  CHECK(d.find(fmt::format("n{} [label=\"pow #{}\\n[3] f64 cpu\\n|grad| 1.73205\"];", pow_node.seq, pow_node.seq)) !=
        std::string::npos);
  CHECK(d.find(fmt::format("n{} [label=\"mul #{}\\n[3] f64 cpu\\n|grad| 12.6886\"];", mul_node.seq, mul_node.seq)) !=
        std::string::npos);
  // the edges: node to node, and each leaf to mul
  CHECK(d.find(fmt::format("n{} -> n{};", mul_node.seq, pow_node.seq)) != std::string::npos);
  CHECK(d.find(fmt::format("n{} -> n{};", pow_node.seq, sum_node.seq)) != std::string::npos);
  CHECK(lines_with(d, " -> ").size() == 4);
  CHECK(lines_with(d, fmt::format(" -> n{};", mul_node.seq)).size() == 2);
  // leaves: ellipses with their name, shape and the norm of their .grad
  auto x_l = lines_with(d, "[label=\"x\\n");
  auto w_l = lines_with(d, "[label=\"w\\n");
  REQUIRE(x_l.size() == 1);
  REQUIRE(w_l.size() == 1);
  CHECK(x_l[0].find("[3] f64 cpu\\n|.grad| 24.3362\", shape=ellipse") != std::string::npos);  // sqrt 592.25
  CHECK(w_l[0].find("[3] f64 cpu\\n|.grad| 36.8917\", shape=ellipse") != std::string::npos);  // sqrt 1361
  // without names the leaves are "leaf"
  CHECK(lines_with(graph_to_dot(e.L), "[label=\"leaf\\n[3] f64 cpu").size() == 2);
}

TEST_CASE("inspect: graph_entries lists leaves and nodes, inputs first, with shapes and norms") {
  Example e;
  std::vector<GraphEntry> g = graph_entries(e.L, e.names);
  REQUIRE(g.size() == 5);  // x, w, mul, pow, sum
  CHECK(g[0].leaf);
  CHECK(g[0].op == "x");
  CHECK(g[1].op == "w");
  CHECK(g[2].op == "mul");
  CHECK(g[2].inputs == std::vector<size_t>{0, 1});
  CHECK(g[3].op == "pow");
  CHECK(g[3].inputs == std::vector<size_t>{2});
  CHECK(g[4].op == "sum");
  CHECK(g[4].seq == int64_t(e.L.grad_fn()->seq));
  CHECK(g[4].shape == Shape{});
  CHECK(g[2].shape == Shape{3});
  CHECK(g[0].dtype == DType::f64);
  for (const GraphEntry& x : g) CHECK_FALSE(x.has_grad);  // no backward yet
  CHECK(graph_label(g[2]) == std::vector<std::string>{fmt::format("mul #{}", g[2].seq), "[3] f64 cpu"});
  {
    TrackGradNormsGuard track;
    e.L.backward();
  }
  g = graph_entries(e.L, e.names);
  CHECK(g[3].grad_norm == doctest::Approx(std::sqrt(3.0)));
  CHECK(g[2].grad_norm == doctest::Approx(std::sqrt(161.0)));
  CHECK(g[0].grad_norm == doctest::Approx(std::sqrt(592.25)));
  CHECK(g[1].grad_norm == doctest::Approx(std::sqrt(1361.0)));
  CHECK(graph_label(g[1]) == std::vector<std::string>{"w", "[3] f64 cpu", "|.grad| 36.8917"});
  CHECK(graph_label(g[3])[2] == "|grad| 1.73205");
  CHECK(graph_entries(e.x).empty());  // a leaf has no history
}

TEST_CASE("inspect: a leaf used twice is drawn once, and a graph under NoGradGuard is empty") {
  Tensor x = tensor({1.f, 2.f}).set_requires_grad(true);
  Tensor L = sum(mul(x, x));
  const std::string d = graph_to_dot(L, {{"x", x}});
  CHECK(lines_with(d, "[label=\"x\\n[2] f32 cpu\", shape=ellipse]").size() == 1);
  CHECK(lines_with(d, " -> ").size() == 3);  // x -> mul twice, mul -> sum
  CHECK(print_graph(L, {{"x", x}}).find("inputs: x[2] x[2]") != std::string::npos);
  NoGradGuard no_grad;
  CHECK(print_graph(sum(mul(x, x))).empty());
}
