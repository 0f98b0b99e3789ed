#pragma once
// The schematic pictures of docs/math (docpics draws them into docs/img/). Each returns the SVG
// text. What a picture shows of the library's behaviour (which blocks a pattern keeps, which keys
// a layer's queries see, the kernel's tile sizes) comes in as plain data that docpics.cpp reads
// from the library itself, so that a change there changes the picture and fails `docpics --check`.
#include <cstdint>
#include <string>
#include <vector>

namespace docpics {

// A rows x cols table of yes/no, row-major: a mask (query rows, key columns) or a reach.
struct Cells {
  std::string title;  // one or more lines, '\n' between them
  int rows = 0, cols = 0;
  std::vector<char> on;
  bool at(int r, int c) const { return on[size_t(r) * size_t(cols) + size_t(c)] != 0; }
  int count() const {
    int n = 0;
    for (const char x : on) n += x != 0;
    return n;
  }
};

// qkv.svg: one head, X -> Q, K, V -> S -> mask, softmax -> P -> O = P V, with shapes.
std::string qkv_svg();
// heads.svg: the fused qkv projection viewed as `heads` heads, their attention, the concat, W^O.
std::string heads_svg(int heads);
// online-softmax.svg: the fused forward's query tile against its key tiles (kBq rows, kBk keys:
// the kernel's constants), the running max, sum and accumulator, and a worked row.
std::string online_softmax_svg(int64_t kBq, int64_t kBk);
// kv-cache.svg: `steps` decoding steps side by side, the cache growing by one row each.
std::string kv_cache_svg(int steps);
// linformer.svg: K and V projected along the sequence by E, F (r x T); the T x r scores.
std::string linformer_svg();
// compressed.svg: memory-compressed attention over T positions in blocks of s; `causal` the
// layer's causal visibility (T x ceil(T/s)), `local` local attention in blocks of s (T x T).
std::string compressed_svg(int T, int s, const Cells& causal, const Cells& local);
// axial.svg: a grid of rows x cols tokens; the query (qr, qc); reach_full and reach_causal its
// receptive field after row then column attention (rows x cols each).
std::string axial_svg(int rows, int cols, int qr, int qc, const Cells& reach_full, const Cells& reach_causal);
// sparse.svg: block-sparse patterns as block grids (block row a = queries, column c = keys).
std::string sparse_svg(const std::vector<Cells>& patterns, const std::string& note);

}  // namespace docpics
