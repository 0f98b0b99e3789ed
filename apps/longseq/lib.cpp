#include "apps/longseq/lib.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <sstream>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "apps/common/plot.h"
#include "apps/common/run.h"
#include "autograd/ops.h"
#include "autograd/tape.h"
#include "core/error.h"
#include "core/kernels.h"
#include "data/images.h"
#include "data/text.h"
#include "dist/dist.h"

namespace ag::apps::longseq {

void SeqDataset::add(std::span<const uint16_t> ids, int64_t label) {
  check(int64_t(ids.size()) >= 1 && int64_t(ids.size()) <= max_len, "longseq: a sequence of {} tokens (max_len {})",
        ids.size(), max_len);
  check(label >= 0 && label < num_classes, "longseq: label {} outside [0, {})", label, num_classes);
  const size_t at = tokens.size();
  tokens.resize(at + size_t(max_len), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    check(ids[i] >= 1 && ids[i] < vocab, "longseq: token id {} outside [1, {})", ids[i], vocab);
    tokens[at + i] = ids[i];
  }
  lengths.push_back(int64_t(ids.size()));
  labels.push_back(label);
}

// ---- the tasks ---------------------------------------------------------------------------------

const std::vector<std::string>& longseq_tasks() {
  static const std::vector<std::string> names = {"pixels", "listops", "text"};
  return names;
}

void validate_task_options(const TaskOptions& t) {
  const auto& tasks = longseq_tasks();
  usage_check(std::find(tasks.begin(), tasks.end(), t.task) != tasks.end(),
              "longseq: --task {}: expected one of {}", t.task, fmt::join(tasks, ", "));
  usage_check(t.dataset == "fashion-mnist" || t.dataset == "mnist" || t.dataset == "cifar10",
              "longseq: --dataset {}: expected fashion-mnist, mnist or cifar10", t.dataset);
  usage_check(t.val_size >= -1, "longseq: --val-size {}: expected -1 (10% of the training set) or a count >= 0",
              t.val_size);
  usage_check(t.listops_train >= 1 && t.listops_val >= 1 && t.listops_test >= 1,
              "longseq: --listops-train {}, --listops-val {}, --listops-test {}: each must be at least 1",
              t.listops_train, t.listops_val, t.listops_test);
  usage_check(t.listops_max_len >= 5 && t.listops_min_len >= 1 && t.listops_min_len <= t.listops_max_len,
              "longseq: --listops-min-len {} and --listops-max-len {}: expected 1 <= min <= max and max >= 5",
              t.listops_min_len, t.listops_max_len);
  usage_check(t.passage >= 16, "longseq: --passage {}: expected at least 16 bytes", t.passage);
}

void validate_command_line(const LongSeqConfig& cfg, const TaskOptions& t, int64_t axial_width) {
  validate_task_options(t);
  usage_check(cfg.d_model % cfg.n_heads == 0, "longseq: --heads {} does not divide --d-model {}", cfg.n_heads,
              cfg.d_model);
  usage_check(!cfg.materialise || cfg.attention == "full" || cfg.attention == "window" || cfg.attention == "sparse",
              "longseq: --materialise applies to --attention full, window or sparse, not {}", cfg.attention);
  usage_check(cfg.attention != "axial" || t.task != "listops",
              "longseq: --attention axial needs sequences that fill a grid; ListOps expressions vary in length");
  usage_check(cfg.attention != "axial" || t.task != "text" || axial_width == 0 || t.passage % axial_width == 0,
              "longseq: --axial-width {} does not divide --passage {}", axial_width, t.passage);
}

SeqSplits load_task(const TaskOptions& t, const std::string& out_dir) {
  if (t.task == "pixels") {
    const std::string dir = !t.data_dir.empty()                ? t.data_dir
                            : t.dataset == "fashion-mnist"     ? std::string(data::kFashionMnistDir)
                                                               : "data/" + t.dataset;
    return pixel_splits(t.dataset, dir, t.val_size);
  }
  if (t.task == "listops") {
    SeqSplits s = make_listops(t);
    if (!out_dir.empty()) write_listops_tsv(s, out_dir);
    return s;
  }
  if (t.task == "text") {
    const std::string cache = t.data_dir.empty() ? default_cache_dir() : t.data_dir;
    if (::access("/usr/bin/bible", X_OK) != 0 && !std::filesystem::exists(cache + "/bible-kjv.txt"))
      throw data::DatasetNotFound("longseq: the text task reads the King James Bible: install the Debian package "
                                  "bible-kjv (apt install bible-kjv)");
    return text_splits(kjv_books(data::load_bible_kjv(cache)), t.passage, t.random_windows);
  }
  fail("longseq: unknown task '{}'", t.task);
}

// ---- pixels ------------------------------------------------------------------------------------

SeqSplits pixel_splits(const std::string& dataset, const std::string& dir, int64_t val_size) {
  data::ImageSplits images = dataset == "fashion-mnist" ? data::load_fashion_mnist(dir)
                             : dataset == "mnist"       ? data::load_mnist(dir)
                                                        : data::load_cifar10(dir);
  const data::ImageDataset& tr = images.train;
  val_size = validation_size(val_size, tr.size());
  auto empty = [&](const data::ImageDataset& ds) {
    SeqDataset s;
    s.grid_h = ds.height, s.grid_w = ds.width;
    s.max_len = int64_t(ds.height) * ds.width;
    s.vocab = 257;
    s.num_classes = ds.num_classes;
    s.class_names = ds.class_names;
    return s;
  };
  // grey levels (the mean of the channels, rounded) + 1, row by row
  auto to_ids = [](const data::ImageDataset& ds, int64_t i, std::vector<uint16_t>& ids) {
    const int64_t hw = int64_t(ds.height) * ds.width;
    const uint8_t* px = ds.image(i);
    ids.assign(size_t(hw), 0);
    for (int64_t p = 0; p < hw; ++p) {
      int sum = 0;
      for (int c = 0; c < ds.channels; ++c) sum += px[c * hw + p];
      ids[size_t(p)] = uint16_t((sum + ds.channels / 2) / ds.channels + 1);
    }
  };
  SeqSplits s{empty(tr), empty(tr), empty(images.test)};
  // the validation images: the last val_size of a fixed permutation of the training set
  std::vector<int64_t> order(size_t(tr.size()));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::mt19937_64 rng(20201108);  // fixed: the same held-out images in every run
  for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[size_t(rng() % (i + 1))]);
  std::vector<uint16_t> ids;
  for (size_t k = 0; k < order.size(); ++k) {
    to_ids(tr, order[k], ids);
    (int64_t(k) < tr.size() - val_size ? s.train : s.val).add(ids, tr.labels[size_t(order[k])]);
  }
  for (int64_t i = 0; i < images.test.size(); ++i) {
    to_ids(images.test, i, ids);
    s.test.add(ids, images.test.labels[size_t(i)]);
  }
  return s;
}

