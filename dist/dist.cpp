// ag::dist on MPI: process group, collectives with deadlines, and the bucketed gradient reducer.
// See dist.h for the design. Everything MPI is under ATTOGRAD_WITH_MPI; without it the same
// functions run a job of one process. CUDA tensors go to dist/nccl.cpp (ATTOGRAD_WITH_NCCL).
#include "dist/dist.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <unordered_map>

#include "autograd/ops.h"
#include "autograd/tape.h"
#include "core/error.h"
#include "cuda/memory.h"

#if ATTOGRAD_WITH_MPI
#include <mpi.h>
#endif
#if ATTOGRAD_WITH_NCCL
#include "dist/nccl.h"
#endif

namespace ag::dist {

namespace {
bool g_initialized = false;
int g_rank = 0, g_world = 1, g_local_rank = 0;

// The world size mpirun (or another PMI launcher) announced in the environment, 0 when none did.
int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  if (std::getenv("PMIX_RANK")) return 1;  // a PMIx launch that does not say its size: ask MPI
  return 0;
}

#if ATTOGRAD_WITH_MPI
MPI_Comm g_comm = MPI_COMM_NULL;

// MPI calls return their error (MPI_ERRORS_RETURN on g_comm): raised as ag::Error naming the call.
void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail("dist: {} failed on rank {} of {}: {}", call, g_rank, g_world, std::string(text, len));
}

// Waits for `reqs` by polling, so that no wait outlives the deadline: a peer that died or hangs
// ends the job (abort) instead of blocking every other rank forever.
void wait_all(std::vector<MPI_Request>& reqs, const std::string& what) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const double limit = timeout_seconds();
  for (int polls = 0;; ++polls) {
    int done = 0;
    mpi_check(MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) return;
    const double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (waited > limit)
      abort(fmt::format("dist: rank {} of {} waited {:.0f} s for {} (ATTOGRAD_DIST_TIMEOUT={:.0f}); another "
                        "rank has died or hangs, so the job is stopped",
                        g_rank, g_world, waited, what, limit));
    // Spin briefly (a collective of a small model completes in microseconds), then sleep a little
    // so a rank waiting for a slow peer does not burn a core the peer may need.
    if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    default: fail("dist: gradients of dtype {} cannot be all-reduced (f32 or f64)", t);
  }
}

void finalize_at_exit() {
#if ATTOGRAD_WITH_NCCL
  nccl::finalize();  // NCCL's communicator before MPI's (normally gone already: see nccl::init)
#endif
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}
#endif

#if ATTOGRAD_WITH_NCCL
// The NCCL communicator of this rank's GPU, set up at the first collective that needs it (every
// rank gets there at the same point of the program): rank 0 makes the id, MPI carries it.
void nccl_ready() {
  if (nccl::initialized()) return;
  const Device gpu = rank_gpu();
  std::string id = g_rank == 0 ? nccl::unique_id() : std::string(nccl::kIdBytes, '\0');
  std::vector<MPI_Request> req(1);
  mpi_check(MPI_Ibcast(id.data(), int(id.size()), MPI_BYTE, 0, g_comm, &req[0]), "MPI_Ibcast");
  wait_all(req, "the NCCL id from rank 0");
  nccl::init(id, g_rank, g_world, gpu.index);
}
#endif

// CUDA tensors in a collective of more than one rank need NCCL: the error of a build without it.
[[maybe_unused]] void require_nccl(const char* who, const std::string& what) {
  check(ATTOGRAD_WITH_NCCL,
        "{}: {} on the GPU in a job of {} ranks, but this build has no NCCL (configure with -DATTOGRAD_NCCL=ON, with "
        "the CUDA backend and MPI; NCCL comes with the CUDA toolkit or libnccl-dev), or keep the model on the CPU",
        who, what, g_world);
}
}  // namespace

bool mpi_available() { return ATTOGRAD_WITH_MPI; }
bool nccl_available() { return ATTOGRAD_WITH_NCCL; }

