// The per-device runtime state of the CUDA backend (declared in cuda/common.cuh and cuda/memory.h):
// the current device, one stream and one cuBLAS handle per device, created at first use.
//
// Every kernel, cuBLAS call and copy of a device runs on that device's one stream, so work on a
// device is ordered by the stream alone (see cuda/common.cuh). The handle is bound to the stream
// with cublasSetStream. TF32 is off by default (CUBLAS_DEFAULT_MATH: f32 GEMMs in full f32, as the
// CPU computes them); set_allow_tf32(true) lets cuBLAS use TF32 tensor cores for f32 GEMMs.
#include <atomic>
#include <mutex>

#include "cuda/common.cuh"

namespace ag::cuda {

namespace {

constexpr int kMaxDevices = 64;

struct DeviceState {
  std::once_flag once;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
};

DeviceState& state(int device) {
  static DeviceState states[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) raise("cuda: device index " + std::to_string(device) + " is out of range");
  return states[device];
}

std::atomic<bool> g_allow_tf32{false};

cublasMath_t math_mode() { return g_allow_tf32.load() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH; }

// The device KERNEL() made current on this thread (-1: not known yet, ask the runtime).
thread_local int t_current = -1;

// The stream and handle of `device`, created on first use (with `device` current).
DeviceState& ready(int device) {
  DeviceState& s = state(device);
  std::call_once(s.once, [&] {
    set_device(device);
    cudaCheck(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    cublasCheck(cublasCreate(&s.cublas));
    cublasCheck(cublasSetStream(s.cublas, s.stream));
    cublasCheck(cublasSetMathMode(s.cublas, math_mode()));
  });
  return s;
}

}  // namespace

// Every cudaSetDevice of the backend goes through here, so the cached index stays right.
void set_device(int device) {
  if (device == t_current) return;
  cudaCheck(cudaSetDevice(device));
  t_current = device;
}

int current_device() {
  if (t_current < 0) cudaCheck(cudaGetDevice(&t_current));
  return t_current;
}

cudaStream_t stream() { return ready(current_device()).stream; }

cublasHandle_t cublas() { return ready(current_device()).cublas; }

cudaStream_t stream_of(int device) { return ready(device).stream; }

void* stream(int device) { return stream_of(device); }  // the public face of stream_of (cuda/memory.h)

void set_allow_tf32(bool allow) {
  g_allow_tf32.store(allow);
  for (int d = 0; d < device_count() && d < kMaxDevices; ++d) {
    DeviceState& s = state(d);
    if (s.cublas) cublasCheck(cublasSetMathMode(s.cublas, math_mode()));
  }
}

bool allow_tf32() { return g_allow_tf32.load(); }

void* record_event(int device) {
  set_device(device);
  cudaEvent_t e = nullptr;
  cudaCheck(cudaEventCreate(&e));
  cudaCheck(cudaEventRecord(e, stream_of(device)));
  return e;
}

double event_elapsed_ms(void* start, void* end) {
  cudaCheck(cudaEventSynchronize(static_cast<cudaEvent_t>(end)));
  float ms = 0;
  cudaCheck(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}

void destroy_event(void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

void synchronize(int device) {
  set_device(device);
  cudaCheck(cudaStreamSynchronize(stream_of(device)));
}

}  // namespace ag::cuda