// ---- ListOps -----------------------------------------------------------------------------------

namespace {
constexpr uint16_t kMax = 11, kMin = 12, kMed = 13, kSum = 14, kEnd = 15, kListOpsVocab = 16;

uint64_t below(std::mt19937_64& rng, uint64_t n) { return rng() % n; }
double unit(std::mt19937_64& rng) { return double(rng() >> 11) * (1.0 / 9007199254740992.0); }

// appends a tree; stops early (returns false) once the expression is longer than `limit`
bool draw_tree(std::mt19937_64& rng, int depth, int max_depth, int max_args, std::vector<uint16_t>& out,
               size_t limit) {
  if (out.size() > limit) return false;
  if (depth >= max_depth || unit(rng) > 0.25) {  // a digit
    out.push_back(uint16_t(1 + below(rng, 10)));
    return true;
  }
  const uint64_t args = 2 + below(rng, uint64_t(max_args - 1));  // 2 .. max_args
  const uint16_t op = uint16_t(kMax + below(rng, 4));
  // LRA draws the arguments first, then the operator; the order only changes which expressions a
  // seed gives, not their distribution
  out.push_back(op);
  for (uint64_t a = 0; a < args; ++a)
    if (!draw_tree(rng, depth + 1, max_depth, max_args, out, limit)) return false;
  out.push_back(kEnd);
  return true;
}
}  // namespace