void init() {
  if (g_initialized) return;
  const int announced = launcher_world_size();
#if ATTOGRAD_WITH_MPI
  if (announced > 0) {
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    check(rc == MPI_SUCCESS, "dist: MPI_Init_thread failed (error {})", rc);
    mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &g_comm), "MPI_Comm_dup");
    mpi_check(MPI_Comm_set_errhandler(g_comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    mpi_check(MPI_Comm_rank(g_comm, &g_rank), "MPI_Comm_rank");
    mpi_check(MPI_Comm_size(g_comm, &g_world), "MPI_Comm_size");
    std::atexit(finalize_at_exit);
    // The rank among this host's ranks (which GPU it takes): Open MPI says it; else the ranks that
    // share memory with this one form a communicator (a collective: every rank is in init here).
    if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
      g_local_rank = std::max(0, std::atoi(v));
    } else if (g_world > 1) {
      MPI_Comm host = MPI_COMM_NULL;
      mpi_check(MPI_Comm_split_type(g_comm, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &host),
                "MPI_Comm_split_type");
      mpi_check(MPI_Comm_rank(host, &g_local_rank), "MPI_Comm_rank");
      mpi_check(MPI_Comm_free(&host), "MPI_Comm_free");
    }
  }
#else
  check(announced <= 1,
        "dist: started by mpirun as one of {} ranks, but this build of attograd has no MPI; install "
        "libopenmpi-dev (scripts/install-deps.sh) and rebuild, or run without mpirun",
        announced);
#endif
  g_initialized = true;
}

bool initialized() { return g_initialized; }
int rank() { return g_rank; }
int world_size() { return g_world; }
int local_rank() { return g_local_rank; }

Device rank_gpu() {
  const int gpus = cuda::device_count();
  check(gpus > 0, "dist::rank_gpu: rank {} of {} sees no CUDA GPU{}", g_rank, g_world,
        ATTOGRAD_WITH_CUDA ? "" : " (this build has no CUDA backend)");
  return Device::cuda(g_local_rank % gpus);
}

double timeout_seconds() {
  if (const char* v = std::getenv("ATTOGRAD_DIST_TIMEOUT")) {
    char* end = nullptr;
    double s = std::strtod(v, &end);
    if (end != v && *end == '\0' && s > 0) return s;
    std::fprintf(stderr, "dist: ignoring ATTOGRAD_DIST_TIMEOUT='%s' (want seconds > 0)\n", v);
  }
  return 300;
}

void abort(const std::string& why, int code) {
  if (!why.empty()) std::fprintf(stderr, "%s\n", why.c_str());
  std::fflush(stderr);
#if ATTOGRAD_WITH_MPI
  if (g_world > 1) MPI_Abort(g_comm, code);
#endif
  std::_Exit(code);
}

void barrier() {
#if ATTOGRAD_WITH_MPI
  if (g_world == 1) return;
  std::vector<MPI_Request> req(1);
  mpi_check(MPI_Ibarrier(g_comm, &req[0]), "MPI_Ibarrier");
  wait_all(req, "a barrier");
#endif
}

std::vector<int64_t> all_gather(int64_t x) {
  std::vector<int64_t> out(g_world, x);
#if ATTOGRAD_WITH_MPI
  if (g_world == 1) return out;
  std::vector<MPI_Request> req(1);
  mpi_check(MPI_Iallgather(&x, 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, g_comm, &req[0]), "MPI_Iallgather");
  wait_all(req, "an all-gather");
#endif
  return out;
}

void all_reduce_sum(std::vector<double>& values) {
#if ATTOGRAD_WITH_MPI
  if (g_world == 1 || values.empty()) return;
  std::vector<MPI_Request> req(1);
  mpi_check(MPI_Iallreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_DOUBLE, MPI_SUM, g_comm, &req[0]),
            "MPI_Iallreduce");
  wait_all(req, fmt::format("an all-reduce of {} metrics", values.size()));
#else
  (void)values;
#endif
}

