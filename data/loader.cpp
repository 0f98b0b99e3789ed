// DataLoader's order and the text batch makers (data/loader.h has the formulas).
// Shapes: N dataset size, B batch size, T sequence length (after padding / window length).
#include "data/loader.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/kernels.h"

namespace ag::data {

Range shard(int64_t n, int part, int parts) {
  check(parts >= 1 && part >= 0 && part < parts, "shard: part {} of {}", part, parts);
  check(n >= 0, "shard: {} items", n);
  const int64_t base = n / parts, extra = n % parts;
  const int64_t begin = part * base + std::min<int64_t>(part, extra);
  return {begin, begin + base + (part < extra ? 1 : 0)};
}

namespace {

// 64 random bits: the first two lanes of one Philox block.
uint64_t philox_u64(uint64_t key, uint64_t counter) {
  Philox4 r = philox4x32_10(key, counter);
  return uint64_t(r.v[0]) | uint64_t(r.v[1]) << 32;
}

constexpr int kEpochShift = 40;  // counter = epoch << 40 | draw: 2^40 draws per epoch, 2^24 epochs
constexpr uint64_t kWindowKey = 0x9E3779B97F4A7C15ull;

}  // namespace

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, uint64_t epoch) {
  check(n >= 0 && n < (int64_t(1) << kEpochShift), "epoch_permutation: n must be in [0, 2^40), got {}", n);
  check(epoch < (uint64_t(1) << (64 - kEpochShift)), "epoch_permutation: epoch must be < 2^24, got {}", epoch);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t(0));
  // Fisher-Yates: position i takes a uniformly chosen one of the i+1 items not yet placed.
  const uint64_t base = epoch << kEpochShift;
  for (int64_t i = n - 1; i >= 1; --i) {
    const uint64_t d = uint64_t(n - 1 - i);
    const int64_t j = int64_t(philox_u64(seed, base + d) % uint64_t(i + 1));
    std::swap(order[size_t(i)], order[size_t(j)]);
  }
  return order;
}

BatchPlan::BatchPlan(int64_t n, const LoaderOptions& opt) : n_(n), opt_(opt) {
  check(n >= 1, "DataLoader: dataset size must be >= 1, got {}", n);
  check(n < (int64_t(1) << kEpochShift), "DataLoader: dataset size must be < 2^40, got {}", n);
  check(opt.batch_size >= 1, "DataLoader: batch_size must be >= 1, got {}", opt.batch_size);
  check(opt.shard_count >= 1 && opt.shard_rank >= 0 && opt.shard_rank < opt.shard_count,
        "DataLoader: shard {} of {} is not a rank of the job", opt.shard_rank, opt.shard_count);
  check(opt.batch_size >= opt.shard_count,
        "DataLoader: a global batch of {} cannot be split over {} ranks (at least one sample each)",
        opt.batch_size, opt.shard_count);
  num_batches_ = opt.drop_last ? n / opt.batch_size : (n + opt.batch_size - 1) / opt.batch_size;
  // A short last batch that some rank would get nothing of is dropped (every rank must step).
  if (!opt.drop_last && n % opt.batch_size != 0 && n % opt.batch_size < opt.shard_count) --num_batches_;
  check(num_batches_ >= 1, "DataLoader: drop_last with batch_size {} > dataset size {} leaves no batch",
        opt.batch_size, n);
}

std::vector<int64_t> BatchPlan::epoch_order(uint64_t epoch) const {
  check(epoch < (uint64_t(1) << (64 - kEpochShift)), "DataLoader: epoch must be < 2^24, got {}", epoch);
  if (opt_.shuffle) return epoch_permutation(n_, opt_.seed, epoch);
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), int64_t(0));
  return order;
}

std::pair<int64_t, int64_t> BatchPlan::batch_range(int64_t b) const {
  const int64_t begin = b * opt_.batch_size;
  return {begin, std::min(n_, begin + opt_.batch_size)};
}

std::pair<int64_t, int64_t> BatchPlan::shard_range(int64_t b) const {
  auto [begin, end] = batch_range(b);
  const Range mine = shard(end - begin, opt_.shard_rank, opt_.shard_count);
  return {begin + mine.begin, begin + mine.end};
}

Error batch_error(std::exception_ptr e, uint64_t epoch, int64_t batch, int64_t begin, int64_t count) {
  std::string what;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    what = ex.what();
  } catch (...) {
    what = "an exception not derived from std::exception";
  }
  return Error(fmt::format("DataLoader: make_batch failed on batch {} of epoch {} ({} indices from position {}): {}",
                           batch, epoch, count, begin, what));
}

// ---- text ---------------------------------------------------------------------------------------

PaddedBatch pad_batch(const std::vector<std::vector<int64_t>>& seqs, int64_t pad_id, int64_t max_len) {
  check(!seqs.empty(), "pad_batch: no sequences");
  check(max_len >= 1, "pad_batch: max_len must be >= 1, got {}", max_len);
  const int64_t B = int64_t(seqs.size());
  int64_t longest = 0;
  for (const auto& s : seqs) longest = std::max(longest, int64_t(s.size()));
  check(longest >= 1, "pad_batch: all {} sequences are empty", B);
  const int64_t T = std::min(longest, max_len);

  PaddedBatch out{empty({B, T}, DType::i64), empty({B}, DType::i64), empty({B, T}, DType::b8)};
  int64_t* tokens = out.tokens.data<int64_t>();
  int64_t* lengths = out.lengths.data<int64_t>();
  bool* mask = out.key_padding_mask.data<bool>();
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int64_t>& s = seqs[size_t(b)];
    const int64_t len = std::min(int64_t(s.size()), T);
    lengths[b] = len;
    for (int64_t t = 0; t < T; ++t) {
      const bool pad = t >= len;
      tokens[b * T + t] = pad ? pad_id : s[size_t(t)];
      mask[b * T + t] = pad;
    }
  }
  return out;
}

std::vector<int64_t> window_starts(int64_t text_len, int64_t batch, int64_t T, uint64_t seed, uint64_t step) {
  check(batch >= 1, "random_windows: batch must be >= 1, got {}", batch);
  check(T >= 1, "random_windows: T must be >= 1, got {}", T);
  check(text_len >= T + 1, "random_windows: a text of {} tokens is too short for windows of T = {} (needs T + 1)",
        text_len, T);
  check(step <= ~uint64_t(0) / uint64_t(batch) - 1, "random_windows: step {} * batch {} overflows the counter",
        step, batch);
  const uint64_t choices = uint64_t(text_len - T);  // starts 0 .. |text| - T - 1
  std::vector<int64_t> starts(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b)
    starts[size_t(b)] = int64_t(philox_u64(seed + kWindowKey, step * uint64_t(batch) + uint64_t(b)) % choices);
  return starts;
}

Windows random_windows(std::span<const int64_t> text, int64_t batch, int64_t T, uint64_t seed, uint64_t step) {
  const std::vector<int64_t> starts = window_starts(int64_t(text.size()), batch, T, seed, step);
  Windows w{empty({batch, T}, DType::i64), empty({batch, T}, DType::i64)};
  int64_t* x = w.x.data<int64_t>();
  int64_t* y = w.y.data<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* src = text.data() + starts[size_t(b)];  // src[0 .. T] lies inside text
    std::copy(src, src + T, x + b * T);
    std::copy(src + 1, src + T + 1, y + b * T);
  }
  return w;
}

}  // namespace ag::data