const std::vector<std::string>& listops_vocab() {
  static const std::vector<std::string> v = {"<pad>", "0", "1", "2", "3", "4", "5", "6", "7",
                                             "8",     "9", "[MAX", "[MIN", "[MED", "[SM", "]"};
  return v;
}

ListOpsExample draw_listops(std::mt19937_64& rng, int64_t min_len, int64_t max_len, int max_depth, int max_args) {
  check(min_len >= 1 && min_len <= max_len && max_depth >= 1 && max_args >= 2,
        "draw_listops: min_len {}, max_len {}, max_depth {}, max_args {} are out of range", min_len, max_len,
        max_depth, max_args);
  ListOpsExample e;
  for (int64_t tries = 0;; ++tries) {
    check(tries < 10'000'000, "draw_listops: no expression of {} to {} tokens in 10 million draws", min_len, max_len);
    e.ids.clear();
    // the root is at depth 1, as LRA's
    if (draw_tree(rng, 1, max_depth, max_args, e.ids, size_t(max_len)) && int64_t(e.ids.size()) >= min_len &&
        int64_t(e.ids.size()) <= max_len)
      break;
  }
  e.value = listops_value(e.ids);
  return e;
}

int listops_value(std::span<const uint16_t> ids) {
  std::vector<std::pair<uint16_t, std::vector<int>>> stack;  // open operators with their arguments
  std::optional<int> result;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint16_t t = ids[i];
    check(!result, "listops_value: tokens after the end of the expression (at {})", i);
    if (t >= 1 && t <= 10) {
      if (stack.empty())
        result = t - 1;
      else
        stack.back().second.push_back(t - 1);
    } else if (t >= kMax && t <= kSum) {
      stack.push_back({t, {}});
    } else if (t == kEnd) {
      check(!stack.empty() && !stack.back().second.empty(), "listops_value: an unmatched or empty ']' at {}", i);
      auto [op, args] = std::move(stack.back());
      stack.pop_back();
      int v = 0;
      if (op == kMax) {
        v = *std::max_element(args.begin(), args.end());
      } else if (op == kMin) {
        v = *std::min_element(args.begin(), args.end());
      } else if (op == kMed) {
        std::sort(args.begin(), args.end());
        const size_t n = args.size();
        v = n % 2 ? args[n / 2] : (args[n / 2 - 1] + args[n / 2]) / 2;  // np.median, then int()
      } else {
        v = std::accumulate(args.begin(), args.end(), 0) % 10;
      }
      if (stack.empty())
        result = v;
      else
        stack.back().second.push_back(v);
    } else {
      fail("listops_value: token id {} at {} is not a ListOps token", t, i);
    }
  }
  check(result.has_value() && stack.empty(), "listops_value: the expression is incomplete");
  return *result;
}

std::string listops_text(std::span<const uint16_t> ids) {
  std::string s;
  for (uint16_t t : ids) {
    check(t >= 1 && t < kListOpsVocab, "listops_text: token id {} is not a ListOps token", t);
    if (!s.empty()) s += ' ';
    s += listops_vocab()[t];
  }
  return s;
}

