"""OpenMP's wait policy for a benchmarked process, shared by bench/compare_pytorch and
bench/profile_step (docs/benchmarks.md, "OpenMP wait policy").

A policy is "passive" (idle workers sleep at once: OMP_WAIT_POLICY=PASSIVE), "default" (libgomp's
own: spin ~300k rounds, then sleep) or a number N (GOMP_SPINCOUNT=N: spin N rounds, then sleep).
"""
import os


def check(wait):
    """Raises ValueError unless `wait` names a policy."""
    if wait not in ("default", "passive") and not wait.isdigit():
        raise ValueError(f"wait policy {wait!r}: expected default, passive or a number")


def env_with(wait, base=None):
    """A copy of `base` (default: os.environ) with the wait policy `wait`, and without
    OMP_NUM_THREADS (the benchmarks pass their thread count explicitly)."""
    check(wait)
    env = dict(os.environ if base is None else base)
    for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        env.pop(k, None)
    if wait == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif wait != "default":
        env["GOMP_SPINCOUNT"] = wait
    return env


def label(wait):
    return {"passive": "OMP_WAIT_POLICY=PASSIVE", "default": "libgomp's default wait policy"}.get(
        wait, f"GOMP_SPINCOUNT={wait}")
