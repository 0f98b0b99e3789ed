#pragma once
// ag::dist: data-parallel training over processes, on MPI (Open MPI from Debian).
//
// Data parallelism in one paragraph. N processes (ranks) each hold a full copy of the model. Every
// step, each rank takes its own slice of the global batch (N x the per-rank batch), runs forward and
// backward on it, and the ranks then average their gradients, so every rank applies the same update
// and the copies stay identical. With a loss that is a mean over the slice's samples,
//   g = (1/N) sum_r (1/B) sum_{i in slice r} dL_i/dw  =  (1/(N B)) sum_{i in global batch} dL_i/dw,
// the gradient of one process training on the whole global batch: N ranks with batch B compute
// what 1 rank with batch N B computes, up to the order of float additions.
//
//   dist::init();                                  // from mpirun's environment; 1 rank without it
//   dist::broadcast(model.parameters());           // rank 0's initial weights everywhere
//   dist::GradReducer reducer(model.parameters()); // averages gradients while backward runs
//   for (...) {
//     loss = model(my_slice_of(global_batch));
//     loss.backward();                             // buckets start their all-reduce as they fill
//     reducer.finish();                            // wait, average: .grad is the global gradient
//     opt.step();
//   }
//
// Overlap. The reducer groups the parameters into buckets of about 25 MB in reverse registration
// order (the order backward finishes them: the last layer first). The tape's gradient-ready hook
// (autograd/tape.h) tells it when a parameter's gradient is final; when a bucket's parameters are
// all final, its gradients are copied into one flat buffer and its MPI_Iallreduce starts while
// backward goes on with the earlier layers. finish() starts what is left (parameters the loss did not
// reach count as zero gradients, as on every other rank), waits for every bucket, divides by N and
// writes the result back into each .grad. Open MPI moves a non-blocking collective forward only inside
// MPI calls, so every hook call also tests the pending requests.
//
// Failure. No wait is unbounded: every wait polls with a deadline (ATTOGRAD_DIST_TIMEOUT seconds,
// default 300) and, when it passes, prints which rank waited for what and aborts the whole job with
// MPI_Abort, so a rank that died or hangs makes the others exit with an error instead of waiting
// forever. MPI errors are returned (MPI_ERRORS_RETURN), not fatal, and raised as ag::Error naming the
// call. abort() is what an app calls when it fails on one rank.
//
// Without MPI (ATTOGRAD_MPI=OFF or not found) the same API runs a single process: rank 0 of 1, every
// collective a no-op. Started by mpirun with more than one rank, such a build refuses to run.
//
// On GPUs (NCCL). With the model on the GPU (one GPU per rank: dist::rank_gpu()), broadcast and
// GradReducer do the same on device memory with NCCL (dist/nccl.h): the buckets are flat CUDA
// tensors, filled on the GPU's stream, and each one's ncclAllReduce is queued on that stream as soon
// as the bucket is complete; finish() queues the division by N and the copies back into each .grad,
// then waits with the same deadline (polling the stream and NCCL's asynchronous error; on a failure
// ncclCommAbort, then abort()). MPI still starts the job, carries NCCL's id from rank 0 and the
// small collectives (metrics, barrier). A build without NCCL (ATTOGRAD_NCCL) refuses CUDA
// parameters in a job of more than one rank; a job of one takes them and does nothing.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ag::dist {

// Whether this build has the MPI backend, and NCCL (data parallelism on GPUs) on top of it.
bool mpi_available();
bool nccl_available();

// Joins the job mpirun started (MPI_Init_thread, funneled) when the environment says this process
// is a rank of one (Open MPI's OMPI_COMM_WORLD_SIZE, or PMI_SIZE / PMIX_RANK); otherwise a job of one.
// Idempotent. finalize() runs at exit (after a clean return from main).
void init();
bool initialized();
int rank();        // 0 .. world_size() - 1
int world_size();  // 1 when not under mpirun
inline bool is_main() { return rank() == 0; }
// This rank's place among the ranks on its host (after init): Open MPI's OMPI_COMM_WORLD_LOCAL_RANK,
// else the rank within MPI_Comm_split_type(MPI_COMM_TYPE_SHARED); 0 in a job of one.
int local_rank();
// This rank's GPU: cuda:(local_rank() mod the visible GPUs), so that the ranks of a host take one GPU
// each when there are as many GPUs as ranks. An ag::Error when no GPU is visible.
Device rank_gpu();

// Blocks until every rank arrives (bounded by the timeout).
void barrier();
// Overwrites each tensor on every rank with rank `root`'s values (in place; shapes, dtypes and
// devices must agree across ranks: a mismatch ends the job with a message naming the rank). CPU
// tensors go over MPI, CUDA tensors (on rank_gpu()) over NCCL.
void broadcast(const std::vector<Tensor>& tensors, int root = 0);
// values[i] = sum over ranks of values[i], on every rank.
void all_reduce_sum(std::vector<double>& values);
// Every rank's value of x, in rank order (a check that ranks agree, e.g. on a config hash).
std::vector<int64_t> all_gather(int64_t x);

// Ends the whole job at once with `code` after printing `why` on stderr (nothing when empty: the
// caller printed it already) (MPI_Abort under mpirun; exit otherwise).
[[noreturn]] void abort(const std::string& why, int code = 1);

// The seconds a collective may wait before the job is aborted (ATTOGRAD_DIST_TIMEOUT, default 300).
double timeout_seconds();

// Averages gradients across ranks, overlapped with backward (see the top of this file). Construct it
// once after the model; it installs the tape's gradient-ready hook on this thread for its lifetime
// (with one rank it installs nothing, allocates no buffers, and finish() returns at once). The
// parameters are all on the CPU or all on this rank's GPU (see "On GPUs" above).
class GradReducer {
 public:
  static constexpr size_t kDefaultBucketBytes = 25u << 20;
  explicit GradReducer(std::vector<Tensor> params, size_t bucket_bytes = kDefaultBucketBytes);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // After backward: starts the buckets not started yet, waits for all, averages, writes the .grads.
  void finish();

  int64_t num_buckets() const;
  // Buckets whose all-reduce started during backward (not in finish()) in the last step: the overlap.
  int64_t buckets_started_early() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ag::dist