SeqSplits make_listops(const TaskOptions& t) {
  auto empty = [&] {
    SeqDataset s;
    s.max_len = t.listops_max_len;
    s.vocab = kListOpsVocab;
    s.num_classes = 10;
    for (int d = 0; d < 10; ++d) s.class_names.push_back(std::to_string(d));
    return s;
  };
  SeqSplits s{empty(), empty(), empty()};
  // one stream per split, so the test set does not change with --listops-train
  const std::pair<SeqDataset*, int64_t> parts[] = {{&s.train, t.listops_train}, {&s.val, t.listops_val},
                                                   {&s.test, t.listops_test}};
  for (size_t p = 0; p < 3; ++p) {
    std::mt19937_64 rng(t.data_seed * 3 + p + 1);
    for (int64_t i = 0; i < parts[p].second; ++i) {
      const ListOpsExample e = draw_listops(rng, t.listops_min_len, t.listops_max_len);
      parts[p].first->add(e.ids, e.value);
    }
  }
  return s;
}

void write_listops_tsv(const SeqSplits& s, const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::pair<const SeqDataset*, const char*> parts[] = {{&s.train, "train"}, {&s.val, "val"}, {&s.test, "test"}};
  for (const auto& [ds, name] : parts) {
    std::string text = "Source\tTarget\n";
    for (int64_t i = 0; i < ds->size(); ++i) {
      const uint16_t* row = ds->tokens.data() + i * ds->max_len;
      text += listops_text({row, size_t(ds->lengths[size_t(i)])}) + "\t" + std::to_string(ds->labels[size_t(i)]) + "\n";
    }
    write_file_atomic(fmt::format("{}/listops-{}.tsv", dir, name), text);
  }
}

// ---- text --------------------------------------------------------------------------------------

const std::vector<std::string>& kjv_groups() {
  static const std::vector<std::string> g = {"law",      "history", "wisdom",  "major prophets",
                                             "minor prophets", "gospels and acts", "paul", "other letters and revelation"};
  return g;
}

int kjv_group_of(int book) {
  check(book >= 0 && book < 66, "kjv_group_of: book {} is outside [0, 66)", book);
  // the first book of each group, in canonical order: Genesis, Joshua, Job, Isaiah, Hosea,
  // Matthew, Romans, Hebrews
  static const int first[] = {0, 5, 17, 22, 27, 39, 44, 57};
  int g = 0;
  while (g + 1 < 8 && book >= first[g + 1]) ++g;
  return g;
}

std::vector<std::string> kjv_books(const std::string& pretty) {
  std::vector<std::string> books;
  std::string current_name;
  std::istringstream in(pretty);
  std::string line;
  bool prev_blank = true;
  while (std::getline(in, line)) {
    if (line.empty()) {
      prev_blank = true;
      continue;
    }
    if (prev_blank && line[0] != ' ') {  // a heading: "<book> <chapter>"
      const size_t sp = line.rfind(' ');
      check(sp != std::string::npos && sp + 1 < line.size() &&
                std::all_of(line.begin() + long(sp) + 1, line.end(), [](char c) { return c >= '0' && c <= '9'; }),
            "kjv_books: a line after a blank line is not a heading '<book> <chapter>': '{}'", line);
      const std::string name = line.substr(0, sp);
      if (name != current_name) books.emplace_back(), current_name = name;
      prev_blank = false;
      continue;
    }
    prev_blank = false;
    check(!books.empty(), "kjv_books: text before the first heading: '{}'", line);
    size_t i = 0;
    if (line[0] == ' ') {  // "  12 verse text": drop the number
      while (i < line.size() && line[i] == ' ') ++i;
      while (i < line.size() && line[i] >= '0' && line[i] <= '9') ++i;
      while (i < line.size() && line[i] == ' ') ++i;
    }
    std::string& b = books.back();
    if (!b.empty()) b += ' ';
    b.append(line, i, std::string::npos);
  }
  check(books.size() == 66, "kjv_books: expected the 66 books of the bible, found {}", books.size());
  return books;
}

