// apps/longseq: the three tasks (ListOps by hand-evaluated expressions, the bible's books and
// passages on a synthetic text, pixel sequences on synthetic IDX files), batches, the pooled
// heatmap, the model's padding, window, sparse pattern and initialisation, the training step main
// runs (forward_backward), the run's config, and the binary on a tiny run (more runs of the
// binary: tests/apps/test_longseq_run.cpp).
#include <random>
#include <set>

#include "apps/common/run.h"
#include "apps/longseq/lib.h"
#include "optim/adam.h"
#include "tests/apps/tiny_apps.h"
#include "tests/apps/usage_error.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;
using namespace ag::apps;
using namespace ag::apps::longseq;

namespace {
// "[MAX 2 9 ]" -> ids, by the vocabulary of listops_vocab()
std::vector<uint16_t> listops_ids(const std::string& text) {
  std::vector<uint16_t> ids;
  std::istringstream in(text);
  for (std::string w; in >> w;) {
    const auto& v = listops_vocab();
    const auto it = std::find(v.begin(), v.end(), w);
    REQUIRE(it != v.end());
    ids.push_back(uint16_t(it - v.begin()));
  }
  return ids;
}
}  // namespace

TEST_CASE("longseq: ListOps values by hand") {
  CHECK(listops_value(listops_ids("7")) == 7);
  CHECK(listops_value(listops_ids("[MAX 2 9 [MIN 4 7 ] 0 ]")) == 9);
  CHECK(listops_value(listops_ids("[MIN 2 9 [MIN 4 7 ] 3 ]")) == 2);
  CHECK(listops_value(listops_ids("[MED 1 2 3 4 ]")) == 2);  // np.median 2.5, int() -> 2
  CHECK(listops_value(listops_ids("[MED 9 0 5 ]")) == 5);
  CHECK(listops_value(listops_ids("[SM 5 6 7 ]")) == 8);     // 18 mod 10
  CHECK(listops_value(listops_ids("[MIN [MAX 1 2 ] [MED 9 0 5 ] [SM 9 9 ] ]")) == 2);  // min(2, 5, 8)
  CHECK(listops_text(listops_ids("[SM 5 [MAX 6 7 ] ]")) == "[SM 5 [MAX 6 7 ] ]");
  AG_CHECK_ERROR(listops_value(listops_ids("[MAX 2 9")), "incomplete");
  AG_CHECK_ERROR(listops_value(listops_ids("[MAX ]")), "empty ']'");
  AG_CHECK_ERROR(listops_value(listops_ids("2 3")), "after the end");
  AG_CHECK_ERROR(listops_value(std::vector<uint16_t>{0}), "not a ListOps token");
}

TEST_CASE("longseq: ListOps draws are reproducible, within their lengths, and their labels are their values") {
  std::mt19937_64 a(5), b(5);
  std::vector<int> seen(10, 0);
  for (int i = 0; i < 60; ++i) {
    const ListOpsExample x = draw_listops(a, 40, 300), y = draw_listops(b, 40, 300);
    CHECK(x.ids == y.ids);
    CHECK(x.ids.size() >= 40);
    CHECK(x.ids.size() <= 300);
    CHECK(x.value == listops_value(x.ids));
    CHECK(x.ids.front() >= 11);  // an operator at the root
    ++seen[size_t(x.value)];
  }
  CHECK(std::count(seen.begin(), seen.end(), 0) <= 3);  // the values spread over the digits
  TaskOptions t;
  t.listops_train = 30, t.listops_val = 5, t.listops_test = 7, t.listops_min_len = 20, t.listops_max_len = 100;
  const SeqSplits s = make_listops(t);
  CHECK(s.train.size() == 30);
  CHECK(s.val.size() == 5);
  CHECK(s.test.size() == 7);
  CHECK(s.train.vocab == 16);
  t.listops_train = 3;  // the test split does not depend on the size of the training split
  const SeqSplits s2 = make_listops(t);
  CHECK(s2.test.tokens == s.test.tokens);
  CHECK(s2.test.labels == s.test.labels);
  TempDir dir("longseq_tsv");
  write_listops_tsv(s2, dir.dir.string());
  const std::string tsv = read_bytes(dir.file("listops-test.tsv"));
  CHECK(tsv.rfind("Source\tTarget\n", 0) == 0);
  CHECK(std::count(tsv.begin(), tsv.end(), '\n') == 8);
}

