#!/usr/bin/env bash
# One command for a machine with a GPU: build attograd with CUDA from scratch, run the GPU tests,
# benchmark the GPU kernels beside PyTorch eager, and write summary.txt and summary.json.
#
#   scripts/gpu-check.sh OUT_DIR
#
# Needs: nvcc, cmake (>= 3.25), ninja (else make), a C/C++ compiler, the Debian dev packages of
# fmt, nlohmann-json, CLI11, doctest and zlib (scripts/install-deps.sh), and a Python with PyTorch
# (CUDA build) for the reference column ($ATTOGRAD_PYTHON, else python3). Everything goes to a
# fresh build folder under $TMPDIR (kept when $KEEP_BUILD=1); OUT_DIR gets the logs, the raw
# results and the two summaries. Each step has a time limit, so the whole run stays under 8
# minutes: configure 30 s, build 290 s, tests 75 s, bench_gpu 50 s, PyTorch 35 s.
#
# BLAS. CMakeLists.txt finds cblas.h and libopenblas for the CPU side (f64 GEMMs through
# cblas_dgemm, f32 ones on attograd's own sgemm; OpenBLAS only when ATTOGRAD_GEMM=openblas) and
# core/parallel.cpp calls openblas_set_num_threads. Where no OpenBLAS is installed, this script
# compiles a small stand-in into the build folder: a cblas.h and a static "libopenblas.a" with
# plain-loop cblas_sgemm / cblas_dgemm and the three openblas_* functions attograd calls, and
# points CBLAS_INCLUDE_DIR / OPENBLAS_LIBRARY at it. Correct but slow: only the CPU side of the
# tests uses it (the CPU reference of the f64 cases, small shapes), never the GPU numbers.
# ATTOGRAD_BLAS_STANDIN=1 uses the stand-in even where OpenBLAS is installed.
set -uo pipefail

out=${1:?usage: scripts/gpu-check.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/attograd-gpu-check.XXXXXX")
build="$work/build"
py=${ATTOGRAD_PYTHON:-python3}
t_start=$(date +%s)
[ "${KEEP_BUILD:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT

note() { echo "[gpu-check $(( $(date +%s) - t_start ))s] $*" | tee -a "$out/steps.log"; }
: > "$out/steps.log"
status_configure=skipped status_build=skipped status_tests=skipped status_bench=skipped status_torch=skipped

# ---- the machine ---------------------------------------------------------------------------------
{
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1)"
  echo "cxx: $(c++ --version 2>/dev/null | head -1)"
  echo "torch: $("$py" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || echo none)"
  echo "commit: $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)"
} > "$out/machine.txt"
cat "$out/machine.txt"

# ---- BLAS: the system's OpenBLAS, else the stand-in --------------------------------------------
blas_flags=()
blas_kind="system OpenBLAS"
if [ "${ATTOGRAD_BLAS_STANDIN:-0}" = 1 ] || ! { ldconfig -p 2>/dev/null | grep -q 'libopenblas\.so' && { [ -e /usr/include/openblas/cblas.h ] ||
       [ -e /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h ] || [ -e /usr/include/cblas.h ]; }; }; then
  blas_kind="stand-in (plain loops, built here)"
  mkdir -p "$work/blas/include" "$work/blas/lib"
  cat > "$work/blas/include/cblas.h" <<'EOF'
/* Stand-in for OpenBLAS's cblas.h: only what attograd uses (scripts/gpu-check.sh). */
#pragma once
#ifdef __cplusplus
extern "C" {
#endif
typedef int blasint;
enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };
void cblas_sgemm(enum CBLAS_ORDER o, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K,
                 float alpha, const float* A, blasint lda, const float* B, blasint ldb, float beta, float* C, blasint ldc);
void cblas_dgemm(enum CBLAS_ORDER o, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K,
                 double alpha, const double* A, blasint lda, const double* B, blasint ldb, double beta, double* C,
                 blasint ldc);
void openblas_set_num_threads(int n);
char* openblas_get_corename(void);
char* openblas_get_config(void);
#ifdef __cplusplus
}
#endif
EOF
  cat > "$work/blas/blas.c" <<'EOF'