SeqSplits text_splits(const std::vector<std::string>& books, int64_t passage, bool random_windows) {
  check(books.size() == 66, "text_splits: expected 66 books, got {}", books.size());
  check(passage >= 1, "text_splits: passage {} must be >= 1", passage);
  std::vector<std::string> groups(8);
  for (int b = 0; b < 66; ++b) {
    if (books[size_t(b)].empty()) continue;
    std::string& g = groups[size_t(kjv_group_of(b))];
    if (!g.empty()) g += ' ';
    g += books[size_t(b)];
  }
  auto empty = [&] {
    SeqDataset s;
    s.max_len = passage;
    s.vocab = 257;
    s.num_classes = 8;
    s.class_names = kjv_groups();
    return s;
  };
  SeqSplits s{empty(), empty(), empty()};
  auto split_of = [](int64_t k) { return k % 10 == 0 ? 0 : k % 10 == 5 ? 1 : 2; };  // test, val, train
  std::vector<uint16_t> ids(static_cast<size_t>(passage));
  for (int g = 0; g < 8; ++g) {
    const std::string& text = groups[size_t(g)];
    const int64_t n = int64_t(text.size()) / passage;  // whole passages; the tail is dropped
    const int64_t base = int64_t(s.train.source.size());
    if (random_windows)
      for (int64_t i = 0; i < n * passage; ++i) s.train.source.push_back(uint16_t(uint8_t(text[size_t(i)]) + 1));
    for (int64_t k = 0; k < n; ++k) {
      for (int64_t i = 0; i < passage; ++i) ids[size_t(i)] = uint16_t(uint8_t(text[size_t(k * passage + i)]) + 1);
      const int split = split_of(k);
      (split == 0 ? s.test : split == 1 ? s.val : s.train).add(ids, g);
      if (split != 2 || !random_windows) continue;
      int64_t first = k, last = k;  // the run of training passages around k
      while (first > 0 && split_of(first - 1) == 2) --first;
      while (last + 1 < n && split_of(last + 1) == 2) ++last;
      s.train.window_lo.push_back(base + first * passage);
      s.train.window_hi.push_back(base + last * passage);  // the last start whose window stays in the run
    }
  }
  return s;
}

// ---- batches, training, evaluation -------------------------------------------------------------

SeqBatch make_batch(const SeqDataset& ds, std::span<const int64_t> indices, Generator* gen) {
  check(!indices.empty(), "longseq: an empty batch");
  const bool windows = gen != nullptr && !ds.source.empty();
  check(!windows || (ds.window_lo.size() == size_t(ds.size()) && ds.window_hi.size() == size_t(ds.size())),
        "longseq: {} window ranges for {} sequences", ds.window_lo.size(), ds.size());
  int64_t T = 0;
  for (int64_t i : indices) {
    check(i >= 0 && i < ds.size(), "longseq: index {} outside the split of {}", i, ds.size());
    T = std::max(T, ds.lengths[size_t(i)]);
  }
  const int64_t B = int64_t(indices.size());
  uint64_t seed = 0, offset = 0;
  if (windows) seed = gen->seed(), offset = gen->advance(uint64_t(B));
  std::vector<int64_t> tok(static_cast<size_t>(B * T)), len(static_cast<size_t>(B)), lab(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t i = indices[size_t(b)];
    const uint16_t* row = ds.tokens.data() + i * ds.max_len;
    if (windows) {  // a window is a whole passage: lengths[i] == max_len == T
      const int64_t lo = ds.window_lo[size_t(i)], hi = ds.window_hi[size_t(i)];
      check(lo >= 0 && lo <= hi && hi + ds.max_len <= int64_t(ds.source.size()) && ds.lengths[size_t(i)] == ds.max_len,
            "longseq: window range [{}, {}] of sequence {} outside the source of {}", lo, hi, i, ds.source.size());
      const Philox4 r = philox4x32_10(seed, offset + uint64_t(b));
      const uint64_t draw = (uint64_t(r.v[0]) << 32) | r.v[1];
      row = ds.source.data() + lo + int64_t(draw % uint64_t(hi - lo + 1));
    }
    std::copy(row, row + T, tok.begin() + b * T);
    len[size_t(b)] = ds.lengths[size_t(i)];
    lab[size_t(b)] = ds.labels[size_t(i)];
  }
  return {from_vector<int64_t>(tok, {B, T}), from_vector<int64_t>(len, {B}), from_vector<int64_t>(lab, {B})};
}

