#pragma once
// DataLoader: the order in which a training loop sees a dataset, cut into batches, with the next
// batches prepared on a background thread while the current one trains. Plus two batch makers for
// text: pad_batch (variable-length sequences -> tokens, lengths, padding mask) and random_windows
// (a char-level LM's (x, y) windows cut from one long token array).
//
// Order. Epoch e visits the indices 0..N-1 in epoch_permutation(N, seed, e): a pure function of
// (N, seed, e), the same on every machine, standard library and thread count (no std::shuffle,
// whose result is implementation-defined). Batch b of the epoch holds the indices
// order[b*batch_size, min(N, (b+1)*batch_size)); drop_last drops the short last batch.
//
//   epoch_permutation: Fisher-Yates, i = N-1 down to 1 swaps order[i] with order[j],
//     j = u64(d) mod (i+1),  d = N-1-i the draw number,
//     u64(d) = v0 | v1 << 32 of philox4x32_10(key = seed, counter = e * 2^40 + d)
//   (the modulo bias is below N / 2^64: invisible). So N < 2^40 and e < 2^24.
//
// Resume. Step s of a run (counting batches from 0 over all epochs) is batch s mod num_batches of
// epoch s / num_batches; seek(s) (or begin_epoch(e, k)) starts there, and what follows equals what
// an uninterrupted run would have seen, since the order is a function of (seed, epoch) alone.
//
// A training loop counted in steps, resumable from a checkpoint saved at step `start`:
//   DataLoader<Batch> loader(ds.size(), {.batch_size = 64, .seed = 1},
//                            [&](std::span<const int64_t> idx) { return make_batch(ds, idx); });
//   loader.seek(start);                                   // 0 for a fresh run
//   for (int64_t step = start; step < steps; ++step) { Batch b = loader.next_step(); ... }
// or counted in epochs: for (e...) { loader.begin_epoch(e); while (auto b = loader.next()) ... }
//
// Threads. With prefetch = P > 0, begin_epoch starts one std::thread that calls make_batch for the
// epoch's batches in order and keeps at most P finished ones in a queue; next() takes them in
// order. With P = 0 next() calls make_batch itself. Both give the same batches: make_batch sees the
// same indices, and it runs under NoGradGuard either way (a batch is data, never history).
// What make_batch may do on the worker thread:
//   - create tensors and write them through data<T>(): the CPU allocator is one mutex-guarded cache
//     (core/allocator.cpp), the tape's sequence counter is atomic and grad mode is thread_local;
//     a finished batch is handed over under the queue's mutex, so the caller sees it whole;
//   - kernels it calls run serially on the worker (a SerialScope: parallel_for stays inline), so
//     it never opens a second OpenMP team next to the trainer's; the results are the same;
//   - it must not draw from default_generator() (not thread-safe): derive a Generator or Philox
//     counters from (seed, indices) instead, which also keeps batches reproducible;
//   - it must leave tensors on the CPU; the caller moves a batch to the GPU after next().
// An exception thrown by make_batch is re-thrown by the next() that would have returned that
// batch, as ag::Error naming the epoch, the batch and the original message; the epoch then stops
// (next() throws the same error again until begin_epoch). Destroying the loader, or calling
// begin_epoch, mid-epoch stops the worker and joins it: it finishes the make_batch it is in, if
// any, and the prepared batches are freed.
#include <cassert>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "autograd/tape.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/random.h"
#include "core/tensor.h"

namespace ag::data {

// Part `part` of `parts` of n items, [begin, end): contiguous, sizes differ by at most one (the
// first n % parts parts take one item more). Data parallelism gives rank r of a world of w the
// slice shard(n, r, w) of a global batch (dist/dist.h has the rank and the world size).
struct Range {
  int64_t begin, end;
  int64_t size() const { return end - begin; }
};
Range shard(int64_t n, int part, int parts);

// The random draws of a training loader's batches (augmentation, random windows), so that a run
// resumed at step s, or split over ranks, draws what an uninterrupted single run would: the batch
// of step s draws from Generator(seed) at offset s * batch + first, where batch is the global
// batch and first this rank's first position in it (shard(batch, rank, ranks).begin); each item
// of the batch then takes Philox blocks offset + b. next() gives the generator of the next batch
// and moves on: a DataLoader calls make_batch for its batches strictly in order, starting with the
// step it is seeked to, so a make_batch that calls next() once gets its own step's generator.
class StepDraws {
 public:
  StepDraws(uint64_t seed, int64_t batch, int64_t first, int64_t start_step)
      : seed_(seed), batch_(batch), first_(first), step_(start_step) {}
  Generator next() {
    Generator g(seed_);
    g.set_offset(uint64_t(step_) * uint64_t(batch_) + uint64_t(first_));
    ++step_;
    return g;
  }

