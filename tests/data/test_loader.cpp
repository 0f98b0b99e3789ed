// DataLoader (order, batching, prefetch thread, resume) and the text batch makers (data/loader.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "data/loader.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;
using ag::data::DataLoader;
using ag::data::LoaderOptions;

namespace {

using Indices = std::vector<int64_t>;

// make_batch that returns the indices it was given.
Indices copy_indices(std::span<const int64_t> idx) { return Indices(idx.begin(), idx.end()); }

// Every batch of one epoch, in order.
template <class Batch>
std::vector<Batch> drain(DataLoader<Batch>& loader) {
  std::vector<Batch> out;
  while (auto b = loader.next()) out.push_back(std::move(*b));
  return out;
}

LoaderOptions opts(int64_t batch_size, bool shuffle, uint64_t seed, bool drop_last, int prefetch) {
  LoaderOptions o;
  o.batch_size = batch_size, o.shuffle = shuffle, o.seed = seed, o.drop_last = drop_last, o.prefetch = prefetch;
  return o;
}

// The permutation as data/loader.h specifies it, written from the formula: Fisher-Yates from the
// top, draw d = N-1-i taking 64 bits from Philox block (seed, epoch * 2^40 + d).
Indices permutation_reference(int64_t n, uint64_t seed, uint64_t epoch) {
  Indices p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = i;
  for (int64_t i = n - 1, d = 0; i >= 1; --i, ++d) {
    Philox4 r = philox4x32_10(seed, (epoch << 40) + uint64_t(d));
    uint64_t u = (uint64_t(r.v[1]) << 32) + r.v[0];
    std::swap(p[size_t(i)], p[size_t(u % uint64_t(i + 1))]);
  }
  return p;
}

}  // namespace

