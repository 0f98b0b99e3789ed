// ag::dist on GPUs with NCCL: the communicator of this rank's GPU, the collectives queued on the
// GPU's stream, and the bounded wait for them. See dist/nccl.h; dist.cpp decides when they run.
// Compiled only in a build with NCCL (CMake: ATTOGRAD_NCCL, which needs CUDA and MPI).
#if ATTOGRAD_WITH_NCCL
#include "dist/nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "cuda/memory.h"
#include "dist/dist.h"

namespace ag::dist::nccl {

namespace {

static_assert(sizeof(ncclUniqueId) == kIdBytes, "dist/nccl.h: kIdBytes must be NCCL_UNIQUE_ID_BYTES");

// The device's stream, where attograd queues all its work (cuda/memory.h): the collectives go on
// it too, so they are ordered after the kernels that wrote the gradients.
cudaStream_t stream_of(int device) { return static_cast<cudaStream_t>(cuda::stream(device)); }

// Every CUDA runtime call: an ag::Error naming the call and CUDA's error.
void cuda_check(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) return;
  fail("dist (NCCL): {} failed: {} ({})", call, cudaGetErrorName(rc), cudaGetErrorString(rc));
}

ncclComm_t g_comm = nullptr;
int g_device = -1;
cudaEvent_t g_done = nullptr;  // recorded on the stream by wait(), then polled

// NCCL's description of its last error (a sentence naming the cause: a peer, a transport), when
// this version of NCCL keeps one (2.13 and later).
std::string last_error() {
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  const char* text = ncclGetLastError(g_comm);
  if (text && *text) return fmt::format(" ({})", text);
#endif
  return {};
}

// Every NCCL call: an ag::Error naming the call, the rank, NCCL's error string and last error.
void nccl_check(ncclResult_t rc, const char* call) {
  if (rc == ncclSuccess) return;
  fail("dist: {} failed on rank {} of {} (cuda:{}): {}{}", call, dist::rank(), dist::world_size(), g_device,
       ncclGetErrorString(rc), last_error());
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    default: fail("dist: tensors of dtype {} cannot be all-reduced with NCCL (f32 or f64)", t);
  }
}

void require_comm(const char* what) {
  check(g_comm != nullptr, "dist: {} on the GPU before the NCCL communicator was set up (dist::init, then a "
                           "CUDA collective)", what);
}

// The end of a failed wait: the communicator is aborted first (its kernels stop waiting for
// peers, its resources go), then the job, with the message that says which rank waited for what.
[[noreturn]] void stop(const std::string& why) {
  if (g_comm) {
    ncclComm_t c = g_comm;
    g_comm = nullptr;
    ncclCommAbort(c);  // its own error would change nothing: the job ends next
  }
  dist::abort(why);
}

}  // namespace

std::string unique_id() {
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return std::string(id.internal, kIdBytes);
}

void init(const std::string& id, int rank, int world, int device) {
  if (g_comm) return;
  check(id.size() == kIdBytes, "dist: an NCCL id of {} bytes (expected {})", id.size(), kIdBytes);
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), kIdBytes);
  g_device = device;
  cuda::set_device(device);
  (void)stream_of(device);  // the device's stream exists before NCCL queues work on it
  if (!g_done) cuda_check(cudaEventCreateWithFlags(&g_done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  ncclComm_t comm = nullptr;
  nccl_check(ncclCommInitRank(&comm, world, uid, rank), "ncclCommInitRank");
  g_comm = comm;  // only once it is whole
  // Registered after the CUDA runtime initialised (the calls above), so it runs before the
  // runtime's own clean-up at exit, and before dist's MPI_Finalize (registered at dist::init).
  static bool registered = false;
  if (!registered) std::atexit(finalize), registered = true;
}

bool initialized() { return g_comm != nullptr; }
int device() { return g_device; }

void all_reduce_sum(void* data, int64_t count, DType dtype) {
  require_comm("an all-reduce");
  cuda::set_device(g_device);
  nccl_check(ncclAllReduce(data, data, size_t(count), nccl_type(dtype), ncclSum, g_comm, stream_of(g_device)),
             "ncclAllReduce");
}

void broadcast(void* data, size_t bytes, int root) {
  require_comm("a broadcast");
  cuda::set_device(g_device);
  nccl_check(ncclBroadcast(data, data, bytes, ncclUint8, root, g_comm, stream_of(g_device)), "ncclBroadcast");
}

void wait(const std::string& what) {
  require_comm("a wait");
  cuda::set_device(g_device);
  cuda_check(cudaEventRecord(g_done, stream_of(g_device)), "cudaEventRecord");
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const double limit = timeout_seconds();
  for (int polls = 0;; ++polls) {
    const cudaError_t q = cudaEventQuery(g_done);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady)
      stop(fmt::format("dist: rank {} of {}: the GPU (cuda:{}) failed while this rank waited for {}: {} ({})",
                       dist::rank(), dist::world_size(), g_device, what, cudaGetErrorName(q), cudaGetErrorString(q)));
    ncclResult_t async = ncclSuccess;
    nccl_check(ncclCommGetAsyncError(g_comm, &async), "ncclCommGetAsyncError");
    if (async != ncclSuccess)
      stop(fmt::format("dist: rank {} of {}: NCCL failed while this rank waited for {} on cuda:{}: {}{}; the job "
                       "is stopped",
                       dist::rank(), dist::world_size(), what, g_device, ncclGetErrorString(async), last_error()));
    const double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (waited > limit)
      stop(fmt::format("dist: rank {} of {} waited {:.0f} s for {} on cuda:{} (ATTOGRAD_DIST_TIMEOUT={:.0f}); "
                       "another rank has died or hangs, so the job is stopped",
                       dist::rank(), dist::world_size(), waited, what, g_device, limit));
    // as dist.cpp's wait_all: spin briefly (a step's all-reduce ends within milliseconds), then
    // sleep a little between polls
    if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void finalize() {
  if (!g_comm) return;
  ncclComm_t c = g_comm;
  g_comm = nullptr;
  ncclCommDestroy(c);  // at exit: nothing is left to report an error to
  if (g_done) cudaEventDestroy(g_done), g_done = nullptr;
}

}  // namespace ag::dist::nccl
#endif  // ATTOGRAD_WITH_NCCL