 private:
  uint64_t seed_;
  int64_t batch_, first_, step_;
};

// The order of epoch `epoch` over a dataset of n items (see the header comment).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, uint64_t epoch);

struct LoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = true;     // false: every epoch is 0, 1, ..., N-1
  uint64_t seed = 0;
  bool drop_last = false;  // drop the last batch when it is shorter than batch_size
  int prefetch = 2;        // batches prepared ahead on a background thread; 0: no thread
  // Data parallelism (dist/dist.h): batch_size is then the GLOBAL batch, planned the same way on
  // every rank, and make_batch receives only rank shard_rank's slice of it (shard() above: contiguous,
  // sizes differ by at most one), so the ranks together see exactly what one process would with
  // that batch size. A short last batch with fewer items than ranks is dropped.
  int shard_rank = 0, shard_count = 1;
};

// The plan without the threads: which indices batch b of epoch e holds.
class BatchPlan {
 public:
  BatchPlan(int64_t n, const LoaderOptions& opt);  // validates n and opt
  int64_t size() const { return n_; }
  int64_t num_batches() const { return num_batches_; }
  const LoaderOptions& options() const { return opt_; }
  std::vector<int64_t> epoch_order(uint64_t epoch) const;  // permutation, or 0..N-1
  // The [begin, end) range of batch b in an epoch's order.
  std::pair<int64_t, int64_t> batch_range(int64_t b) const;
  // The part of batch_range(b) make_batch receives: this rank's slice (all of it with one rank).
  std::pair<int64_t, int64_t> shard_range(int64_t b) const;

 private:
  int64_t n_;
  LoaderOptions opt_;
  int64_t num_batches_;
};

// "DataLoader: make_batch failed on batch 3 of epoch 1 (12 indices from 36): <what>"
Error batch_error(std::exception_ptr e, uint64_t epoch, int64_t batch, int64_t begin, int64_t count);

template <class Batch>
class DataLoader {
 public:
  using MakeBatch = std::function<Batch(std::span<const int64_t> indices)>;

  DataLoader(int64_t n, LoaderOptions opt, MakeBatch make_batch)
      : plan_(n, opt), make_batch_(std::move(make_batch)) {
    check(opt.prefetch >= 0, "DataLoader: prefetch must be >= 0, got {}", opt.prefetch);
    check(bool(make_batch_), "DataLoader: make_batch is empty");
  }
  ~DataLoader() { stop_worker(); }
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t size() const { return plan_.size(); }
  int64_t num_batches() const { return plan_.num_batches(); }
  std::vector<int64_t> epoch_order(uint64_t epoch) const { return plan_.epoch_order(epoch); }
  uint64_t epoch() const { return epoch_; }
  int64_t next_batch() const { return next_; }  // index in the epoch of the batch next() returns
  // Global step of the batch next() returns: epoch * num_batches + next_batch.
  int64_t step() const { return int64_t(epoch_) * num_batches() + next_; }

  // Starts epoch `epoch` at batch `first_batch` (0 for a fresh epoch; k to resume mid-epoch).
  void begin_epoch(uint64_t epoch, int64_t first_batch = 0) {
    check(first_batch >= 0 && first_batch <= num_batches(),
          "DataLoader: begin_epoch({}, {}): first batch must be in [0, {}]", epoch, first_batch,
          num_batches());
    stop_worker();
    order_ = plan_.epoch_order(epoch);  // validates epoch
    epoch_ = epoch;
    next_ = first_batch;
    started_ = true;
    error_ = nullptr;
    if (plan_.options().prefetch > 0 && first_batch < num_batches()) {
      stop_ = false;
      worker_ = std::thread([this, first_batch] { produce(first_batch); });
    }
  }
  // Starts at global step `step` (e.g. the step a checkpoint was saved at).
  void seek(int64_t step) {
    check(step >= 0, "DataLoader: seek({}): step must be >= 0", step);
    begin_epoch(uint64_t(step / num_batches()), step % num_batches());
  }

  // For loops counted in steps: the batch of step(), beginning the next epoch when this one is
  // over (so it never runs out). seek(s) and then next_step() s..S-1 is the run from s to S.
  Batch next_step() {
    check(started_, "DataLoader: next_step() called before begin_epoch() or seek()");
    if (!error_ && next_ >= num_batches()) begin_epoch(epoch_ + 1);
    return *next();
  }