std::unique_ptr<data::DataLoader<SeqBatch>> make_train_loader(const SeqDataset& train, int64_t batch, uint64_t seed,
                                                              int64_t start_step, int prefetch, int shard_rank,
                                                              int shard_count) {
  check(batch >= 1 && batch <= train.size(), "longseq: batch {} must be in [1, {}] (the training set's size)", batch,
        train.size());
  data::LoaderOptions lo;
  lo.batch_size = batch;
  lo.seed = seed;
  lo.drop_last = true;
  lo.prefetch = prefetch;
  lo.shard_rank = shard_rank, lo.shard_count = shard_count;
  // the random windows of each step's batch, this rank's part of them (data::StepDraws, as vit's crops)
  auto make = [&train, draws = data::StepDraws(seed + 1, batch, data::shard(batch, shard_rank, shard_count).begin,
                                               start_step)](std::span<const int64_t> indices) mutable {
    Generator gen = draws.next();
    return make_batch(train, indices, &gen);
  };
  auto loader = std::make_unique<data::DataLoader<SeqBatch>>(train.size(), lo, make);
  loader->seek(start_step);
  return loader;
}

double forward_backward(LongSeqClassifier& model, optim::Optimizer& opt, const SeqBatch& batch, double loss_scale) {
  model.train();
  const Tensor logits = model.forward(batch.tokens, batch.lengths);  // (B, K)
  const Tensor loss = cross_entropy(logits, batch.labels.to(logits.device()));
  return compute_gradients(opt, loss, loss_scale);
}

EvalResult evaluate(LongSeqClassifier& model, const SeqDataset& ds, int64_t batch, int64_t limit, bool sharded) {
  const int64_t n = limit > 0 ? std::min(limit, ds.size()) : ds.size();
  return evaluate_classifier(model, n, batch, sharded, ConfusionMatrix(ds.class_names),
                             [&](std::span<const int64_t> indices) {
                               const SeqBatch b = make_batch(ds, indices);
                               return std::pair{model.forward(b.tokens, b.lengths), b.labels};
                             });
}

Tensor block_means(const Tensor& weights, int64_t cells) {
  check(weights.ndim() == 2 && weights.size(0) >= 1 && weights.size(1) >= 1 && cells >= 1,
        "block_means: expected (T, T) weights and cells >= 1, got {} and {}", weights.shape(), cells);
  NoGradGuard no_grad;
  const int64_t R = weights.size(0), C = weights.size(1), cr = std::min(cells, R), cc = std::min(cells, C);
  const Tensor w = weights.to(Device::cpu()).to(DType::f64).contiguous();
  const double* p = w.data<double>();
  std::vector<double> sum(size_t(cr * cc), 0.0), count(size_t(cr * cc), 0.0);
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) {
      const size_t cell = size_t((i * cr / R) * cc + j * cc / C);  // cells of near-equal size
      sum[cell] += p[i * C + j];
      count[cell] += 1;
    }
  for (size_t k = 0; k < sum.size(); ++k) sum[k] /= count[k];
  return from_vector<double>(sum, {cr, cc});
}