void broadcast(const std::vector<Tensor>& tensors, int root) {
  if (g_world == 1) return;
#if ATTOGRAD_WITH_MPI
  check(root >= 0 && root < g_world, "dist::broadcast: root {} of a world of {}", root, g_world);
  // The ranks must agree on what is sent: count, shapes, dtypes and device types (a hash compared
  // across ranks), else the byte counts or the transports differ and MPI or NCCL would fail
  // obscurely, truncate or wait forever.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(tensors.size());
  bool any_cuda = false;
  for (const Tensor& t : tensors) {
    mix(uint64_t(t.dtype()));
    mix(uint64_t(t.device().type));
    for (int d = 0; d < t.ndim(); ++d) mix(uint64_t(t.size(d)));
    any_cuda = any_cuda || t.device().is_cuda();
  }
  std::vector<int64_t> hashes = all_gather(int64_t(h));
  for (int r = 0; r < g_world; ++r)
    if (hashes[r] != hashes[root])
      abort(fmt::format("dist::broadcast: rank {} holds {} tensors whose shapes, dtypes or devices differ from "
                        "rank {}'s (the ranks built different models: same options on every rank?)",
                        r, tensors.size(), root));
  if (any_cuda) require_nccl("dist::broadcast", "tensors");
#if ATTOGRAD_WITH_NCCL
  if (any_cuda) nccl_ready();
#endif
  // CPU tensors over MPI, CUDA tensors over NCCL (queued on the GPU's stream, in the same order on
  // every rank), then both waited for.
  std::vector<MPI_Request> reqs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    check(t.is_contiguous(), "dist::broadcast: tensor {} (shape {}) must be contiguous", i, t.shape());
    if (t.device().is_cuda()) {
#if ATTOGRAD_WITH_NCCL
      check(t.device().index == nccl::device(),
            "dist::broadcast: tensor {} (shape {}) is on {}, but this rank's GPU is cuda:{} (dist::rank_gpu())", i,
            t.shape(), t.device().str(), nccl::device());
      nccl::broadcast(t.raw_data(), t.nbytes(), root);
#endif
      continue;
    }
    reqs.emplace_back();
    mpi_check(MPI_Ibcast(t.raw_data(), int(t.nbytes()), MPI_BYTE, root, g_comm, &reqs.back()), "MPI_Ibcast");
  }
  const std::string what = fmt::format("a broadcast of {} tensors from rank {}", tensors.size(), root);
  wait_all(reqs, what);
#if ATTOGRAD_WITH_NCCL
  if (any_cuda) nccl::wait(what);
#endif
  // written in place: what was kept of their old values (the tape's saved tensors, autocast's
  // bf16 weights) is stale now
  for (const Tensor& t : tensors) mark_modified(t);
#endif
}

// ---- GradReducer ----------------------------------------------------------------------------
struct GradReducer::State {
  std::vector<Tensor> params;
  Device device = Device::cpu();  // of every parameter, and of the flat buffers
  struct Bucket {
    std::vector<size_t> members;   // indices into params, in the order backward finishes them
    std::vector<int64_t> offsets;  // each member's place in the flat buffer (elements)
    Tensor flat;                   // the gradients, contiguous on `device`: what is all-reduced
    int pending = 0;               // members whose gradient is not final yet in this step
    bool started = false;
#if ATTOGRAD_WITH_MPI
    MPI_Request request = MPI_REQUEST_NULL;
#endif
  };
  std::vector<Bucket> buckets;
  std::unordered_map<const TensorImpl*, size_t> param_index;
  std::vector<size_t> bucket_of;  // param -> bucket
  std::vector<char> ready;        // param's gradient final in this step
  int64_t started_early = 0, last_started_early = 0;
  GradReadyHook previous_hook;
  bool hooked = false;

  void reset_step() {
    std::fill(ready.begin(), ready.end(), 0);
    for (Bucket& b : buckets) b.pending = int(b.members.size()), b.started = false;
    started_early = 0;
  }