  // The next batch of the epoch, or nullopt once the epoch is over.
  std::optional<Batch> next() {
    check(started_, "DataLoader: next() called before begin_epoch()");
    if (error_) std::rethrow_exception(error_);
    if (next_ >= num_batches()) return std::nullopt;
    const int64_t b = next_;
    if (plan_.options().prefetch == 0) {
      Slot s = make(b);
      return take(std::move(s));
    }
    Slot s;
    {
      std::unique_lock lock(mu_);
      ready_.wait(lock, [this] { return !queue_.empty(); });
      s = std::move(queue_.front());
      queue_.pop_front();
    }
    assert(s.index == b);  // the worker makes batches in order, one queue: never out of order
    space_.notify_one();
    return take(std::move(s));
  }

 private:
  struct Slot {
    int64_t index = -1;
    std::optional<Batch> batch;
    std::exception_ptr error;
  };

  // Runs make_batch for batch b; any exception is kept (as ag::Error naming the batch).
  Slot make(int64_t b) const {
    Slot s;
    s.index = b;
    auto [begin, end] = plan_.shard_range(b);
    try {
      NoGradGuard no_grad;
      s.batch.emplace(make_batch_(std::span<const int64_t>(order_.data() + begin, size_t(end - begin))));
    } catch (...) {
      s.error = std::make_exception_ptr(batch_error(std::current_exception(), epoch_, b, begin, end - begin));
    }
    return s;
  }

  std::optional<Batch> take(Slot s) {
    if (s.error) {
      error_ = s.error;
      stop_worker();  // the worker stopped after the failed batch; join it now
      std::rethrow_exception(error_);
    }
    ++next_;
    return std::move(s.batch);
  }

  // The worker: batches first..num_batches-1, in order, at most `prefetch` waiting in the queue.
  void produce(int64_t first) {
    SerialScope serial;  // one thread here; the trainer's OpenMP team keeps the cores
    const size_t depth = size_t(plan_.options().prefetch);
    for (int64_t b = first; b < num_batches(); ++b) {
      {
        std::unique_lock lock(mu_);
        space_.wait(lock, [&] { return stop_ || queue_.size() < depth; });
        if (stop_) return;
      }
      Slot s = make(b);  // outside the lock: the caller keeps taking ready batches meanwhile
      const bool failed = s.error != nullptr;
      {
        std::lock_guard lock(mu_);
        queue_.push_back(std::move(s));
      }
      ready_.notify_one();
      if (failed) return;
    }
  }

  void stop_worker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    space_.notify_all();
    if (worker_.joinable()) worker_.join();
    queue_.clear();  // the worker is gone: no lock needed
  }

  BatchPlan plan_;
  MakeBatch make_batch_;
  std::vector<int64_t> order_;  // written only while no worker runs; read-only while it runs
  uint64_t epoch_ = 0;
  int64_t next_ = 0;
  bool started_ = false;
  std::exception_ptr error_;

  std::thread worker_;
  std::mutex mu_;                    // guards queue_ and stop_
  std::condition_variable ready_;    // a batch was queued
  std::condition_variable space_;    // a slot was freed, or stop_ was set
  std::deque<Slot> queue_;
  bool stop_ = false;
};

// ---- text ---------------------------------------------------------------------------------------

// seqs (B lists of token ids) padded on the right to T = min(longest, max_len); longer sequences
// keep their first max_len tokens.
//   tokens           i64 [B, T]  seqs[b][t] for t < lengths[b], else pad_id
//   lengths          i64 [B]     min(|seqs[b]|, max_len)
//   key_padding_mask b8  [B, T]  true where t >= lengths[b]: true = padding (PyTorch's convention,
//                                SdpaOptions::key_padding_mask)
struct PaddedBatch {
  Tensor tokens, lengths, key_padding_mask;
};
PaddedBatch pad_batch(const std::vector<std::vector<int64_t>>& seqs, int64_t pad_id, int64_t max_len);

// A char-level LM batch: B windows of T tokens and their next tokens, cut from `text` at random
// starts that are a pure function of (seed, step), so a resumed run sees the same windows.
//   start_b = u64(step * B + b) mod (|text| - T),  b = 0..B-1,  needs |text| >= T + 1
//     u64(c) = v0 | v1 << 32 of philox4x32_10(key = seed + 0x9E3779B97F4A7C15, counter = c)
//     (the key offset keeps these draws apart from epoch_permutation's with the same seed)
//   x  i64 [B, T]  x[b, t] = text[start_b + t]
//   y  i64 [B, T]  y[b, t] = text[start_b + t + 1]
struct Windows {
  Tensor x, y;
};
std::vector<int64_t> window_starts(int64_t text_len, int64_t batch, int64_t T, uint64_t seed, uint64_t step);
Windows random_windows(std::span<const int64_t> text, int64_t batch, int64_t T, uint64_t seed, uint64_t step);

}  // namespace ag::data
