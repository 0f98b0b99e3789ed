#pragma once
// ag::dist on GPUs: the NCCL communicator of this rank's GPU and the collectives dist.cpp queues on
// that GPU's stream (the one stream of cuda/common.cuh, so they run in order with the kernels that
// wrote the gradients, with no synchronisation). Internal to dist/: programs call dist/dist.h, whose
// broadcast and GradReducer come here for CUDA tensors. Plain C++ (no nccl.h, no CUDA headers);
// defined in dist/nccl.cpp, which is compiled when the build has NCCL (ATTOGRAD_WITH_NCCL, CMake
// option ATTOGRAD_NCCL: needs the CUDA backend and MPI).
//
// Set-up (dist.cpp, at the first CUDA collective): rank 0 makes an id (unique_id), MPI carries it
// to every rank, and each rank joins with init() on its GPU (dist::rank_gpu()). The communicator
// lives until finalize(), which runs at exit before MPI_Finalize.
//
// Failure: every NCCL call is checked (ag::Error naming the call, NCCL's error string and its last
// error text). wait() never blocks without bound: it polls the stream and NCCL's asynchronous error
// against dist::timeout_seconds(), and on a deadline or an NCCL error aborts the communicator
// (ncclCommAbort) and then the job (dist::abort), naming the rank and what it waited for.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace ag::dist::nccl {

inline constexpr size_t kIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES (checked in nccl.cpp)

// A fresh communicator id (ncclGetUniqueId), kIdBytes bytes: made on rank 0, sent to the others.
std::string unique_id();
// Joins the communicator `id` as `rank` of `world` on GPU `device` (cudaSetDevice, then
// ncclCommInitRank: returns once every rank has joined).
void init(const std::string& id, int rank, int world, int device);
bool initialized();
int device();  // the GPU of the communicator (after init)

// Queued on the communicator GPU's stream; `data` is device memory of that GPU. In place.
void all_reduce_sum(void* data, int64_t count, DType dtype);     // ncclAllReduce, ncclSum
void broadcast(void* data, size_t bytes, int root);               // ncclBroadcast from `root`
// Waits until everything queued on the stream so far (the collectives above, and the kernels
// after them) has finished, polling against the deadline (see the top of this file).
void wait(const std::string& what);
// ncclCommDestroy (after the queued work); idempotent. At exit, before MPI_Finalize.
void finalize();

}  // namespace ag::dist::nccl
