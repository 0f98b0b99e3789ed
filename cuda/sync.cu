// cuda::synchronize (cuda/memory.h): the host waits until the device has finished every kernel and
// copy queued on it, whatever the stream. For timing; the ops themselves never need it.
#include "cuda/common.cuh"

namespace ag::cuda {

void synchronize(int device) {
  cudaCheck(cudaSetDevice(device));
  cudaCheck(cudaDeviceSynchronize());
}

}  // namespace ag::cuda