TEST_CASE("longseq: the bible's books, their groups and disjoint passages") {
  // a pretty-printed text as the bible program writes it: headings, numbered verses, wrapped lines
  std::string pretty;
  for (int b = 0; b < 66; ++b)
    for (int c = 1; c <= 2; ++c)
      pretty += fmt::format("\nBook {} {}\n\n  1 Verse of {} {}, a line\nthat goes on.\n  12 And {}.\n", b, c, b, c, b);
  const std::vector<std::string> books = kjv_books(pretty);
  REQUIRE(books.size() == 66);
  CHECK(books[3] == "Verse of 3 1, a line that goes on. And 3. Verse of 3 2, a line that goes on. And 3.");
  AG_CHECK_ERROR(kjv_books("\nGenesis 1\n\n  1 In the beginning.\n"), "66 books", "found 1");
  AG_CHECK_ERROR(kjv_books("\nGenesis one\n"), "not a heading");
  // the canonical boundaries of the 8 groups
  const std::vector<std::pair<int, int>> edges = {{0, 0},  {4, 0},  {5, 1},  {16, 1}, {17, 2}, {21, 2},
                                                  {22, 3}, {26, 3}, {27, 4}, {38, 4}, {39, 5}, {43, 5},
                                                  {44, 6}, {56, 6}, {57, 7}, {65, 7}};
  for (auto [book, group] : edges) CHECK_MESSAGE(kjv_group_of(book) == group, "book ", book);
  AG_CHECK_ERROR(kjv_group_of(66), "book 66");
  // passages: consecutive, disjoint, k % 10 == 0 to test and == 5 to validation
  std::vector<std::string> text(66);
  text[0] = std::string(100, 'a');  // group 0: 100 bytes = 10 passages of 10
  for (int i = 0; i < 100; ++i) text[0][size_t(i)] = char('a' + i / 10);
  text[5] = std::string(25, 'z');  // group 1: 2 passages, the rest dropped
  const SeqSplits s = text_splits(text, 10);
  CHECK(s.test.size() == 2);   // group 0 passage 0, group 1 passage 0
  CHECK(s.val.size() == 1);    // group 0 passage 5
  CHECK(s.train.size() == 9);  // 8 of group 0, 1 of group 1
  CHECK(s.val.tokens[0] == uint16_t('f') + 1);  // passage 5 is "ffffffffff", bytes + 1
  CHECK(s.test.labels == std::vector<int64_t>{0, 1});
  CHECK(s.train.num_classes == 8);
  // random windows: group 0's training runs are passages 1-4 (bytes 10-49) and 6-9 (60-99), group
  // 1's is passage 1 (bytes 10-19) of its 20 whole bytes, at source offset 100
  REQUIRE(s.train.source.size() == 120);
  CHECK(s.train.window_lo == std::vector<int64_t>{10, 10, 10, 10, 60, 60, 60, 60, 110});
  CHECK(s.train.window_hi == std::vector<int64_t>{40, 40, 40, 40, 90, 90, 90, 90, 110});
  const SeqSplits fixed = text_splits(text, 10, /*random_windows=*/false);
  CHECK(fixed.train.source.empty());
  CHECK(fixed.train.tokens == s.train.tokens);
}

