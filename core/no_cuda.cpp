// The CUDA side of core/ in both builds: ag::cuda::raise always, and in a build without the CUDA
// backend the functions of cuda/memory.h, each raising a clear ag::Error.
#include "core/error.h"
#include "cuda/memory.h"

namespace ag::cuda {

void raise(const std::string& message) { throw Error(message); }

#if !ATTOGRAD_WITH_CUDA
namespace {
[[noreturn]] void no_cuda(int device) {
  fail("cuda:{}: this build of attograd has no CUDA backend (configure with -DATTOGRAD_CUDA=ON "
       "on a machine with the CUDA toolkit)", device);
}
}  // namespace

bool available() { return false; }
int device_count() { return 0; }
void* device_alloc(int device, size_t) { no_cuda(device); }
void device_free(int, void*, size_t) {}
void copy(void*, int dst_device, const void*, int src_device, size_t) {
  no_cuda(dst_device >= 0 ? dst_device : src_device);
}
AllocStats alloc_stats(int) { return {}; }
void empty_cache(int) {}
void reset_peak_bytes(int) {}
void set_device(int device) { no_cuda(device); }
void synchronize(int device) { no_cuda(device); }
void* stream(int device) { no_cuda(device); }
void* record_event(int device) { no_cuda(device); }
double event_elapsed_ms(void*, void*) { return 0; }
void destroy_event(void*) {}
void set_allow_tf32(bool) {}
bool allow_tf32() { return false; }
#endif

}  // namespace ag::cuda
