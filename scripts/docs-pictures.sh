#!/usr/bin/env bash
# The pictures of docs/img/ that come from running programs (make docs calls this after
# build/docpics has drawn the exact ones):
#   scaling.svg               build/walkthrough's sqrt(d_k) experiment
#   vit-patches.svg, textclf-padding.svg, textclf-size.svg
#                             build/recipefigs, from the committed runs of docs/results/ (no training)
#   checkpointing.svg         build/bench_checkpoint: a stack's memory with and without checkpointing
#   why-attention.svg, kv-cache-cost.svg
#                             build/bench_why_attention and build/bench_decode --plot-only, from the
#                             committed runs of docs/results/ (no measuring)
#   apps/<app>-attention.svg  the attention heatmaps of vit, textclf, gpt and imagetext after a default run
#                             (the best model by validation), on the Debian data of README.md
# Usage: scripts/docs-pictures.sh BUILD_DIR [--no-apps], with those programs built (make docs
# builds them). The runs go to runs/docs/<app>; each app's command line is printed, and written
# beside its picture in docs/img/apps/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/docs-pictures.sh BUILD_DIR [--no-apps]}
apps=1
[[ ${2:-} == --no-apps ]] && apps=0

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/walkthrough" --out "$tmp" > "$tmp/walkthrough.log"
cp "$tmp/scaling.svg" docs/img/scaling.svg
echo "wrote docs/img/scaling.svg"
"$build/recipefigs"
"$build/bench_checkpoint" --layers 1,2,4,8 --reps 1 --svg docs/img/checkpointing.svg > "$tmp/checkpointing.log"
echo "wrote docs/img/checkpointing.svg"
"$build/bench_why_attention" --plot-only docs/results/why-attention-2026-12-07/why-attention.jsonl \
  --svg docs/img/why-attention.svg
"$build/bench_decode" --plot-only docs/results/kv-cache-2026-12-07/kv-cache.jsonl --svg docs/img/kv-cache-cost.svg
[[ $apps == 1 ]] || exit 0

mkdir -p docs/img/apps
{
  echo "# The apps' attention heatmaps"
  echo
  echo "Drawn by \`make docs\` (scripts/docs-pictures.sh) from a default run of each app, the best"
  echo "model by validation; the report of each run is in runs/docs/<app>/report.json."
  echo
  echo "| picture | command |"
  echo "| --- | --- |"
} > "$tmp/README.md"
for app in vit textclf gpt imagetext; do
  cmd=("$build/$app" --out "runs/docs/$app" --quiet)
  echo "+ ${cmd[*]}"
  "${cmd[@]}" > "$tmp/$app.log" 2>&1 || { cat "$tmp/$app.log"; exit 1; }
  cp "runs/docs/$app/attention.svg" "docs/img/apps/$app-attention.svg"
  echo "wrote docs/img/apps/$app-attention.svg"
  echo "| [$app-attention.svg]($app-attention.svg) | \`build/$app --out runs/docs/$app\` |" >> "$tmp/README.md"
done
cp "$tmp/README.md" docs/img/apps/README.md