  // Copies the bucket's gradients (zeros for a parameter without one) into its flat buffer and
  // starts the all-reduce (sum; finish() divides by the world size).
  void start(Bucket& b) {
    if (device.is_cuda()) return start_on_gpu(b);
    const size_t item = itemsize(b.flat.dtype());
    char* flat = static_cast<char*>(b.flat.raw_data());
    for (size_t j = 0; j < b.members.size(); ++j) {
      const Tensor& p = params[b.members[j]];
      char* dst = flat + b.offsets[j] * item;
      Tensor g = p.grad();
      if (!g.defined()) {
        std::fill(dst, dst + p.nbytes(), 0);
        continue;
      }
      if (!g.is_contiguous()) g = g.contiguous();
      std::copy_n(static_cast<const char*>(g.raw_data()), g.nbytes(), dst);
    }
    b.started = true;
#if ATTOGRAD_WITH_MPI
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, b.flat.raw_data(), int(b.flat.numel()), mpi_type(b.flat.dtype()),
                             MPI_SUM, g_comm, &b.request),
              "MPI_Iallreduce");
#endif
  }

  // The same on the GPU: the copies are kernels on the device's stream (after the kernels that
  // wrote the gradients), and the ncclAllReduce is queued behind them on that stream. Nothing
  // waits here: backward goes on queuing its kernels.
  void start_on_gpu(Bucket& b) {
    NoGradGuard no_grad;
    for (size_t j = 0; j < b.members.size(); ++j) {
      const Tensor& p = params[b.members[j]];
      Tensor dst = b.flat.narrow(0, b.offsets[j], p.numel());
      Tensor g = p.grad();
      if (!g.defined()) dst.zero_();
      else dst.copy_(g.reshape({p.numel()}));
    }
    b.started = true;
#if ATTOGRAD_WITH_NCCL
    nccl::all_reduce_sum(b.flat.raw_data(), b.flat.numel(), b.flat.dtype());
#endif
  }

  // Lets started all-reduces progress (Open MPI advances them only inside MPI calls).
  void poke() {
#if ATTOGRAD_WITH_MPI
    for (Bucket& b : buckets)
      if (b.started && b.request != MPI_REQUEST_NULL) {
        int done = 0;
        mpi_check(MPI_Test(&b.request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      }
#endif
  }

  void on_ready(const Tensor& leaf) {
    auto it = param_index.find(&leaf.impl());
    if (it == param_index.end()) return;  // a leaf that is not a parameter (an input)
    const size_t i = it->second;
    Bucket& b = buckets[bucket_of[i]];
    check(!b.started,
          "dist::GradReducer: a second backward reached '{}' (shape {}) before finish(); call finish() after "
          "each backward (gradient accumulation across backwards is not supported with data parallelism)",
          i, leaf.shape());
    if (!ready[i]) {
      ready[i] = 1;
      if (--b.pending == 0) {
        start(b);
        ++started_early;
      }
    }
    poke();
  }
};

GradReducer::GradReducer(std::vector<Tensor> params, size_t bucket_bytes) : s_(std::make_unique<State>()) {
  check(bucket_bytes > 0, "dist::GradReducer: bucket size must be > 0 bytes");
  init();
  State& s = *s_;
  s.params = std::move(params);
  s.ready.assign(s.params.size(), 0);
  s.bucket_of.assign(s.params.size(), 0);
  if (!s.params.empty() && s.params[0].defined()) s.device = s.params[0].device();
  for (size_t i = 0; i < s.params.size(); ++i) {
    const Tensor& p = s.params[i];
    check(p.defined() && p.requires_grad(), "dist::GradReducer: parameter {} does not require grad", i);
    check(p.device() == s.device,
          "dist::GradReducer: parameter {} is on {} but parameter 0 on {}; the parameters must all be on the CPU or "
          "all on this rank's GPU",
          i, p.device().str(), s.device.str());
    check(p.dtype() == DType::f32 || p.dtype() == DType::f64,
          "dist::GradReducer: parameter {} has dtype {} (f32 or f64)", i, p.dtype());
    check(s.param_index.emplace(&p.impl(), i).second, "dist::GradReducer: parameter {} is listed twice", i);
  }
  // On the GPU, with other ranks: NCCL, on the GPU its communicator was made for.
  if (s.device.is_cuda() && g_world > 1) {
    require_nccl("dist::GradReducer", "parameters");
#if ATTOGRAD_WITH_NCCL
    const Device gpu = rank_gpu();
    check(s.device == gpu,
          "dist::GradReducer: the parameters are on {}, but this rank's GPU is {} (dist::rank_gpu(): local rank {} "
          "modulo {} visible GPUs); move the model there",
          s.device.str(), gpu.str(), g_local_rank, cuda::device_count());
    nccl_ready();
#endif
  }
  // Buckets in reverse registration order, each at most bucket_bytes (a larger parameter gets a
  // bucket of its own) and of one dtype. With one rank nothing is reduced: no flat buffers.
  State::Bucket cur;
  size_t cur_bytes = 0;
  auto close = [&] {
    if (cur.members.empty()) return;
    int64_t n = 0;
    for (size_t j : cur.members) cur.offsets.push_back(n), n += s.params[j].numel();
    if (g_world > 1) cur.flat = zeros({n}, s.params[cur.members[0]].dtype(), s.device);
    for (size_t j : cur.members) s.bucket_of[j] = s.buckets.size();
    s.buckets.push_back(std::move(cur));
    cur = State::Bucket();
    cur_bytes = 0;
  };
  for (size_t k = s.params.size(); k-- > 0;) {
    const Tensor& p = s.params[k];
    if (!cur.members.empty() &&
        (cur_bytes + p.nbytes() > bucket_bytes || p.dtype() != s.params[cur.members[0]].dtype()))
      close();
    cur.members.push_back(k);
    cur_bytes += p.nbytes();
  }
  close();
  s.reset_step();
  if (g_world > 1) {
    State* state = s_.get();
    s.previous_hook = set_grad_ready_hook([state](const Tensor& leaf) { state->on_ready(leaf); });
    s.hooked = true;
  }
}

GradReducer::~GradReducer() {
  if (s_->hooked) set_grad_ready_hook(std::move(s_->previous_hook));
}

void GradReducer::finish() {
  State& s = *s_;
  if (g_world == 1) return;
  s.last_started_early = s.started_early;
  for (State::Bucket& b : s.buckets)
    if (!b.started) s.start(b);
  const std::string what = fmt::format("the gradient all-reduce ({} buckets)", s.buckets.size());
#if ATTOGRAD_WITH_MPI
  if (s.device.is_cpu()) {
    std::vector<MPI_Request> reqs;
    for (State::Bucket& b : s.buckets) reqs.push_back(b.request);
    wait_all(reqs, what);
    for (State::Bucket& b : s.buckets) b.request = MPI_REQUEST_NULL;
  }
#endif
  // Average and write back: grad = flat[offset : offset + numel] / N, in the parameter's shape. On
  // the GPU these are kernels queued behind the all-reduces on the same stream.
  NoGradGuard no_grad;
  const double inv = 1.0 / g_world;
  for (State::Bucket& b : s.buckets) {
    b.flat.mul_(inv);
    for (size_t j = 0; j < b.members.size(); ++j) {
      const Tensor& p = s.params[b.members[j]];
      Tensor avg = b.flat.narrow(0, b.offsets[j], p.numel()).reshape(p.shape());
      Tensor g = p.grad();
      if (g.defined() && g.is_contiguous()) g.copy_(avg);
      else Tensor(p).set_grad(avg.clone());  // a handle to the same parameter
    }
  }
#if ATTOGRAD_WITH_NCCL
  // the all-reduces and the write-back done, within the deadline (or the job is stopped)
  if (s.device.is_cuda()) nccl::wait(what);
#endif
  s.reset_step();
}

int64_t GradReducer::num_buckets() const { return int64_t(s_->buckets.size()); }
int64_t GradReducer::buckets_started_early() const { return s_->last_started_early; }

}  // namespace ag::dist