TEST_CASE("longseq: a random training window stays inside its run and follows the generator") {
  std::vector<std::string> text(66);
  text[0] = std::string(100, 'a');
  for (int i = 0; i < 100; ++i) text[0][size_t(i)] = char(1 + i);  // byte i is i + 1: token i + 2
  const SeqSplits s = text_splits(text, 10);
  const std::vector<int64_t> idx = {0, 3, 4, 7, 0, 3, 4, 7};
  // without a generator: the fixed passages 1, 4, 6, 9
  CHECK(make_batch(s.train, idx).tokens.to_vector<int64_t>()[10] == 4 * 10 + 2);
  Generator gen(7);
  std::set<int64_t> starts;
  for (int rep = 0; rep < 50; ++rep) {
    const uint64_t offset = gen.offset();
    const SeqBatch b = make_batch(s.train, idx, &gen);
    CHECK(gen.offset() == offset + idx.size());
    const auto tok = b.tokens.to_vector<int64_t>();
    REQUIRE(b.tokens.shape() == Shape{8, 10});
    CHECK(b.lengths.to_vector<int64_t>() == std::vector<int64_t>(8, 10));
    for (size_t r = 0; r < idx.size(); ++r) {
      const int64_t start = tok[r * 10] - 2;  // the byte offset the window starts at
      for (int64_t i = 0; i < 10; ++i) REQUIRE(tok[r * 10 + size_t(i)] == start + i + 2);  // contiguous
      const bool first_run = idx[r] < 4;
      CHECK(start >= (first_run ? 10 : 60));  // never passage 0 (test) or 5 (validation)
      CHECK(start <= (first_run ? 40 : 90));
      starts.insert(start);
    }
    // the same generator position gives the same windows
    Generator again(7);
    again.set_offset(offset);
    CHECK(make_batch(s.train, idx, &again).tokens.to_vector<int64_t>() == tok);
  }
  CHECK(starts.size() > 40);  // of the 62 possible starts: not a fixed set
}

TEST_CASE("longseq: pixel sequences keep the grid, and the validation images come from the training set") {
  TempDir dir("longseq_pixels");
  write_fashion_gz(dir.dir.string(), 40, 12);  // 8x8 images
  const SeqSplits s = pixel_splits("fashion-mnist", dir.dir.string(), 10);
  CHECK(s.train.size() == 30);
  CHECK(s.val.size() == 10);
  CHECK(s.test.size() == 12);
  CHECK(s.train.max_len == 64);
  CHECK(s.train.grid_h == 8);
  CHECK(s.train.vocab == 257);
  for (int64_t i = 0; i < s.train.size(); ++i) CHECK(s.train.lengths[size_t(i)] == 64);
  AG_CHECK_ERROR(pixel_splits("fashion-mnist", dir.dir.string(), 40), "--val-size 40");
}

TEST_CASE("longseq: a batch pads to its longest sequence, and block means pool a map") {
  SeqDataset ds;
  ds.max_len = 6, ds.vocab = 16, ds.num_classes = 10;
  ds.add(std::vector<uint16_t>{1, 2, 3}, 4);
  ds.add(std::vector<uint16_t>{5, 6, 7, 8, 9}, 7);
  const SeqBatch b = make_batch(ds, std::vector<int64_t>{0, 1});
  CHECK(b.tokens.shape() == Shape{2, 5});
  CHECK(b.tokens.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3, 0, 0, 5, 6, 7, 8, 9});
  CHECK(b.lengths.to_vector<int64_t>() == std::vector<int64_t>{3, 5});
  CHECK(b.labels.to_vector<int64_t>() == std::vector<int64_t>{4, 7});
  AG_CHECK_ERROR(ds.add(std::vector<uint16_t>{16}, 0), "token id 16");
  // 4x4 -> 2x2: the means of the four quadrants
  const Tensor m = from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, {4, 4});
  CHECK(block_means(m, 2).to_vector<double>() == std::vector<double>{3.5, 5.5, 11.5, 13.5});
  // 3x3 -> 2x2: cells of rows {0, 1}, {2} (i * 2 / 3) and the same columns
  const Tensor n = from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3});
  CHECK(block_means(n, 2).to_vector<double>() == std::vector<double>{3, 4.5, 7.5, 9});
  CHECK(block_means(n, 10).shape() == Shape{3, 3});
}

TEST_CASE("longseq: the model ignores padding, and a window as wide as the sequence is full attention") {
  LongSeqConfig c;
  c.vocab = 20, c.max_len = 12, c.classes = 3, c.d_model = 16, c.n_heads = 2, c.n_layers = 2, c.mlp_hidden = 24;
  Generator g1(3);
  LongSeqClassifier full(c, &g1);
  const Tensor lengths = from_vector<int64_t>({7, 12}, {2});
  std::vector<int64_t> tok(24);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = int64_t(1 + i % 19);
  const Tensor a = full.forward(from_vector<int64_t>(tok, {2, 12}), lengths);
  for (size_t i = 7; i < 12; ++i) tok[i] = 0;  // change what lies past the first sequence's length
  const Tensor b = full.forward(from_vector<int64_t>(tok, {2, 12}), lengths);
  check_close(a, b, 1e-6, 1e-6);
  // window >= T sees every key; window 1 does not
  c.attention = "window", c.window = 11;
  Generator g2(3);
  LongSeqClassifier wide(c, &g2);
  check_close(wide.forward(from_vector<int64_t>(tok, {2, 12}), lengths), b, 1e-6, 1e-6);
  c.window = 1;
  Generator g3(3);
  LongSeqClassifier narrow(c, &g3);
  const Tensor d = narrow.forward(from_vector<int64_t>(tok, {2, 12}), lengths);
  CHECK(max(abs(d - b)).item<double>() > 1e-4);
  c.attention = "linear";
  AG_CHECK_ERROR(LongSeqClassifier(c), "unknown attention method 'linear'");
}