std::optional<std::string> attention_heatmap_svg(LongSeqClassifier& model, const SeqDataset& ds, int64_t n,
                                                 int64_t cells) {
  check(n >= 1 && ds.size() >= 1, "longseq: the heatmap needs sequences, got n {} of {}", n, ds.size());
  const auto& last = (*model.blocks)[model.blocks->size() - 1];
  std::vector<int64_t> idx(size_t(std::min(n, ds.size())));
  std::iota(idx.begin(), idx.end(), int64_t(0));
  const SeqBatch b = make_batch(ds, idx);
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  for (const auto& block : *model.blocks) block->need_weights = block.get() == &last;
  model.forward(b.tokens, b.lengths);
  Tensor w = last.attn_weights;  // (B, H, T, T)
  for (const auto& block : *model.blocks) block->need_weights = false, block->attn_weights = Tensor();
  model.train(was_training);
  if (!w.defined()) return std::nullopt;
  const Tensor avg = mean(w, {0, 1});  // (T, keys): over the sequences and the heads
  const Tensor pooled = block_means(avg, cells);
  const int64_t T = avg.size(0), K = avg.size(1), rows = pooled.size(0), cols = pooled.size(1);
  std::vector<std::string> row_labels, col_labels;
  for (int64_t r = 0; r < rows; ++r) row_labels.push_back(std::to_string(r * T / rows));
  for (int64_t c = 0; c < cols; ++c) col_labels.push_back(std::to_string(c * K / cols));
  const char* keys = model.cfg.attention == "linformer"    ? "projected keys"
                     : model.cfg.attention == "compressed" ? "compressed keys"
                                                           : "keys";
  const Heatmap h = heatmap_from_tensor(
      pooled,
      fmt::format("last block, mean over {} heads and {} sequences; a cell = about {} queries x {} {} (query rows, "
                  "key columns)",
                  w.size(1), w.size(0), (T + rows - 1) / rows, (K + cols - 1) / cols, keys),
      row_labels, col_labels);
  HeatmapOptions o;
  o.title = fmt::format("longseq attention ({}), T = {}, {} {}", model.cfg.attention, T, K, keys);
  o.columns = 1;
  o.cell = int(std::max<int64_t>(6, 640 / std::max(rows, cols)));
  return svg_heatmaps({h}, o);
}

void write_heatmap(LongSeqClassifier& model, const SeqDataset& ds, int64_t n, const std::string& dir) {
  if (auto svg = attention_heatmap_svg(model, ds, n)) {
    write_file_atomic(dir + "/attention.svg", *svg);
    fmt::print("attention of the last block: {}/attention.svg\n", dir);
  }
}

// ---- the run -----------------------------------------------------------------------------------

nlohmann::json run_config(const LongSeqConfig& model, const TaskOptions& t) {
  nlohmann::json j = model;
  j["task"] = {{"task", t.task},
               {"dataset", t.dataset},
               {"val_size", t.val_size},
               {"data_seed", t.data_seed},
               {"listops", {t.listops_train, t.listops_val, t.listops_test, t.listops_min_len, t.listops_max_len}},
               {"passage", t.passage},
               {"random_windows", t.random_windows}};
  return j;
}

LongSeqConfig model_from_json(const nlohmann::json& j, const std::string& file) {
  LongSeqConfig cfg;
  try {
    cfg = j.get<LongSeqConfig>();
  } catch (const nlohmann::json::exception& e) {
    fail("longseq: {} holds no longseq config ({})", file, e.what());
  }
  check_config(cfg);
  return cfg;
}

TaskOptions task_from_json(const nlohmann::json& j, const std::string& data_dir) {
  TaskOptions t;
  try {
    const nlohmann::json& k = j.at("task");
    t.task = k.at("task").get<std::string>();
    t.dataset = k.at("dataset").get<std::string>();
    t.val_size = k.at("val_size").get<int64_t>();
    t.data_seed = k.at("data_seed").get<uint64_t>();
    const auto l = k.at("listops").get<std::vector<int64_t>>();
    check(l.size() == 5, "longseq: the checkpoint's listops entry has {} values, expected 5", l.size());
    t.listops_train = l[0], t.listops_val = l[1], t.listops_test = l[2], t.listops_min_len = l[3];
    t.listops_max_len = l[4];
    t.passage = k.at("passage").get<int64_t>();
    t.random_windows = k.value("random_windows", false);  // checkpoints from before the option: fixed passages
  } catch (const nlohmann::json::exception& e) {
    fail("longseq: the checkpoint's config has no valid task entry ({}): {}", e.what(), j.dump());
  }
  t.data_dir = data_dir;
  validate_task_options(t);
  return t;
}