/* C = alpha op(A) op(B) + beta C by plain loops, both storage orders (scripts/gpu-check.sh). */
#include "cblas.h"
#define GEMM(name, T)                                                                                  \
  void name(enum CBLAS_ORDER o, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, blasint M, blasint N, \
            blasint K, T alpha, const T* A, blasint lda, const T* B, blasint ldb, T beta, T* C, blasint ldc) { \
    const int row = o == CblasRowMajor, at = ta != CblasNoTrans, bt = tb != CblasNoTrans;              \
    for (blasint i = 0; i < M; ++i)                                                                    \
      for (blasint j = 0; j < N; ++j) {                                                                \
        T acc = 0;                                                                                     \
        for (blasint k = 0; k < K; ++k) {                                                              \
          /* element (r, c) of a stored matrix with leading dim ld */                                  \
          const T a = row ? (at ? A[k * lda + i] : A[i * lda + k]) : (at ? A[i * lda + k] : A[k * lda + i]); \
          const T b = row ? (bt ? B[j * ldb + k] : B[k * ldb + j]) : (bt ? B[k * ldb + j] : B[j * ldb + k]); \
          acc += a * b;                                                                                \
        }                                                                                              \
        T* c = row ? &C[i * ldc + j] : &C[j * ldc + i];                                                \
        *c = alpha * acc + (beta == 0 ? 0 : beta * *c);                                                \
      }                                                                                                \
  }
GEMM(cblas_sgemm, float)
GEMM(cblas_dgemm, double)
void openblas_set_num_threads(int n) { (void)n; }
char* openblas_get_corename(void) { return (char*)"stand-in"; }
char* openblas_get_config(void) { return (char*)"stand-in cblas (plain loops)"; }
EOF
  if cc -O2 -fPIC -I"$work/blas/include" -c "$work/blas/blas.c" -o "$work/blas/blas.o" &&
     ar rcs "$work/blas/lib/libopenblas.a" "$work/blas/blas.o"; then
    blas_flags=(-DCBLAS_INCLUDE_DIR="$work/blas/include" -DOPENBLAS_LIBRARY="$work/blas/lib/libopenblas.a")
  else
    note "could not compile the BLAS stand-in"
  fi
fi
note "BLAS: $blas_kind"

# ---- configure and build -------------------------------------------------------------------------
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
note "configure (Release, CUDA on, this GPU's architecture)"
if timeout 30 cmake -S "$src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DATTOGRAD_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=native -DATTOGRAD_MPI=OFF "${blas_flags[@]}" > "$out/configure.log" 2>&1; then
  status_configure=ok
  note "build attograd_tests and bench_gpu"
  if timeout 290 cmake --build "$build" -j "$(nproc)" --target attograd_tests bench_gpu > "$out/build.log" 2>&1; then
    status_build=ok
  else
    status_build=failed
    tail -40 "$out/build.log"
  fi
else
  status_configure=failed
  tail -40 "$out/configure.log"
fi

# ---- GPU tests -----------------------------------------------------------------------------------
if [ "$status_build" = ok ]; then
  note "ctest -R cuda"
  (cd "$build" && timeout 75 ctest -R cuda --output-on-failure -j 4 --timeout 60) > "$out/tests.log" 2>&1
  rc=$?
  status_tests=$([ $rc = 0 ] && echo ok || echo failed)
  tail -25 "$out/tests.log"
fi

# ---- benchmarks: ours, then PyTorch on the same shapes ---------------------------------------------
B=4 H=8 D=64 Ts=256,1024,4096
if [ "$status_build" = ok ]; then
  note "bench_gpu"
  if timeout 50 "$build/bench_gpu" --batch $B --heads $H --d $D --T $Ts --json > "$out/bench_gpu.jsonl" 2> "$out/bench_gpu.err"; then
    status_bench=ok
  else
    status_bench=failed
    cat "$out/bench_gpu.err"
  fi
fi
note "PyTorch eager reference"
if timeout 35 "$py" - "$B" "$H" "$D" "$Ts" > "$out/torch.jsonl" 2> "$out/torch.err" <<'EOF'
# F.scaled_dot_product_attention and torch.matmul / F.linear on cuda:0, f32 (TF32 off, as cuBLAS's
# default math in attograd), timed like bench_gpu: median of 10 after 2 warm-up runs, each ending
# in a device synchronisation.
import json, sys, time
import torch
import torch.nn.functional as F
B, H, D = (int(x) for x in sys.argv[1:4])
Ts = [int(x) for x in sys.argv[4].split(",")]
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"
def median_ms(fn, reps=10, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2] * 1e3
g = torch.Generator(device=dev).manual_seed(0)
for T in Ts:
    for causal in (False, True):
        q, k, v = (torch.randn(B, H, T, D, device=dev, generator=g, requires_grad=True) for _ in range(3))
        do = torch.randn(B, H, T, D, device=dev, generator=g)
        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        def both():
            q.grad = k.grad = v.grad = None
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(do)
        print(json.dumps({"op": "attention", "B": B, "H": H, "T": T, "d": D, "causal": causal,
                          "fwd_ms": median_ms(fwd), "fwd_bwd_ms": median_ms(both)}), flush=True)