TEST_CASE("longseq: sparse attention with every block kept is full attention, with few blocks it is not") {
  LongSeqConfig c;
  c.vocab = 20, c.max_len = 12, c.classes = 3, c.d_model = 16, c.n_heads = 2, c.n_layers = 2, c.mlp_hidden = 24;
  const Tensor lengths = from_vector<int64_t>({7, 12}, {2});
  std::vector<int64_t> tok(24);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = int64_t(1 + i % 19);
  const Tensor tokens = from_vector<int64_t>(tok, {2, 12});
  Generator g1(6);
  const Tensor full = LongSeqClassifier(c, &g1).forward(tokens, lengths);
  c.attention = "sparse", c.block = 4, c.window_blocks = 2, c.global_blocks = 0;  // 3 blocks, band +-2: all
  Generator g2(6);
  LongSeqClassifier all(c, &g2);
  check_close(all.forward(tokens, lengths), full, 1e-6, 1e-6);
  CHECK(all.blocks->size() == 2);
  CHECK((*all.blocks)[0].block_mask(12, Device::cpu()).shape() == Shape{3, 3});
  c.window_blocks = 0;  // the diagonal blocks alone
  Generator g3(6);
  LongSeqClassifier diag(c, &g3);
  // Equal functions agree within the 1e-6 + 1e-6 |logit| (logits below 0.3) checked above; another
  // function must differ by far more. At this initialisation (N(0, 0.02) weights, the attention's
  // output projection smaller still) the attention pattern moves the logits by about 1e-4, so the
  // bound is 1e-5: eight times the bound of equal functions.
  CHECK(max(abs(diag.forward(tokens, lengths) - full)).item<double>() > 1e-5);
  // and the pattern itself, on the composed path (need_weights; the same function as the fused
  // kernel: the materialise case below): a query of block 0 gives its keys in blocks 1 and 2 weight
  // 0 exactly, where the pattern keeping every block gives each a positive weight
  auto weights_to_later_blocks = [&](LongSeqClassifier& m) {
    LongSeqBlock& b0 = (*m.blocks)[0];
    b0.need_weights = true;
    m.forward(tokens, lengths);
    b0.need_weights = false;
    return b0.attn_weights.narrow(2, 0, 4).narrow(3, 4, 8).contiguous().to_vector<float>();  // (B, H, 4, 8)
  };
  for (float w : weights_to_later_blocks(diag)) REQUIRE(w == 0.0f);
  const std::vector<float> kept = weights_to_later_blocks(all);
  // sequence 0 has 7 tokens: its keys 7 to 11 are padding, hidden by the lengths (weight 0)
  for (size_t i = 0; i < kept.size(); ++i) {
    const size_t key = 4 + i % 8, seq = i / (2 * 4 * 8);
    CHECK((kept[i] > 0.0f) == (seq == 1 || key < 7));
  }
  c.sparse = "strided", c.stride_blocks = 1;  // stride 1 keeps every block
  Generator g4(6);
  check_close(LongSeqClassifier(c, &g4).forward(tokens, lengths), full, 1e-6, 1e-6);
  c.sparse = "dilated";
  AG_CHECK_ERROR(LongSeqClassifier(c), "unknown sparse pattern 'dilated'");
}

