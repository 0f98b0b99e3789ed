// The schematic pictures (schematics.h), hand-placed on a Canvas (canvas.h). Coordinates are in
// pixels of a picture about 880 wide, the width of a docs page. Shapes use the letters of the math
// pages: T tokens, d model width, H heads, hs = d / H, d_k the size of one head's queries and keys.
#include "tools/docpics/schematics.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "tools/docpics/canvas.h"

namespace docpics {

namespace {

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// A Cells table as a grid with its title above: seen cells green, the others light grey, and
// `focus` (row, col; -1 for none) yellow. Returns the bottom of the grid.
// The grid starts below `title_lines` lines of title (at least), so that panels side by side align.
double cells_panel(Canvas& c, double x, double y, double cell, const Cells& m, bool indices, int every = 1,
                   int focus_r = -1, int focus_c = -1, size_t title_lines = 2) {
  const std::vector<std::string> title = split_lines(m.title);
  const double w = m.cols * cell;
  for (size_t i = 0; i < title.size(); ++i) c.text(x + w / 2, y + 13 + 15 * double(i), title[i], 12);
  const double gy = y + 15 * double(std::max(title.size(), title_lines)) + (indices ? 16 : 6);
  c.grid(x, gy, m.rows, m.cols, cell, [&](int r, int k) {
    if (r == focus_r && k == focus_c) return colour::focus;
    return m.at(r, k) ? colour::seen : colour::hidden;
  }, indices, every);
  return gy + m.rows * cell;
}

}  // namespace

// ---- qkv.svg -------------------------------------------------------------------------------
std::string qkv_svg() {
  Canvas c(880, 420);
  c.title("One attention head: O = softmax(Q K^{T} / √d_{k} + mask) V");
  const double row[3] = {95, 205, 315};  // the Q, K, V lanes
  const Style st[3] = {colour::q, colour::k, colour::v};
  const char* name[3] = {"Q", "K", "V"};
  const char* w[3] = {"· W_{Q}", "· W_{K}", "· W_{V}"};
  c.matrix(20, 165, 56, 80, colour::x, "X", "T × d_{model}");
  for (int i = 0; i < 3; ++i) {
    c.elbow({76, 205}, {94, row[i]}, 85);
    c.op(145, row[i], 102, 44, {w[i], i < 2 ? "d_{model} × d_{k}" : "d_{model} × d_{v}"}, 12);
    c.arrow({196, row[i]}, {212, row[i]});
    c.matrix(212, row[i] - 40, 28, 80, st[i], name[i], i < 2 ? "T × d_{k}" : "T × d_{v}");
  }
  // scores: S = Q K^T / sqrt(d_k)
  c.elbow({240, row[0]}, {270, 138}, 255);
  c.elbow({240, row[1]}, {270, 162}, 255);
  c.op(330, 150, 120, 44, {"Q K^{T} / √d_{k}"});
  c.arrow({390, 150}, {415, 150});
  c.matrix(415, 110, 80, 80, colour::s, "S", "T × T", true);
  c.arrow({495, 150}, {510, 150});
  c.op(555, 150, 90, 44, {"mask", "−∞ if hidden"}, 12);
  c.arrow({600, 150}, {620, 150});
  c.op(665, 150, 90, 44, {"softmax", "along rows"}, 12);
  c.arrow({710, 150}, {735, 150});
  c.matrix(735, 110, 80, 80, colour::s, "P", "T × T", true);
  c.text(775, 206, "rows sum to 1", 11, "middle", colour::grey);
  // an example mask under the mask step: causal, key j hidden from query i when j > i
  c.line({555, 172}, {555, 214}, colour::faint, 1.0, true);
  c.text(555, 228, "e.g. causal: j ≤ i", 11, "middle", colour::grey);
  c.grid(519, 234, 8, 8, 9, [](int r, int k) { return k <= r ? colour::seen : colour::hidden; });
  // O = P V
  c.arrow({775, 214}, {775, 295});
  c.arrow({240, row[2]}, {740, row[2]});
  c.op(775, 315, 70, 40, {"P V"});
  c.arrow({810, 315}, {830, 315});
  c.matrix(830, 275, 28, 80, colour::o, "O", "T × d_{v}");
  c.text(440, 392, "T tokens; d_{k} the size of the head's queries and keys, d_{v} of its values (both hs = "
                   "d_{model} / H in a layer of H heads).", 12, "middle", colour::grey);
  c.text(440, 410, "Every (batch, head) pair runs this independently; the mask hides keys (causal, padding, window, "
                   "blocks).", 12, "middle", colour::grey);
  return c.str();
}

// ---- heads.svg -----------------------------------------------------------------------------
std::string heads_svg(int heads) {
  const double sw = 18, th = 80;  // the width of one head's slice (hs), the height of T rows
  const double d = sw * heads;
  Canvas c(880, 680);
  c.title(fmt::format("Multi-head attention: one fused projection, H heads of hs = d / H, concat, W^{{O}} (H = {})",
                      heads));
  // x -> [q | k | v]
  c.matrix(30, 60, d, th, colour::x, "x", "T × d");
  c.arrow({30 + d, 100}, {130, 100});
  c.op(215, 100, 170, 50, {"x W_{qkv}^{T} + b_{qkv}", "W_{qkv}: 3d × d"}, 12);
  c.arrow({300, 100}, {340, 100});
  const Style role[3] = {colour::q, colour::k, colour::v};
  const char* letter[3] = {"q", "k", "v"};
  const double qx = 340;
  for (int p = 0; p < 3; ++p) {
    c.text(qx + (p + 0.5) * d, 54, letter[p], 14, "middle", role[p].stroke, "bold");
    for (int h = 0; h < heads; ++h) {
      const double x = qx + (p * heads + h) * sw;
      c.rect(x, 60, sw, th, role[p]);
      c.text(x + sw / 2, 104, fmt::format("{}", h), 11, "middle", colour::grey);
    }
  }
  c.text(qx + 3 * d + 10, 88, "[q | k | v]  T × 3d", 13, "start");
  c.text(qx + 3 * d + 10, 106, "a slice: hs = d / H columns", 12, "start", colour::grey);
  c.text(qx + 3 * d + 10, 122, "slice h of q, k, v: head h", 12, "start", colour::grey);
  const double gy = 220, gap = 200, g0 = 95;
  for (int h = 0; h < heads; ++h) {
    const double gx = g0 + h * gap;
    c.text(gx + 72, gy + th / 2 - 8, fmt::format("head {}", h), 12, "start", colour::ink, "bold");
    for (int p = 0; p < 3; ++p) {
      const double bx = gx + p * 24;
      c.line({qx + (p * heads + h + 0.5) * sw, 60 + th}, {bx + sw / 2, gy}, role[p].stroke, 0.9);
      c.rect(bx, gy, sw, th, role[p]);
      c.text(bx + sw / 2, gy + th / 2 + 5, letter[p], 13, "middle", colour::ink, "bold");
    }
    c.text(gx + 72, gy + th / 2 + 10, "T × hs each", 11, "start", colour::grey);
    c.arrow({gx + 33, gy + th}, {gx + 33, 338});
    c.op(gx + 33, 360, 150, 44, {"one head's attention", "softmax(q k^{T} / √hs) v"}, 11);
    c.arrow({gx + 33, 382}, {gx + 33, 410});
    c.rect(gx + 24, 410, sw, th, colour::o);
    c.text(gx + 33, 410 + th / 2 + 5, "o", 13, "middle", colour::ink, "bold");
    c.text(gx + 48, 410 + th / 2 + 4, "T × hs", 11, "start", colour::grey);
  }
  // the view: head h takes slice h of q, of k and of v
  c.text_on_white(440, 176, "view (T, 3d) → (3, H, T, hs): no copy, each head reads its own slices");
  // concat -> W^O -> y
  const double cx = 300, cy = 570;
  for (int h = 0; h < heads; ++h) {
    c.line({g0 + h * gap + 33, 410 + th}, {cx + (h + 0.5) * sw, cy}, colour::o.stroke, 0.9);
    c.rect(cx + h * sw, cy, sw, th, colour::o);
    c.text(cx + (h + 0.5) * sw, cy + th / 2 + 4, fmt::format("{}", h), 11, "middle", colour::grey);
  }
  c.text(cx - 10, cy + th / 2 - 4, "concat", 13, "end");
  c.text(cx - 10, cy + th / 2 + 12, "T × d", 12, "end", colour::grey);
  c.arrow({cx + d, cy + th / 2}, {405, cy + th / 2});
  c.op(480, cy + th / 2, 150, 50, {"· W^{O} + b^{O}", "W^{O}: d × d (proj)"}, 12);
  c.arrow({555, cy + th / 2}, {590, cy + th / 2});
  c.matrix(590, cy, d, th, colour::x, "y", "T × d");
  return c.str();
}

// ---- online-softmax.svg --------------------------------------------------------------------
std::string online_softmax_svg(int64_t kBq, int64_t kBk) {
  Canvas c(880, 640);
  c.title(fmt::format("The fused forward: {} query rows against the keys, {} at a time, with a running softmax", kBq,
                      kBk));
  // geometry: the query tile, K^T in tiles, a tile of scores per key tile, the value tiles
  const int tiles = 4;
  const double x0 = 150, tw = 150;
  c.text(x0, 48, fmt::format("K^{{T}} of the head (d × T_{{k}}), transposed once; key tiles of kBk = {}", kBk), 12,
         "start", colour::grey);
  for (int t = 0; t < tiles; ++t) {
    const double x = x0 + t * tw;
    c.rect(x + 5, 56, tw - 10, 36, colour::k);
    c.text(x + tw / 2, 79, fmt::format("keys {} .. {}", t * kBk, (t + 1) * kBk - 1), 12);
    c.rect(x + 5, 110, tw - 10, 60, colour::s);
    c.text(x + tw / 2, 136, "S = scale Q K_{tile}^{T}", 12);
    c.text(x + tw / 2, 154, fmt::format("{} × {}", kBq, kBk), 12, "middle", colour::grey);
    c.text(x + 14, 124, fmt::format("{}", t + 1), 11, "middle", colour::s.stroke, "bold");
    c.rect(x + 5, 184, tw - 10, 28, colour::v);
    c.text(x + tw / 2, 203, fmt::format("V tile: {} × d_{{v}}", kBk), 12);
  }
  c.text(x0 + tiles * tw + 8, 144, "…", 16, "start");
  c.matrix(60, 110, 40, 60, colour::q, "Q", "");
  c.text(80, 186, fmt::format("{} × d", kBq), 12, "middle", colour::grey);
  c.text(80, 202, fmt::format("kBq = {} rows", kBq), 11, "middle", colour::grey);
  c.arrow({100, 140}, {153, 140});
  c.arrow({x0 + 5, 232}, {x0 + tiles * tw - 5, 232});
  c.text(x0 + tiles * tw / 2, 250, "tiles in order, each folded into the running state and then dropped: no T × T "
                                   "matrix is ever held", 12, "middle", colour::grey);

  // the running state and its update
  const double sy = 280;
  c.text(20, sy + 6, "per row i of the query tile:", 13, "start", colour::ink, "bold");
  c.rect(40, sy + 24, 18, 60, colour::note);
  c.text(49, sy + 100, "m", 13);
  c.rect(70, sy + 24, 18, 60, colour::note);
  c.text(79, sy + 100, "l", 13);
  c.rect(100, sy + 24, 40, 60, colour::o);
  c.text(120, sy + 100, "acc", 13);
  c.text(90, sy + 118, fmt::format("{} rows; acc {} × d_{{v}}", kBq, kBq), 11, "middle", colour::grey);
  const double fx = 190;
  c.text(fx, sy + 28, "m' = max(m, max_{j} S_{ij})", 13, "start");
  c.text(fx + 300, sy + 28, "the running max (starts at −∞)", 12, "start", colour::grey);
  c.text(fx, sy + 50, "α = e^{m − m'}", 13, "start", colour::o.stroke, "bold");
  c.text(fx + 300, sy + 50, "rescales what was summed under the old max", 12, "start", colour::grey);
  c.text(fx, sy + 72, "l' = α l + Σ_{j} e^{S_{ij} − m'}", 13, "start");
  c.text(fx + 300, sy + 72, "the running sum (starts at 0)", 12, "start", colour::grey);
  c.text(fx, sy + 94, "acc' = α acc + Σ_{j} e^{S_{ij} − m'} V_{j}", 13, "start");
  c.text(fx + 300, sy + 94, "the running output, d_{v} numbers", 12, "start", colour::grey);
  c.text(fx, sy + 120, "after the last tile:  O_{i} = acc / l,   lse_{i} = m + log l  (saved for backward)", 13,
         "start", colour::ink, "bold");

  // a worked row: 12 keys in 3 tiles of 4; the second tile raises the max
  const std::vector<double> s = {0.5, 1.0, -0.5, 0.0, 2.0, 3.0, 1.0, 0.5, 2.0, -1.0, 1.5, 0.0};
  const int per = 4, nt = 3;
  const double ey = 440, cw = 40, tg = 236;
  c.text(20, ey, "one row, worked (12 keys in tiles of 4 here): the second tile raises the max", 13, "start",
         colour::ink, "bold");
  double m = -INFINITY, l = 0;
  for (int t = 0; t < nt; ++t) {
    const double x = 40 + t * tg;
    double mx = -INFINITY;
    for (int j = 0; j < per; ++j) mx = std::max(mx, s[size_t(t * per + j)]);
    const double m_new = std::max(m, mx), a = std::exp(m - m_new);
    double rs = 0;
    for (int j = 0; j < per; ++j) rs += std::exp(s[size_t(t * per + j)] - m_new);
    const double l_old = l;
    l = l * a + rs;
    c.text(x + per * cw / 2, ey + 24, fmt::format("tile {}: S_{{ij}}", t + 1), 12, "middle", colour::grey);
    for (int j = 0; j < per; ++j) {
      c.rect(x + j * cw, ey + 32, cw, 26, colour::s, false, 0, 0.8);
      c.text(x + (j + 0.5) * cw, ey + 50, fmt::format("{:.1f}", s[size_t(t * per + j)]), 12);
    }
    const double ty = ey + 78;
    if (t == 0) {
      c.text(x, ty, fmt::format("m = {:.1f}", m_new), 12, "start");
      c.text(x, ty + 18, "α = e^{−∞} = 0: nothing to rescale", 12, "start", colour::grey);
    } else if (m_new > m) {
      c.text(x, ty, fmt::format("max {:.1f} > m: m = {:.1f}", mx, m_new), 12, "start", colour::o.stroke, "bold");
      c.text(x, ty + 18, fmt::format("α = e^{{{:.1f} − {:.1f}}} = {:.3f}", m, m_new, a), 12, "start", colour::o.stroke,
             "bold");
    } else {
      c.text(x, ty, fmt::format("max {:.1f} ≤ m: m stays {:.1f}", mx, m_new), 12, "start");
      c.text(x, ty + 18, "α = 1", 12, "start", colour::grey);
    }
    c.text(x, ty + 36,
           t == 0   ? fmt::format("l = {:.3f}", l)
           : a == 1 ? fmt::format("l = {:.3f} + {:.3f} = {:.3f}", l_old, rs, l)
                    : fmt::format("l = {:.3f} × {:.3f} + {:.3f} = {:.3f}", a, l_old, rs, l),
           12, "start");
    m = m_new;
    if (t + 1 < nt) c.arrow({x + per * cw + 8, ey + 45}, {x + tg - 8, ey + 45});
  }
  double direct = 0;
  for (const double x : s) direct += std::exp(x - m);
  c.text(440, ey + 150,
         fmt::format("l = {:.3f} = Σ over all 12 keys of e^{{S_{{ij}} − {:.1f}}}: the same normaliser as one softmax over "
                     "the whole row",
                     l, m),
         12, "middle", colour::grey);
  c.text(440, ey + 168, fmt::format("(direct sum: {:.3f}); acc is rescaled by the same α, so O = acc / l = Σ_{{j}} P_{{ij}} V_{{j}}",
                                    direct),
         12, "middle", colour::grey);
  return c.str();
}

// ---- kv-cache.svg --------------------------------------------------------------------------
std::string kv_cache_svg(int steps) {
  const double pw = 217, rh = 22;
  Canvas c(int(std::ceil(10 + steps * pw)), 410);
  c.title("Decoding with a KV cache: each step appends one key and one value, and one query reads them all");
  for (int t = 0; t < steps; ++t) {
    const double x0 = 10 + t * pw;
    if (t > 0) c.line({x0 - 4, 40}, {x0 - 4, 350}, "#dddddd");
    c.text(x0 + pw / 2, 50, fmt::format("step t = {}", t), 14, "middle", colour::ink, "bold");
    c.text(x0 + pw / 2, 68, fmt::format("new token x_{{{}}} → q_{{{}}}, k_{{{}}}, v_{{{}}}", t, t, t, t), 12, "middle",
           colour::grey);
    const double qx = x0 + 8, kx = x0 + 86, vx = x0 + 150, ky = 100, cwid = 52;
    c.text(qx + 24, ky - 8, "query", 11, "middle", colour::grey);
    c.text(kx + cwid / 2, ky - 8, "K cache", 11, "middle", colour::grey);
    c.text(vx + cwid / 2, ky - 8, "V cache", 11, "middle", colour::grey);
    const double qy = ky + t * rh;
    for (int r = 0; r < steps; ++r) {
      const double y = ky + r * rh;
      if (r > t) {  // rows not yet written
        c.rect(kx, y, cwid, rh, colour::note, true);
        c.rect(vx, y, cwid, rh, colour::note, true);
        continue;
      }
      const double sw = r == t ? 2.4 : 1.0;
      c.rect(kx, y, cwid, rh, colour::k, false, 0, sw);
      c.text(kx + cwid / 2, y + 15, fmt::format("k_{{{}}}", r), 12);
      c.rect(vx, y, cwid, rh, colour::v, false, 0, sw);
      c.text(vx + cwid / 2, y + 15, fmt::format("v_{{{}}}", r), 12);
      c.line({qx + 48, qy + rh / 2}, {kx, y + rh / 2}, colour::q.stroke, 0.9);
    }
    c.rect(qx, qy, 48, rh, colour::q, false, 0, 2.4);
    c.text(qx + 24, qy + 15, fmt::format("q_{{{}}}", t), 12);
    c.text(kx + cwid + 6, ky + steps * rh + 14, fmt::format("rows 0..{}: {} × d_{{k}} each", t, t + 1), 11, "middle",
           colour::grey);
    // the scores row and the output
    const double py = 230, pc = 22;
    c.text(x0 + pw / 2, py - 8, fmt::format("p = softmax(q_{{{}}} K^{{T}} / √d_{{k}}): 1 × {}", t, t + 1), 11, "middle");
    const double px = x0 + pw / 2 - (t + 1) * pc / 2;
    for (int j = 0; j <= t; ++j) c.rect(px + j * pc, py, pc, pc, colour::s, false, 0, 0.8);
    c.arrow({x0 + pw / 2, py + pc + 4}, {x0 + pw / 2, py + pc + 26});
    c.rect(x0 + pw / 2 - 26, py + pc + 30, 52, rh, colour::o);
    c.text(x0 + pw / 2, py + pc + 45, fmt::format("o_{{{}}}", t), 12);
    c.text(x0 + pw / 2, py + pc + 68, "o = p V: 1 × d_{k}", 11, "middle", colour::grey);
  }
  c.text(c.width() / 2.0, 374, "Bold: what step t computes. Earlier keys and values are read from the cache, not "
                               "recomputed; dashed rows are not written yet.", 12, "middle", colour::grey);
  c.text(c.width() / 2.0, 392, "Per step, head and layer: t + 1 scores, and the cache grows by 2 d_{k} numbers "
                               "(one key, one value).", 12, "middle", colour::grey);
  return c.str();
}

// ---- linformer.svg -------------------------------------------------------------------------
std::string linformer_svg() {
  Canvas c(880, 400);
  c.title("Linformer: keys and values projected along the sequence, T positions → r");
  const double T = 120, r = 36, d = 60, hs = 20;
  // K' = E K and V' = F V, one above the other
  const double ya = 60, yb = 220;
  const struct {
    double y;
    const char *proj, *in, *out;
    Style st;
  } lane[2] = {{ya, "E", "K", "K'", colour::k}, {yb, "F", "V", "V'", colour::v}};
  for (const auto& L : lane) {
    const double mid = L.y + T / 2;
    c.matrix(30, mid - r / 2, T, r, colour::x, L.proj, "r × T");
    c.text(163, mid + 6, "·", 20);
    c.matrix(176, L.y, d, T, L.st, L.in, "T × d");
    c.text(252, mid + 6, "=", 18);
    c.matrix(268, mid - r / 2, d, r, L.st, L.out, "r × d");
  }
  c.text(30, ya - 16, "learned E, F (r × T), shared by all heads", 12, "start", colour::grey);
  // one head: Q_h K'_h^T -> S (T x r) -> softmax -> P V'_h -> O_h
  const double y0 = 130, mid = y0 + T / 2;
  c.text(580, 100, "head h: columns h hs .. (h+1) hs − 1 of Q, K', V'", 12, "middle", colour::grey);
  c.matrix(400, y0, hs, T, colour::q, "Q", "T × hs");
  c.text(433, mid + 6, "·", 20);
  c.rect(446, mid - hs / 2, r, hs, colour::k);
  c.text(446 + r / 2, mid - hs / 2 - 8, "K'_{h}^{T}", 12);
  c.text(446 + r / 2, mid + hs / 2 + 14, "hs × r", 11, "middle", colour::grey);
  c.text(498, mid + 6, "=", 18);
  c.matrix(512, y0, r, T, colour::s, "S", "T × r");
  c.arrow({552, mid}, {600, mid});
  c.text(576, mid - 8, "softmax", 11, "middle", colour::grey);
  c.text(576, mid + 16, "along r", 11, "middle", colour::grey);
  c.matrix(604, y0, r, T, colour::s, "P", "T × r");
  c.text(652, mid + 6, "·", 20);
  c.rect(664, mid - r / 2, hs, r, colour::v);
  c.text(664 + hs / 2, mid - r / 2 - 8, "V'_{h}", 12);
  c.text(664 + hs / 2, mid + r / 2 + 14, "r × hs", 11, "middle", colour::grey);
  c.text(700, mid + 6, "=", 18);
  c.matrix(716, y0, hs, T, colour::o, "O", "T × hs");
  c.text(440, 372, "T × r scores per head instead of T × T: time O(T r d), linear in T for a fixed r.", 12, "middle",
         colour::grey);
  c.text(440, 390, "Each projected key mixes every position, so there is no causal version; padded positions are "
                   "zeroed before E and F.", 12, "middle", colour::grey);
  return c.str();
}

// ---- compressed.svg ------------------------------------------------------------------------
std::string compressed_svg(int T, int s, const Cells& causal, const Cells& local) {
  const int Tc = (T + s - 1) / s;
  const double rh = 14, y0 = 92, w = 56;
  Canvas c(880, int(y0 + T * rh + 64));
  c.title(fmt::format("Memory-compressed attention: each block of s = {} keys (values) becomes one (T = {})", s, T));
  const struct {
    double x;
    const char *in, *out, *lin;
    Style st;
  } lane[2] = {{30, "k", "k_{c}", "compress_k", colour::k}, {290, "v", "v_{c}", "compress_v", colour::v}};
  for (const auto& L : lane) {
    c.text(L.x + w / 2, y0 - 8, fmt::format("{}: T × d", L.in), 12);
    c.text(L.x + 184, y0 - 8, fmt::format("{}: T_{{c}} × d", L.out), 12);
    c.text(L.x + 106, y0 - 50, fmt::format("{}: Linear(s d → d)", L.lin), 12, "middle", colour::grey);
    c.text(L.x + 106, y0 - 34, "per block: a conv of stride s", 12, "middle", colour::grey);
    for (int j = 0; j < Tc; ++j) {
      const double by = y0 + j * s * rh;
      for (int p = j * s; p < std::min(T, (j + 1) * s); ++p) {
        c.rect(L.x, y0 + p * rh, w, rh, L.st, false, 0, 0.6);
        c.text(L.x - 4, y0 + p * rh + 11, fmt::format("{}", p), 10, "end", colour::grey);
      }
      c.rect(L.x, by, w, s * rh, {"none", L.st.stroke}, false, 0, 2.0);
      const double cy = by + s * rh / 2;
      c.arrow({L.x + w + 6, cy}, {L.x + 150, cy});
      c.text(L.x + 106, cy - 4, fmt::format("block {}", j), 11, "middle", colour::grey);
      c.rect(L.x + 156, cy - rh / 2, w, rh, L.st, false, 0, 1.2);
    }
  }
  // the scores: T queries over Tc compressed keys, causal, from the layer; and local blocks
  cells_panel(c, 560, 46, rh, causal, true);
  cells_panel(c, 680, 46, rh, local, true);
  c.text(440, y0 + T * rh + 28, "Every query attends to T_{c} = ceil(T / s) compressed keys: T × T / s scores. Causal: "
                                "block j only once it ends, (j+1) s − 1 ≤ i,", 12, "middle", colour::grey);
  c.text(440, y0 + T * rh + 46, fmt::format("so the first s − 1 = {} queries see nothing (zeros). Grids: rows are "
                                            "queries i; columns blocks j, or keys for the local blocks.", s - 1),
         12, "middle", colour::grey);
  return c.str();
}

// ---- axial.svg -----------------------------------------------------------------------------
std::string axial_svg(int rows, int cols, int qr, int qc, const Cells& reach_full, const Cells& reach_causal) {
  const double cell = 26, pw = 172;
  Canvas c(880, 256);
  c.title(fmt::format("Axial attention: T = {} × {} tokens on a grid, attention along rows, then along columns", rows,
                      cols));
  Cells raster;
  raster.title = "raster order:\ntoken r W_{w} + c at (r, c)";
  raster.rows = rows, raster.cols = cols;
  raster.on.assign(size_t(rows * cols), 0);
  Cells row = raster, col = raster;
  row.title = fmt::format("1. row attention: ({}, {})\nsees its row", qr, qc);
  col.title = fmt::format("2. column attention: then\nits column (each holds a row)");
  for (int k = 0; k < cols; ++k) row.on[size_t(qr * cols + k)] = 1;
  for (int r = 0; r < rows; ++r) col.on[size_t(r * cols + qc)] = 1;
  const Cells* panels[5] = {&raster, &row, &col, &reach_full, &reach_causal};
  for (int p = 0; p < 5; ++p) {
    const double x = 18 + p * pw;
    const double bottom = cells_panel(c, x, 40, cell, *panels[p], true, 1, p == 0 ? -1 : qr, p == 0 ? -1 : qc);
    if (p == 0)
      for (int r = 0; r < rows; ++r)
        for (int k = 0; k < cols; ++k)
          c.text(x + (k + 0.5) * cell, bottom - (rows - r - 0.5) * cell + 4, fmt::format("{}", r * cols + k), 11);
  }
  c.text(440, 222, "Yellow: the query; green: the tokens it reads. Panels 4 and 5 are read from the layer's gradients: "
                   "what output (r, c) depends on.", 12, "middle", colour::grey);
  c.text(440, 240, "Causal: rows and columns each causal, so the reach is the rectangle r' ≤ r, c' ≤ c, not the whole "
                   "raster past.", 12, "middle", colour::grey);
  return c.str();
}

// ---- sparse.svg ----------------------------------------------------------------------------
std::string sparse_svg(const std::vector<Cells>& patterns, const std::string& note) {
  const double cell = 16, pw = 440;
  const int per_row = 2;
  const int n = patterns.empty() ? 0 : patterns[0].rows;
  const double ph = 2 * 15 + 16 + n * cell + 44;
  const int nrows = (int(patterns.size()) + per_row - 1) / per_row;
  Canvas c(880, int(36 + nrows * ph + 14));
  c.title("Block-sparse patterns of nn/sparse_patterns.h: block row a (queries) × block column c (keys)");
  for (size_t i = 0; i < patterns.size(); ++i) {
    const Cells& m = patterns[i];
    const double x = double(i % per_row) * pw + (pw - m.cols * cell) / 2;
    const double y = 36 + double(i / per_row) * ph;
    const double bottom = cells_panel(c, x, y, cell, m, true);
    c.text(x + m.cols * cell / 2, bottom + 18,
           fmt::format("kept: {} of {} blocks ({:.0f}%)", m.count(), m.rows * m.cols,
                       100.0 * m.count() / double(m.rows * m.cols)),
           12, "middle", colour::grey);
  }
  c.text(440, c.height() - 14, note, 12, "middle", colour::grey);
  return c.str();
}

}  // namespace docpics
