#!/usr/bin/env bash
# The pictures of docs/img/ that come from running programs (make docs calls this after
# build/docpics has drawn the exact ones):
#   scaling.svg               build/walkthrough's sqrt(d_k) experiment
#   apps/<app>-attention.svg  the attention heatmaps of vit, textclf, gpt and imagetext after a default run
#                             (the best model by validation), on the Debian data of README.md
# Usage: scripts/docs-pictures.sh BUILD_DIR [--no-apps]. The runs go to runs/docs/<app>; each
# app's command line is printed, and written beside its picture in docs/img/apps/README.md.
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