TEST_CASE("loader: every epoch covers each index exactly once") {
  for (int prefetch : {0, 2}) {
    CAPTURE(prefetch);
    // N = 10, batch 3: batches of 3, 3, 3, 1; with drop_last the 1 is dropped (9 indices seen).
    DataLoader<Indices> keep(10, opts(3, true, 5, false, prefetch), copy_indices);
    DataLoader<Indices> drop(10, opts(3, true, 5, true, prefetch), copy_indices);
    CHECK(keep.num_batches() == 4);
    CHECK(drop.num_batches() == 3);
    for (uint64_t epoch : {0u, 1u, 7u}) {
      keep.begin_epoch(epoch);
      std::vector<Indices> batches = drain(keep);
      REQUIRE(batches.size() == 4);
      Indices all;
      for (size_t b = 0; b < batches.size(); ++b) {
        CHECK(batches[b].size() == (b < 3 ? 3u : 1u));
        all.insert(all.end(), batches[b].begin(), batches[b].end());
      }
      CHECK(all == keep.epoch_order(epoch));  // batches are the epoch's order, cut in 3s
      std::sort(all.begin(), all.end());
      CHECK(all == Indices{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
      CHECK_FALSE(keep.next().has_value());  // the epoch stays over

      drop.begin_epoch(epoch);
      std::vector<Indices> dropped = drain(drop);
      REQUIRE(dropped.size() == 3);
      std::set<int64_t> seen;
      for (const Indices& b : dropped) {
        CHECK(b.size() == 3);
        seen.insert(b.begin(), b.end());
      }
      CHECK(seen.size() == 9);  // distinct, and exactly the first 9 of the order
      Indices order = drop.epoch_order(epoch);
      CHECK(seen == std::set<int64_t>(order.begin(), order.begin() + 9));
    }
  }
  // Without shuffling every epoch is 0..N-1.
  DataLoader<Indices> plain(5, opts(2, false, 5, false, 1), copy_indices);
  plain.begin_epoch(3);
  CHECK(drain(plain) == std::vector<Indices>{{0, 1}, {2, 3}, {4}});
}

TEST_CASE("loader: the permutation is a pure function of (seed, epoch)") {
  using data::epoch_permutation;
  // The specification, written out independently in permutation_reference.
  CHECK(epoch_permutation(50, 42, 0) == permutation_reference(50, 42, 0));
  CHECK(epoch_permutation(50, 42, 3) == permutation_reference(50, 42, 3));
  CHECK(epoch_permutation(1, 42, 3) == Indices{0});
  CHECK(epoch_permutation(0, 42, 3).empty());
  // Same (seed, epoch): same order; another epoch or seed: another order.
  Indices p = epoch_permutation(20, 7, 3);
  CHECK(p == epoch_permutation(20, 7, 3));
  CHECK(p != epoch_permutation(20, 7, 4));
  CHECK(p != epoch_permutation(20, 8, 3));
  Indices sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 20; ++i) CHECK(sorted[size_t(i)] == i);
  // Two loaders with the same seed agree, whatever their prefetch.
  DataLoader<Indices> a(20, opts(4, true, 7, false, 0), copy_indices), b(20, opts(4, true, 7, false, 3), copy_indices);
  CHECK(a.epoch_order(3) == p);
  CHECK(b.epoch_order(3) == p);
  // Uniform: over 4000 epochs of N = 4 each item lands in each position ~1000 times (binomial,
  // sd ~27); a Fisher-Yates off by one (j < i instead of j <= i) would never leave item 3 in place.
  std::map<std::pair<int64_t, int64_t>, int> count;
  for (uint64_t e = 0; e < 4000; ++e) {
    Indices q = epoch_permutation(4, 1, e);
    for (int64_t pos = 0; pos < 4; ++pos) count[{pos, q[size_t(pos)]}]++;
  }
  for (int64_t pos = 0; pos < 4; ++pos)
    for (int64_t item = 0; item < 4; ++item) {
      CAPTURE(pos);
      CAPTURE(item);
      CHECK(std::abs(count[{pos, item}] - 1000) < 150);
    }
}

TEST_CASE("loader: prefetch on and off give identical batches") {
  // A batch with a tensor made on the worker thread: values depend on the indices only.
  struct Batch {
    Tensor x;
    Indices idx;
    bool grad_mode;
  };
  auto make = [](std::span<const int64_t> idx) {
    Generator g(static_cast<uint64_t>(idx[0]) + 100);
    Tensor r = randn({int64_t(idx.size()), 3}, DType::f32, &g);
    Tensor x = add(r, from_vector(Indices(idx.begin(), idx.end()), {int64_t(idx.size()), 1}).to(DType::f32));
    return Batch{x, Indices(idx.begin(), idx.end()), grad_enabled()};
  };
  std::vector<std::vector<Batch>> runs;
  for (int prefetch : {0, 1, 2, 5}) {
    DataLoader<Batch> loader(23, opts(4, true, 11, false, prefetch), make);
    std::vector<Batch> all;
    for (uint64_t e = 0; e < 2; ++e) {
      loader.begin_epoch(e);
      for (Batch& b : drain(loader)) all.push_back(std::move(b));
    }
    runs.push_back(std::move(all));
  }
  REQUIRE(runs[0].size() == 12);  // 2 epochs of ceil(23 / 4) = 6
  for (size_t r = 1; r < runs.size(); ++r) {
    REQUIRE(runs[r].size() == runs[0].size());
    for (size_t i = 0; i < runs[0].size(); ++i) {
      CAPTURE(r);
      CAPTURE(i);
      CHECK(runs[r][i].idx == runs[0][i].idx);
      CHECK(runs[r][i].x.to_vector<float>() == runs[0][i].x.to_vector<float>());  // bitwise
    }
  }
  // make_batch ran without recording, on either thread.
  for (const auto& run : runs)
    for (const Batch& b : run) CHECK_FALSE(b.grad_mode);
  // ...and the caller's grad mode is untouched.
  CHECK(grad_enabled());
}

TEST_CASE("loader: an exception in make_batch is re-thrown by next naming the batch") {
  for (int prefetch : {0, 2}) {
    CAPTURE(prefetch);
    bool fail = true;
    auto make = [&fail](std::span<const int64_t> idx) {
      for (int64_t i : idx)
        if (fail && i == 7) throw std::runtime_error("bad item 7");
      return copy_indices(idx);
    };
    // No shuffle, batches of 3: item 7 is in batch 2 ({6, 7, 8}).
    DataLoader<Indices> loader(12, opts(3, false, 0, false, prefetch), make);
    loader.begin_epoch(1);
    CHECK(*loader.next() == Indices{0, 1, 2});
    CHECK(*loader.next() == Indices{3, 4, 5});
    AG_CHECK_ERROR(loader.next(), "DataLoader: make_batch failed on batch 2 of epoch 1", "3 indices from position 6",
                   "bad item 7");
    // The epoch stays failed: the same error again, no hang waiting for a worker that stopped.
    AG_CHECK_ERROR(loader.next(), "batch 2 of epoch 1", "bad item 7");
    // A non-std exception is reported too.
    DataLoader<Indices> odd(4, opts(2, false, 0, false, prefetch), [](std::span<const int64_t>) -> Indices { throw 42; });
    odd.begin_epoch(0);
    AG_CHECK_ERROR(odd.next(), "batch 0 of epoch 0", "not derived from std::exception");
    // begin_epoch starts over.
    fail = false;
    loader.begin_epoch(1, 2);
    CHECK(*loader.next() == Indices{6, 7, 8});
  }
}

TEST_CASE("loader: destruction mid-epoch joins the worker and frees the prepared batches") {
  // Each batch holds a copy of `alive`; its use_count counts the batches still in memory.
  auto alive = std::make_shared<int>(0);
  std::atomic<int> made{0};
  auto make = [alive, &made](std::span<const int64_t> idx) {
    made++;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return std::make_pair(alive, copy_indices(idx));
  };
  using Batch = std::pair<std::shared_ptr<int>, Indices>;
  const auto t0 = std::chrono::steady_clock::now();
  {
    DataLoader<Batch> loader(1000, opts(1, true, 3, false, 2), make);
    loader.begin_epoch(0);
    for (int i = 0; i < 3; ++i) CHECK(loader.next().has_value());
    // Let the worker fill the queue and block on it.
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  {
    DataLoader<Batch> never_read(1000, opts(1, true, 3, false, 4), make);
    never_read.begin_epoch(0);  // destroyed with the worker mid-make_batch or waiting for space
  }
  {
    DataLoader<Batch> restarted(1000, opts(1, true, 3, false, 2), make);
    restarted.begin_epoch(0);
    restarted.begin_epoch(1);  // stops the first worker before starting the second
    CHECK(restarted.next()->second == Indices{restarted.epoch_order(1)[0]});
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(alive.use_count() == 2);  // `alive` and the copy inside `make`: no batch outlived its loader
  // At most 3 taken + 2 queued + 1 in flight, then at most 4 + 1 and 2 + 1 + 2 + 1 (+1 for each
  // batch the worker had begun when stopped): far from the 3000 a worker that was not stopped makes.
  CHECK(made.load() <= 20);
  CHECK(seconds < 5.0);  // the worker stopped; it did not run the epoch to its end (1000 x 5 ms)
}

TEST_CASE("loader: seek resumes exactly where a continuous run would be") {
  for (int prefetch : {0, 2}) {
    CAPTURE(prefetch);
    // N = 11, batch 4, drop_last: 2 batches per epoch; steps 0..7 span 4 epochs.
    const LoaderOptions o = opts(4, true, 9, true, prefetch);
    DataLoader<Indices> full(11, o, copy_indices);
    std::vector<Indices> continuous;
    for (uint64_t e = 0; e < 4; ++e) {
      full.begin_epoch(e);
      CHECK(full.step() == int64_t(e) * 2);
      for (Indices& b : drain(full)) continuous.push_back(std::move(b));
    }
    REQUIRE(continuous.size() == 8);
    for (int64_t s = 0; s < 8; ++s) {
      CAPTURE(s);
      // A run restored from a checkpoint saved at step s: seek, finish the epoch, go on.
      DataLoader<Indices> resumed(11, o, copy_indices);
      resumed.seek(s);
      CHECK(resumed.step() == s);
      CHECK(resumed.epoch() == uint64_t(s / 2));
      CHECK(resumed.next_batch() == s % 2);
      std::vector<Indices> tail;
      for (uint64_t e = resumed.epoch();; ++e) {
        if (e != resumed.epoch()) resumed.begin_epoch(e);
        for (Indices& b : drain(resumed)) tail.push_back(std::move(b));
        if (e == 3) break;
      }
      CHECK(tail == std::vector<Indices>(continuous.begin() + s, continuous.end()));
    }
    // next_step() rolls over epochs: from any step it continues the continuous run.
    for (int64_t s : {0, 3, 4}) {
      CAPTURE(s);
      DataLoader<Indices> stepped(11, o, copy_indices);
      stepped.seek(s);
      for (int64_t t = s; t < 8; ++t) {
        CHECK(stepped.step() == t);
        CHECK(stepped.next_step() == continuous[size_t(t)]);
      }
    }
    // begin_epoch(e, num_batches) is an epoch already over.
    full.begin_epoch(2, 2);
    CHECK_FALSE(full.next().has_value());
  }
}

TEST_CASE("loader: the background thread prepares batch i+1 while the caller trains on batch i") {
  // make_batch records when it starts each batch. After next() returns batch i, the caller waits
  // (up to 2 s) for make_batch(i+1) to start while it has not asked for batch i+1 yet: only a
  // background thread can satisfy that. With prefetch 0 it never happens (checked below), so this
  // test fails when the loader does not overlap.
  struct Started {
    std::mutex mu;
    std::condition_variable cv;
    std::set<int64_t> batches;
  };
  auto wait_started = [](Started& s, int64_t batch, std::chrono::milliseconds timeout) {
    std::unique_lock lock(s.mu);
    return s.cv.wait_for(lock, timeout, [&] { return s.batches.count(batch) > 0; });
  };
  auto make_loader = [](Started& s, int prefetch) {
    // No shuffle, batch 1: batch i holds index i.
    return std::make_unique<DataLoader<int64_t>>(6, opts(1, false, 0, false, prefetch),
                                                 [&s](std::span<const int64_t> idx) {
                                                   {
                                                     std::lock_guard lock(s.mu);
                                                     s.batches.insert(idx[0]);
                                                   }
                                                   s.cv.notify_all();
                                                   std::this_thread::sleep_for(std::chrono::milliseconds(2));
                                                   return idx[0];
                                                 });
  };
  Started on;
  auto loader = make_loader(on, 2);
  loader->begin_epoch(0);
  for (int64_t i = 0; i < 6; ++i) {
    CHECK(*loader->next() == i);
    if (i + 1 < 6) CHECK(wait_started(on, i + 1, std::chrono::milliseconds(2000)));
  }
  Started off;
  auto serial = make_loader(off, 0);
  serial->begin_epoch(0);
  CHECK(*serial->next() == 0);
  CHECK_FALSE(wait_started(off, 1, std::chrono::milliseconds(20)));
}

TEST_CASE("loader: errors name the loader and the values") {
  AG_CHECK_ERROR(DataLoader<Indices>(0, opts(2, true, 0, false, 2), copy_indices), "DataLoader", "dataset size",
                 "got 0");
  AG_CHECK_ERROR(DataLoader<Indices>(5, opts(0, true, 0, false, 2), copy_indices), "DataLoader", "batch_size", "got 0");
  AG_CHECK_ERROR(DataLoader<Indices>(5, opts(8, true, 0, true, 2), copy_indices), "DataLoader", "drop_last",
                 "batch_size 8 > dataset size 5");
  AG_CHECK_ERROR(DataLoader<Indices>(5, opts(2, true, 0, false, -1), copy_indices), "DataLoader", "prefetch", "got -1");
  AG_CHECK_ERROR(DataLoader<Indices>(5, opts(2, true, 0, false, 2), nullptr), "DataLoader", "make_batch is empty");
  DataLoader<Indices> loader(5, opts(2, true, 0, false, 2), copy_indices);
  AG_CHECK_ERROR(loader.next(), "DataLoader", "before begin_epoch");
  AG_CHECK_ERROR(loader.next_step(), "DataLoader", "before begin_epoch");
  AG_CHECK_ERROR(loader.begin_epoch(1, 4), "DataLoader", "begin_epoch(1, 4)", "[0, 3]");
  AG_CHECK_ERROR(loader.begin_epoch(1, -1), "DataLoader", "begin_epoch(1, -1)");
  AG_CHECK_ERROR(loader.begin_epoch(uint64_t(1) << 24), "DataLoader", "epoch must be < 2^24", "16777216");
  AG_CHECK_ERROR(loader.seek(-3), "DataLoader", "seek(-3)");
  AG_CHECK_ERROR(data::epoch_permutation(-1, 0, 0), "epoch_permutation", "got -1");
}

TEST_CASE("pad_batch: known values") {
  // Lengths 3, 1, 0 (an empty sequence is all padding), 5 truncated to max_len = 4; T = 4.
  std::vector<Indices> seqs = {{5, 6, 7}, {8}, {}, {1, 2, 3, 4, 9}};
  data::PaddedBatch p = data::pad_batch(seqs, -1, 4);
  CHECK(p.tokens.shape() == Shape{4, 4});
  CHECK(p.tokens.dtype() == DType::i64);
  CHECK(p.tokens.to_vector<int64_t>() == Indices{5, 6, 7, -1, /**/ 8, -1, -1, -1, /**/ -1, -1, -1, -1, /**/ 1, 2, 3, 4});
  CHECK(p.lengths.shape() == Shape{4});
  CHECK(p.lengths.to_vector<int64_t>() == Indices{3, 1, 0, 4});
  CHECK(p.key_padding_mask.shape() == Shape{4, 4});
  CHECK(p.key_padding_mask.dtype() == DType::b8);
  CHECK(p.key_padding_mask.to_vector<int>() == std::vector<int>{0, 0, 0, 1, /**/ 0, 1, 1, 1, /**/ 1, 1, 1, 1, /**/ 0, 0, 0, 0});
  // T is the longest in the batch when that is below max_len.
  data::PaddedBatch q = data::pad_batch({{1, 2}, {3}}, 0, 100);
  CHECK(q.tokens.shape() == Shape{2, 2});
  CHECK(q.tokens.to_vector<int64_t>() == Indices{1, 2, 3, 0});
  CHECK(q.key_padding_mask.to_vector<int>() == std::vector<int>{0, 0, 0, 1});
  // The mask is what attention takes: a padded key gets no weight, so the padded row's output
  // equals attention over its valid keys alone.
  Tensor qkv = vals({2, 1, 2, 3}, 0.3);
  SdpaOptions opt;
  opt.key_padding_mask = q.key_padding_mask;
  Tensor out = scaled_dot_product_attention(qkv, qkv, qkv, opt).out;
  Tensor one = qkv.narrow(0, 1, 1).narrow(2, 0, 1);
  Tensor ref = scaled_dot_product_attention(qkv.narrow(0, 1, 1), one, one).out;
  check_close(out.narrow(0, 1, 1), ref, 1e-6, 1e-5);
}

TEST_CASE("pad_batch: errors") {
  AG_CHECK_ERROR(data::pad_batch({}, 0, 4), "pad_batch", "no sequences");
  AG_CHECK_ERROR(data::pad_batch({{1}}, 0, 0), "pad_batch", "max_len", "got 0");
  const std::vector<Indices> two_empty(2);
  AG_CHECK_ERROR(data::pad_batch(two_empty, 0, 4), "pad_batch", "all 2 sequences are empty");
}

TEST_CASE("random_windows: known values and determinism per (seed, step)") {
  // text = 100, 101, ..., 109 (|text| = 10), T = 4: starts in [0, 5], x = text[s:s+4], y = x + 1.
  Indices text(static_cast<size_t>(10));
  for (int64_t i = 0; i < 10; ++i) text[size_t(i)] = 100 + i;
  data::Windows w = data::random_windows(text, 3, 4, 17, 5);
  Indices starts = data::window_starts(10, 3, 4, 17, 5);
  REQUIRE(starts.size() == 3);
  CHECK(w.x.shape() == Shape{3, 4});
  CHECK(w.y.shape() == Shape{3, 4});
  CHECK(w.x.dtype() == DType::i64);
  Indices x = w.x.to_vector<int64_t>(), y = w.y.to_vector<int64_t>();
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t t = 0; t < 4; ++t) {
      CHECK(x[size_t(b * 4 + t)] == 100 + starts[size_t(b)] + t);
      CHECK(y[size_t(b * 4 + t)] == 100 + starts[size_t(b)] + t + 1);
    }
  // The specification: start_b = u64(step * B + b) mod (|text| - T), key seed + 0x9E3779B97F4A7C15.
  for (int64_t b = 0; b < 3; ++b) {
    Philox4 r = philox4x32_10(17 + 0x9E3779B97F4A7C15ull, uint64_t(5 * 3 + b));
    CHECK(starts[size_t(b)] == int64_t(((uint64_t(r.v[1]) << 32) + r.v[0]) % 6));
  }
  // Same (seed, step): same windows; over many steps every start in [0, 5] occurs, none outside.
  CHECK(data::random_windows(text, 3, 4, 17, 5).x.to_vector<int64_t>() == x);
  std::set<int64_t> seen;
  bool differs = false;
  for (uint64_t step = 0; step < 50; ++step) {
    Indices s = data::window_starts(10, 3, 4, 17, step);
    seen.insert(s.begin(), s.end());
    differs |= s != starts;
  }
  CHECK(seen == std::set<int64_t>{0, 1, 2, 3, 4, 5});
  CHECK(differs);
  CHECK(data::window_starts(10, 3, 4, 18, 5) != starts);
  // The tightest text, |text| = T + 1, has one window: the whole text.
  data::Windows tight = data::random_windows(std::span<const int64_t>(text.data(), 5), 2, 4, 1, 0);
  CHECK(tight.x.to_vector<int64_t>() == Indices{100, 101, 102, 103, 100, 101, 102, 103});
  CHECK(tight.y.to_vector<int64_t>() == Indices{101, 102, 103, 104, 101, 102, 103, 104});
}

TEST_CASE("random_windows: errors") {
  Indices text(10, 0);
  AG_CHECK_ERROR(data::random_windows(text, 2, 10, 0, 0), "random_windows", "10 tokens", "T = 10");
  AG_CHECK_ERROR(data::random_windows(text, 0, 4, 0, 0), "random_windows", "batch", "got 0");
  AG_CHECK_ERROR(data::random_windows(text, 2, 0, 0, 0), "random_windows", "T must be >= 1", "got 0");
  AG_CHECK_ERROR(data::random_windows(text, 2, 4, 0, ~uint64_t(0)), "random_windows", "overflows");
}

TEST_CASE("loader: sharded, the ranks' slices of each batch together are the unsharded batch") {
  // 3 ranks, global batch 8 over 21 items: batches of 8, 8, 5 split 3+3+2, 3+3+2, 2+2+1.
  auto collect = [](int rank, int ranks) {
    LoaderOptions o{.batch_size = 8, .seed = 5, .prefetch = 0, .shard_rank = rank, .shard_count = ranks};
    DataLoader<Indices> loader(21, o, [](std::span<const int64_t> idx) { return Indices(idx.begin(), idx.end()); });
    std::vector<Indices> out;
    loader.begin_epoch(2);
    while (auto b = loader.next()) out.push_back(*b);
    return out;
  };
  std::vector<Indices> whole = collect(0, 1);
  REQUIRE(whole.size() == 3);
  std::vector<std::vector<Indices>> parts = {collect(0, 3), collect(1, 3), collect(2, 3)};
  for (size_t b = 0; b < whole.size(); ++b) {
    Indices joined;
    for (const auto& p : parts) joined.insert(joined.end(), p[b].begin(), p[b].end());
    CHECK(joined == whole[b]);
  }
  CHECK(parts[0][2].size() == 2);
  CHECK(parts[2][2].size() == 1);
  // A last batch of 2 items over 3 ranks is dropped: 20 items, batch 6 -> 6, 6, 6 (and 2 dropped).
  LoaderOptions o{.batch_size = 6, .prefetch = 0, .shard_rank = 2, .shard_count = 3};
  DataLoader<Indices> short_last(20, o, [](std::span<const int64_t> idx) { return Indices(idx.begin(), idx.end()); });
  CHECK(short_last.num_batches() == 3);
  CHECK_THROWS_WITH_AS(ag::data::BatchPlan(20, LoaderOptions{.batch_size = 2, .shard_rank = 0, .shard_count = 3}),
                       doctest::Contains("a global batch of 2 cannot be split over 3 ranks"), Error);
  CHECK_THROWS_WITH_AS(ag::data::BatchPlan(20, LoaderOptions{.batch_size = 4, .shard_rank = 3, .shard_count = 3}),
                       doctest::Contains("shard 3 of 3 is not a rank of the job"), Error);
}
