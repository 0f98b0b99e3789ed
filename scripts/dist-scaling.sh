#!/bin/sh
# Data-parallel overhead of the three apps at their default model sizes: one process with
# --threads T against mpirun -np 2 with --threads T/2 each, the same global batch, a fixed number of
# steps, no evaluation until the last step. Prints one table row per app and setting from each
# run's report.json (training time only: train_seconds leaves out evaluation and start-up).
#
#   scripts/dist-scaling.sh [BUILD_DIR] [THREADS]       (defaults: build, 2)
# It makes the table of docs/distributed.md. As root, Open MPI wants
# OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in the environment.
set -eu
BUILD=${1:-build}
THREADS=${2:-2}
HALF=$((THREADS / 2))
[ "$HALF" -ge 1 ] || HALF=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export OMP_WAIT_POLICY=PASSIVE

# app, steps, global batch, the app's own options
run_app() {
  app=$1 steps=$2 batch=$3
  shift 3
  common="--steps $steps --eval-every $steps --quiet --sample-tokens 0"
  [ "$app" = gpt ] || common="--steps $steps --eval-every $steps --quiet"
  "$BUILD/$app" $common --threads "$THREADS" --batch "$batch" --out "$OUT/$app-1" "$@" >"$OUT/$app-1.log" 2>&1
  mpirun -np 2 --oversubscribe "$BUILD/$app" $common --threads "$HALF" --batch $((batch / 2)) \
    --out "$OUT/$app-2" "$@" >"$OUT/$app-2.log" 2>&1
  for n in 1 2; do
    python3 - "$OUT/$app-$n/report.json" "$app" "$n" "$THREADS" "$HALF" "$batch" <<'EOF'
import json, sys
path, app, n, threads, half, batch = sys.argv[1:]
r = json.load(open(path))
procs = "1 process x %s threads" % threads if n == "1" else "2 processes x %s thread%s" % (half, "s" if half != "1" else "")
steps_s = r["steps"] / r["train_seconds"]
print("| %s | %s | %s | %d | %.2f | %.0f |" % (app, procs, batch, r["steps"], steps_s, r["samples_per_second"]))
EOF
  done
}

echo "| app | setting | global batch | steps | steps/s | samples/s |"
echo "| --- | --- | --- | --- | --- | --- |"
run_app vit 60 128
run_app textclf 60 64 --baseline off
run_app gpt 10 32