for name, a, b, lin in (("matmul 4096^3", (4096, 4096), (4096, 4096), False),
                        ("matmul (32, 512, 64) @ (32, 64, 512)", (32, 512, 64), (32, 64, 512), False),
                        ("linear (8192, 1024) -> 4096, bias", (8192, 1024), (4096, 1024), True)):
    x, w = torch.randn(*a, device=dev, generator=g), torch.randn(*b, device=dev, generator=g)
    bias = torch.randn(b[0], device=dev, generator=g)
    fn = (lambda: F.linear(x, w, bias)) if lin else (lambda: torch.matmul(x, w))
    print(json.dumps({"op": "matmul", "name": name, "ms": median_ms(fn)}), flush=True)
EOF
then
  status_torch=ok
else
  status_torch=failed
  tail -5 "$out/torch.err"
fi

# ---- summaries -----------------------------------------------------------------------------------
note "summary"
"$py" - "$out" "$status_configure" "$status_build" "$status_tests" "$status_bench" "$status_torch" \
  "$blas_kind" "$(( $(date +%s) - t_start ))" <<'EOF' || python3 -c 'print("summary: no Python to write it")'
import json, os, re, sys
out, s_conf, s_build, s_tests, s_bench, s_torch, blas, secs = sys.argv[1:9]
def lines(name):
    p = os.path.join(out, name)
    if not os.path.exists(p):
        return []
    res = []
    for l in open(p):
        l = l.strip()
        if l.startswith("{"):
            try:
                res.append(json.loads(l))
            except ValueError:
                pass
    return res
ours, torch = lines("bench_gpu.jsonl"), lines("torch.jsonl")
def key(r):
    return (r["op"], r.get("name"), r.get("T"), r.get("causal"))
theirs = {key(r): r for r in torch}
tests = {"passed": 0, "failed": 0, "skipped": 0, "failed_names": []}
tp = os.path.join(out, "tests.log")
if os.path.exists(tp):
    t = open(tp).read()
    m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", t)
    if m:
        tests["failed"], total = int(m.group(2)), int(m.group(3))
        tests["skipped"] = len(re.findall(r"\*\*\*Skipped|Not Run", t))
        tests["passed"] = total - tests["failed"] - tests["skipped"]
    tests["failed_names"] = re.findall(r"\d+ - (.+?) \((?:Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)", t)
machine = open(os.path.join(out, "machine.txt")).read().strip().splitlines() if os.path.exists(os.path.join(out, "machine.txt")) else []
rows = []
for r in ours:
    p = theirs.get(key(r), {})
    if r["op"] == "attention":
        row = {"op": "attention", "shape": [r["B"], r["H"], r["T"], r["d"]], "causal": r["causal"],
               "ours_fwd_ms": r["fwd_ms"], "torch_fwd_ms": p.get("fwd_ms"),
               "ours_fwd_bwd_ms": r["fwd_bwd_ms"], "torch_fwd_bwd_ms": p.get("fwd_bwd_ms")}
    else:
        row = {"op": "matmul", "name": r["name"], "ours_ms": r["ms"], "torch_ms": p.get("ms")}
    rows.append(row)
summary = {"steps": {"configure": s_conf, "build": s_build, "tests": s_tests, "bench": s_bench, "torch": s_torch},
           "blas": blas, "seconds": int(secs), "machine": machine, "tests": tests, "bench": rows}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
def ratio(a, b):
    return f"{a / b:6.2f}x" if a and b else "     -"
def ms(x):
    return f"{x:9.3f}" if x is not None else "        -"
txt = ["attograd GPU check", *machine, f"BLAS (CPU side): {blas}", f"total: {secs} s",
       "steps: " + ", ".join(f"{k} {v}" for k, v in summary["steps"].items()),
       f"tests (ctest -R cuda): {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped"]
txt += [f"  FAILED: {n}" for n in tests["failed_names"]]
txt += ["", "attention f32 (B, H, T, d)        fwd ms: ours    torch  ours/torch   fwd+bwd ms: ours    torch  ours/torch"]
for r in rows:
    if r["op"] == "attention":
        name = "({}, {}, {}, {}){}".format(*r["shape"], " causal" if r["causal"] else "")
        txt.append(f"{name:<34} {ms(r['ours_fwd_ms'])} {ms(r['torch_fwd_ms'])} {ratio(r['ours_fwd_ms'], r['torch_fwd_ms'])}"
                   f"       {ms(r['ours_fwd_bwd_ms'])} {ms(r['torch_fwd_bwd_ms'])} {ratio(r['ours_fwd_bwd_ms'], r['torch_fwd_bwd_ms'])}")
txt += ["", "matmul f32                               ms: ours    torch  ours/torch"]
for r in rows:
    if r["op"] == "matmul":
        txt.append(f"{r['name']:<38} {ms(r['ours_ms'])} {ms(r['torch_ms'])} {ratio(r['ours_ms'], r['torch_ms'])}")
open(os.path.join(out, "summary.txt"), "w").write("\n".join(txt) + "\n")
print("\n".join(txt))
EOF
note "done: $out/summary.txt, $out/summary.json"
[ "$status_build" = ok ] && [ "$status_tests" = ok ]
