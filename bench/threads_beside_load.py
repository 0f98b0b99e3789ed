#!/usr/bin/env python3
"""Training speed of an app beside a busy process, at --threads 0 (the default: the cores other
processes leave free, apps/common/threads.h) and at fixed counts (docs/benchmarks.md, "Threads
beside another process").

For each round and each load (0 or 1 busy processes beside the app: a spinning shell, or with
--neighbour app the same app training at --threads 2) it trains the app for --steps
steps at each --threads value, reads the training lines of its metrics.jsonl (the first one, with
the start-up, left out) and prints one JSON line: app, load, threads, rounds, samples_per_s (the
samples of those lines over their seconds), and the thread count the app ended with. Rounds
alternate the order of the settings, so a machine that drifts favours none of them.

    bench/threads_beside_load.py --app build/vit --steps 60 --rounds 2 > results.jsonl
    bench/threads_beside_load.py --app build/vit --steps 60 --rounds 2 --loads 1 --neighbour app

Standard library only; the app's own arguments follow `--`.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def neighbour(kind, app, tmp, k):
    """The busy process beside the app, until it is ended (at most 30 minutes): "spin", a shell
    spinning on one core; "app", the same app training at --threads 2 (another training run)."""
    if kind == "spin":
        cmd = ["sh", "-c", "while :; do :; done"]
    else:
        cmd = [app, "--steps", "1000000", "--threads", "2", "--quiet", "--out", os.path.join(tmp, f"neighbour-{k}")]
    return subprocess.Popen(["timeout", "1800"] + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run(app, threads, steps, extra, tmp):
    out = os.path.join(tmp, f"run-{threads}")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [app, "--steps", str(steps), "--threads", str(threads), "--log-every", "10",
           "--eval-every", str(steps), "--quiet", "--out", out] + extra
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"threads_beside_load: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    train = [l for l in lines if "samples_per_s" in l]
    if len(train) < 2:
        sys.exit(f"threads_beside_load: {out}/metrics.jsonl has {len(train)} training lines; raise --steps")
    samples = seconds = 0.0
    prev = train[0]
    for l in train[1:]:  # each line: the samples per second of the steps since the previous line
        n = l["step"] - prev["step"]
        seconds += n / l["samples_per_s"]
        samples += n
        prev = l
    # the count the app ended with: its last "threads: N of M cores" line, else the one it started with
    counts = re.findall(r"threads: (\d+) of \d+ cores", p.stderr)
    start = re.search(r"parameters, (\d+) threads?", p.stderr)
    ended = int(counts[-1]) if counts else (int(start.group(1)) if start else threads)
    return samples / seconds, ended


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", default="build/vit")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", default="0,1,2", help="the --threads values, comma-separated")
    ap.add_argument("--loads", default="0,1", help="how many busy processes beside the app, comma-separated")
    ap.add_argument("--neighbour", choices=["spin", "app"], default="spin",
                    help="the busy process: a spinning shell, or the same app training at --threads 2")
    ap.add_argument("extra", nargs="*", help="after --: more arguments for the app")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    loads = [int(l) for l in a.loads.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for load in loads:
                spinners = [neighbour(a.neighbour, a.app, tmp, k) for k in range(load)]
                time.sleep(0.5 if a.neighbour == "spin" else 5)  # an app loads its data first
                try:
                    order = threads if r % 2 == 0 else threads[::-1]
                    for t in order:
                        sps, ended = run(a.app, t, a.steps, a.extra, tmp)
                        results.setdefault((load, t), []).append((sps, ended))
                        print(f"round {r + 1} load {load} --threads {t}: {sps:.1f} samples/s, ended on {ended}",
                              file=sys.stderr)
                finally:
                    for s in spinners:
                        s.send_signal(signal.SIGTERM)
                        s.wait()
    for (load, t), runs in sorted(results.items()):
        print(json.dumps({"app": os.path.basename(a.app), "extra": a.extra, "neighbour": a.neighbour,
                          "load": load, "threads": t,
                          "steps": a.steps, "rounds": len(runs),
                          "samples_per_s": [round(s, 2) for s, _ in runs],
                          "ended_threads": [e for _, e in runs]}))


if __name__ == "__main__":
    main()