TEST_CASE("longseq: linformer and compressed attention ignore padding too, and axial needs a full grid") {
  LongSeqConfig c;
  c.vocab = 20, c.max_len = 12, c.classes = 3, c.d_model = 16, c.n_heads = 2, c.n_layers = 2, c.mlp_hidden = 24;
  c.k = 5, c.stride = 3;
  const Tensor lengths = from_vector<int64_t>({7, 12}, {2});
  std::vector<int64_t> tok(24);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = int64_t(1 + i % 19);
  for (const char* method : {"linformer", "compressed"}) {
    INFO(method);
    c.attention = method;
    Generator gen(4);
    LongSeqClassifier model(c, &gen);
    const std::string name = std::string("blocks.0.attn.") + (c.attention == "linformer" ? "E" : "compress_k.weight");
    const auto named = model.named_parameters();
    CHECK(std::any_of(named.begin(), named.end(), [&](const auto& p) { return p.first == name; }));
    std::vector<int64_t> t2 = tok;
    const Tensor a = model.forward(from_vector<int64_t>(t2, {2, 12}), lengths);
    for (size_t i = 7; i < 12; ++i) t2[i] = 3;
    const Tensor b = model.forward(from_vector<int64_t>(t2, {2, 12}), lengths);
    check_close(a, b, 1e-6, 1e-6);
  }
  c.attention = "axial";
  AG_CHECK_ERROR(LongSeqClassifier(c), "axial attention needs a grid of max_len = 12");
  c.grid_h = 3, c.grid_w = 4;
  Generator gen(5);
  LongSeqClassifier axial(c, &gen);
  CHECK(axial.forward(from_vector<int64_t>(tok, {2, 12})).shape() == Shape{2, 3});
  AG_CHECK_ERROR(axial.forward(from_vector<int64_t>(tok, {2, 12}), lengths), "axial attention takes no padding");
}

TEST_CASE("longseq: materialised attention is the fused function, holding the T x T weights") {
  LongSeqConfig c;
  c.vocab = 20, c.max_len = 64, c.classes = 3, c.d_model = 16, c.n_heads = 2, c.n_layers = 2, c.mlp_hidden = 24;
  c.block = 8, c.window_blocks = 1, c.global_blocks = 1;
  const int64_t B = 2, T = 64;
  const Tensor lengths = from_vector<int64_t>({40, 64}, {2});
  std::vector<int64_t> tok(size_t(B * T));
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = int64_t(1 + (i * 7) % 19);
  const Tensor tokens = from_vector<int64_t>(tok, {B, T});
  for (const char* method : {"full", "window", "sparse"}) {
    INFO(method);
    c.attention = method, c.window = 5;
    // logits, the gradient of the first qkv weight, and the peak bytes of forward + backward
    auto run = [&](bool materialise) {
      c.materialise = materialise;
      Generator gen(8);
      LongSeqClassifier model(c, &gen);
      const uint64_t base = alloc_stats(Device::cpu()).bytes_in_use;
      reset_peak_bytes(Device::cpu());
      const Tensor logits = model.forward(tokens, lengths);
      sum(logits * logits).backward();
      const double peak = double(alloc_stats(Device::cpu()).peak_bytes_in_use - base);
      return std::tuple{logits.detach(), (*model.blocks)[0].attn->qkv->weight.grad(), peak};
    };
    const auto [fused_logits, fused_grad, fused_peak] = run(false);
    const auto [mat_logits, mat_grad, mat_peak] = run(true);
    check_close(mat_logits, fused_logits, 1e-5, 1e-5);
    check_close(mat_grad, fused_grad, 1e-5, 1e-4);
    // at least one (B, H, T, T) f32 tensor per layer more: 32 KiB each here
    CHECK(mat_peak - fused_peak >= double(c.n_layers * B * c.n_heads * T * T * 4));
  }
  c.attention = "linformer", c.materialise = true;
  AG_CHECK_ERROR(LongSeqClassifier(c), "materialise applies to full, window and sparse attention, not to 'linformer'");
}