const std::vector<SavedOption>& longseq_saved_options() {
  static const std::vector<SavedOption> options = {
      {"--task", "/task/task"},          {"--attention", "/attention"},
      {"--window", "/window"},           {"--sparse", "/sparse"},
      {"--block", "/block"},             {"--window-blocks", "/window_blocks"},
      {"--global-blocks", "/global_blocks"}, {"--stride-blocks", "/stride_blocks"},
      {"--materialise", "/materialise"}, {"--k", "/k"},
      {"--stride", "/stride"},           {"--dataset", "/task/dataset"},
      {"--val-size", "/task/val_size"},  {"--data-seed", "/task/data_seed"},
      {"--listops-train", "/task/listops/0"}, {"--listops-val", "/task/listops/1"},
      {"--listops-test", "/task/listops/2"}, {"--listops-min-len", "/task/listops/3"},
      {"--listops-max-len", "/task/listops/4"}, {"--passage", "/task/passage"},
      {"--fixed-passages", "/task/random_windows"}, {"--d-model", "/d_model"},
      {"--heads", "/n_heads"},           {"--layers", "/n_layers"},
      {"--mlp", "/mlp_hidden"}};
  return options;
}

int64_t axial_width_for(int64_t n) {
  int64_t w = 1;
  while (w * w < n) ++w;
  while (n % w != 0) ++w;
  return w;
}

void fit_model_to_data(LongSeqConfig& cfg, const SeqDataset& train, int64_t axial_width) {
  cfg.vocab = train.vocab;
  cfg.max_len = train.max_len;
  cfg.classes = train.num_classes;
  if (cfg.attention == "axial") {
    if (train.grid_h > 0) {
      cfg.grid_h = train.grid_h, cfg.grid_w = train.grid_w;
    } else {
      cfg.grid_w = axial_width > 0 ? axial_width : axial_width_for(cfg.max_len);
      cfg.grid_h = cfg.max_len / cfg.grid_w;
    }
  }
  check_config(cfg);
}

std::string fit_patience_to_data(RunOptions& o, int64_t n_train) {
  const bool small = n_train < kSmallTrainSet;
  const std::string size = fmt::format("{} training sequences{}", n_train,
                                       small ? fmt::format(" (< {}: a small set)", kSmallTrainSet) : "");
  return resolve_patience(o, small, size);
}

namespace {

// the method's settings, as the run's line shows them
std::string method_text(const LongSeqConfig& c) {
  std::string s;
  if (c.attention == "window") s = fmt::format(" (+-{} tokens)", c.window);
  if (c.attention == "sparse" && c.sparse == "strided")
    s = fmt::format(" (strided, blocks of {}, stride {} blocks)", c.block, c.stride_blocks);
  else if (c.attention == "sparse")
    s = fmt::format(" (local-global, blocks of {}, +-{} blocks, {} global)", c.block, c.window_blocks,
                    c.global_blocks);
  if (c.attention == "linformer") s = fmt::format(" (k {})", c.k);
  if (c.attention == "compressed") s = fmt::format(" (stride {})", c.stride);
  if (c.attention == "axial") s = fmt::format(" ({} x {} grid)", c.grid_h, c.grid_w);
  return c.materialise ? s + ", materialised (T x T weights stored)" : s;
}

}  // namespace

std::string describe_run(const LongSeqConfig& cfg, const TaskOptions& t, const SeqSplits& data) {
  return fmt::format("longseq: {}{} ({} train / {} validation / {} test sequences, up to {} tokens, {} classes), "
                     "{} attention{}, d_model {}, {} heads, {} layers, MLP {}",
                     t.task, t.task == "pixels" ? " " + t.dataset : "", data.train.size(), data.val.size(),
                     data.test.size(), cfg.max_len, cfg.classes, cfg.attention, method_text(cfg), cfg.d_model,
                     cfg.n_heads, cfg.n_layers, cfg.mlp_hidden);
}

}  // namespace ag::apps::longseq