TEST_CASE("longseq: pos_embed is drawn once, N(0, 0.02), with the other weights") {
  // A draw of n numbers takes ceil(n / 4) Philox blocks of the generator (core/random.h). With
  // full attention only pos_embed (1, max_len, d) depends on max_len, so max_len 20 instead of 12
  // at d 16 draws 8 x 16 = 128 more numbers once: 32 blocks (a second draw would make it 64).
  LongSeqConfig c;
  c.vocab = 20, c.classes = 3, c.d_model = 16, c.n_heads = 2, c.n_layers = 2, c.mlp_hidden = 24;
  auto blocks_drawn = [&](int64_t max_len) {
    c.max_len = max_len;
    Generator gen(3);
    LongSeqClassifier model(c, &gen);
    return std::pair{gen.offset(), model.pos_embed.to_vector<double>()};
  };
  const uint64_t short_blocks = blocks_drawn(12).first;
  const auto [long_blocks, long_pos] = blocks_drawn(20);
  CHECK(long_blocks - short_blocks == 32);
  // the sample std of 320 draws of N(0, 0.02^2): within 3 of its relative spread 1 / sqrt(2 x 320)
  double sq = 0;
  for (double v : long_pos) sq += v * v;
  CHECK(std::abs(std::sqrt(sq / double(long_pos.size())) - 0.02) < 0.02 * 3 / std::sqrt(640.0));
}

TEST_CASE("longseq: the attention's q, k, v start at N(0, 1 / d), the other weights at GPT-2's N(0, 0.02)") {
  // the sample std of n draws of N(0, s^2) is within 3 of its relative spread 1 / sqrt(2 n) of s
  auto check_std = [](const std::string& name, const Tensor& p, double s) {
    double sq = 0;
    const std::vector<double> v = p.to_vector<double>();
    for (double x : v) sq += x * x;
    INFO(name);
    CHECK(std::abs(std::sqrt(sq / double(v.size())) - s) < s * 3 / std::sqrt(2.0 * double(v.size())));
  };
  LongSeqConfig c;
  c.vocab = 20, c.max_len = 16, c.classes = 3, c.d_model = 16, c.n_heads = 2, c.n_layers = 2, c.mlp_hidden = 24;
  c.grid_h = 4, c.grid_w = 4, c.k = 8;
  for (const std::string method : {"full", "linformer", "compressed", "axial"}) {
    c.attention = method;
    Generator gen(5);
    LongSeqClassifier model(c, &gen);
    int qkv = 0;
    for (const auto& [name, p] : model.named_parameters()) {
      if (name.ends_with("qkv.weight")) ++qkv, check_std(method + " " + name, p, 0.25);  // 1 / sqrt(16)
      if (name.ends_with("mlp.fc1.weight")) check_std(method + " " + name, p, 0.02);
    }
    CHECK(qkv == (method == "axial" ? 4 : 2));  // axial: a row and a column attention per block
  }
}

TEST_CASE("longseq: forward_backward, main's step: the mean cross-entropy, fresh gradients, the loss scale") {
  LongSeqConfig c;
  c.vocab = 20, c.max_len = 12, c.classes = 3, c.d_model = 16, c.n_heads = 2, c.n_layers = 2, c.mlp_hidden = 24;
  Generator gen(11);
  LongSeqClassifier model(c, &gen);
  optim::AdamW opt(model.parameters(), {});
  SeqDataset ds;
  ds.max_len = 12, ds.vocab = 20, ds.num_classes = 3;
  const std::vector<int64_t> lengths = {5, 12, 9}, labels = {2, 0, 1};
  for (size_t i = 0; i < 3; ++i) {
    std::vector<uint16_t> ids(size_t(lengths[i]));
    for (size_t j = 0; j < ids.size(); ++j) ids[j] = uint16_t(1 + (i * 7 + j * 5) % 19);
    ds.add(ids, labels[i]);
  }
  const SeqBatch batch = make_batch(ds, std::vector<int64_t>{0, 1, 2});
  model.eval();
  const double loss = forward_backward(model, opt, batch);
  CHECK(model.is_training());  // the step trains, whatever mode it found
  // The reference, by hand in f64 from the model's logits: loss = mean_b (lse_b - z_b[y_b]), and
  // the head's bias gets d loss / d bias_k = mean_b (softmax(z_b)_k - [k == y_b]).
  std::vector<double> z;
  {
    NoGradGuard no_grad;
    z = model.forward(batch.tokens, batch.lengths).to_vector<double>();
  }
  double ref = 0;
  std::vector<double> dbias(3, 0.0);
  for (size_t b = 0; b < 3; ++b) {
    const double m = std::max({z[b * 3], z[b * 3 + 1], z[b * 3 + 2]});
    const double lse = m + std::log(std::exp(z[b * 3] - m) + std::exp(z[b * 3 + 1] - m) + std::exp(z[b * 3 + 2] - m));
    ref += (lse - z[b * 3 + size_t(labels[b])]) / 3;
    for (size_t k = 0; k < 3; ++k) dbias[k] += (std::exp(z[b * 3 + k] - lse) - (int64_t(k) == labels[b])) / 3;
  }
  // f32 rounding of a log-sum-exp of 3 logits and a mean of 3: a few ulp of a loss near ln 3
  // (ulp 1.2e-7); the bias gradient's terms are below 1, so a few ulp of 1
  CHECK(std::abs(loss - ref) < 1e-6);
  check_close(model.head->bias.grad().to_vector<double>(), dbias, 1e-6, 0);
  // every gradient of one call, to compare the next calls with
  const std::vector<Tensor> params = model.parameters();
  std::vector<std::vector<float>> first;
  for (const Tensor& p : params) first.push_back(p.grad().to_vector<float>());
  // the gradients are zeroed first: a second call gives the same ones, not their sum
  CHECK(forward_backward(model, opt, batch) == loss);
  for (size_t i = 0; i < params.size(); ++i) CHECK_MESSAGE(params[i].grad().to_vector<float>() == first[i], i);
  // the loss scale multiplies every gradient (by 8, a power of two: exactly) but not the loss
  CHECK(forward_backward(model, opt, batch, 8.0) == loss);
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<float> times8 = first[i];
    for (float& g : times8) g *= 8;
    CHECK_MESSAGE(params[i].grad().to_vector<float>() == times8, i);
  }
}

TEST_CASE("longseq: the run's config reads back as the model and the task it was made of") {
  LongSeqConfig m;
  m.attention = "sparse", m.sparse = "strided", m.block = 16, m.stride_blocks = 3, m.d_model = 32, m.max_len = 300;
  TaskOptions t;
  t.task = "listops", t.data_seed = 9, t.listops_train = 30, t.listops_val = 4, t.listops_test = 5;
  t.listops_min_len = 20, t.listops_max_len = 300, t.val_size = 17, t.random_windows = false;
  const nlohmann::json j = run_config(m, t);
  CHECK(nlohmann::json(model_from_json(j, "c.safetensors")) == nlohmann::json(m));
  const TaskOptions back = task_from_json(j, "the-data");
  CHECK(run_config(m, back) == j);  // every task field
  CHECK(back.data_dir == "the-data");
  nlohmann::json no_task = j;
  no_task.erase("task");
  AG_CHECK_ERROR(task_from_json(no_task, ""), "no valid task entry");
  nlohmann::json bad_model = j;
  bad_model["n_heads"] = 5;  // does not divide d_model 32
  AG_CHECK_ERROR(model_from_json(bad_model, "c.safetensors"), "n_heads 5 does not divide d_model 32");
  bad_model["d_model"] = "wide";
  AG_CHECK_ERROR(model_from_json(bad_model, "c.safetensors"), "c.safetensors holds no longseq config");
}

TEST_CASE("longseq: the command line is checked before any data is read") {
  TaskOptions ok;
  CHECK_NOTHROW(validate_task_options(ok));
  TaskOptions t = ok;
  t.task = "images";
  check_usage_error([&] { validate_task_options(t); }, {"--task images"});
  t = ok, t.listops_min_len = 300, t.listops_max_len = 200;
  check_usage_error([&] { validate_task_options(t); }, {"--listops-min-len 300", "--listops-max-len 200"});
  t = ok, t.passage = 8;
  check_usage_error([&] { validate_task_options(t); }, {"--passage 8"});
  t = ok, t.val_size = -2;
  check_usage_error([&] { validate_task_options(t); }, {"--val-size -2"});
  // the model's options against the task's
  LongSeqConfig cfg;
  CHECK_NOTHROW(validate_command_line(cfg, ok, 0));
  cfg.n_heads = 3;
  check_usage_error([&] { validate_command_line(cfg, ok, 0); }, {"--heads 3", "--d-model 64"});
  cfg = {}, cfg.attention = "linformer", cfg.materialise = true;
  check_usage_error([&] { validate_command_line(cfg, ok, 0); }, {"--materialise", "not linformer"});
  cfg = {}, cfg.attention = "axial", t = ok, t.task = "listops";
  check_usage_error([&] { validate_command_line(cfg, t, 0); }, {"--attention axial", "ListOps"});
  t.task = "text";
  CHECK_NOTHROW(validate_command_line(cfg, t, 64));  // 2048 = 32 rows of 64
  check_usage_error([&] { validate_command_line(cfg, t, 100); }, {"--axial-width 100", "--passage 2048"});
  TempDir dir("longseq_cli");
  const std::string out = dir.file("run"), err = dir.file("stderr.txt");
  const std::string cmd = std::string("'") + ATTOGRAD_APP_DIR + "/longseq' --heads 3 --out '" + out +
                          "' --data-dir '" + dir.file("no-data") + "' > /dev/null 2> '" + err + "'";
  const int status = std::system(cmd.c_str());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == kExitUsage);
  CHECK(read_bytes(err) == "longseq: --heads 3 does not divide --d-model 64 (longseq --help lists every option)\n");
  CHECK_FALSE(std::filesystem::exists(out));
}

TEST_CASE("longseq: a tiny pixel run learns, writes its run directory, and its checkpoint evaluates") {
  TempDir dir("longseq_run");
  write_fashion_gz(dir.dir.string(), 200, 40);  // 8x8: 64 pixel tokens, 4 classes by brightness
  const std::string out = dir.file("run");
  const std::string cmd = std::string("'") + ATTOGRAD_APP_DIR + "/longseq' --task pixels --data-dir '" +
                          dir.dir.string() + "' --val-size 40 --steps 60 --batch 16 --d-model 16 --heads 2 "
                          "--layers 1 --mlp 32 --lr 3e-3 --threads 1 --quiet --out '" + out + "' > '" +
                          dir.file("stdout.txt") + "' 2>&1";
  const int status = std::system(cmd.c_str());
  INFO(read_bytes(dir.file("stdout.txt")));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  for (const char* f : {"checkpoint.safetensors", "metrics.jsonl", "curves.svg", "report.json", "attention.svg"})
    CHECK_MESSAGE(std::filesystem::exists(out + "/" + f), f);
  const nlohmann::json report = nlohmann::json::parse(read_bytes(out + "/report.json"));
  INFO(report.dump());
  CHECK(report.at("accuracy").get<double>() > 0.6);  // chance is 0.25
  const std::string svg = read_bytes(out + "/attention.svg");
  CHECK(svg.find("T = 64") != std::string::npos);

  // --eval-only: the same command evaluates the checkpoint to the run's test accuracy; an option of
  // the model with another value than the checkpoint's is refused, not ignored
  const std::string eval = std::string("'") + ATTOGRAD_APP_DIR + "/longseq' --task pixels --data-dir '" +
                           dir.dir.string() + "' --d-model 16 --heads 2 --layers 1 --mlp 32 --threads 1 --out '" +
                           out + "' --eval-only";
  const std::string eval_out = dir.file("eval.txt"), eval_err = dir.file("eval-err.txt");
  const auto run_eval = [&](const std::string& more) {
    const int s = std::system((eval + more + " > '" + eval_out + "' 2> '" + eval_err + "'").c_str());
    REQUIRE(WIFEXITED(s));
    return WEXITSTATUS(s);
  };
  REQUIRE(run_eval("") == 0);
  const std::string text = read_bytes(eval_out);
  INFO(text);
  const size_t at = text.find("test accuracy ");
  REQUIRE(at != std::string::npos);
  CHECK(std::strtod(text.c_str() + at + 14, nullptr) ==
        doctest::Approx(100 * report.at("accuracy").get<double>()).epsilon(1e-4));
  for (const auto& [more, option] : std::vector<std::pair<std::string, std::string>>{
           {" --materialise", "--materialise true"}, {" --attention window", "--attention window"}}) {
    CHECK(run_eval(more) == kExitUsage);
    CHECK(read_bytes(eval_err) ==
          fmt::format("longseq: {}: --eval-only evaluates the model as '{}/checkpoint.safetensors' saved it, with {}; "
                      "drop the option, or train a model with it (longseq --help lists every option)\n",
                      option, out, option == "--materialise true" ? "--materialise false" : "--attention full"));
  }
}
