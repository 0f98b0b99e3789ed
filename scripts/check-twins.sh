#!/usr/bin/env bash
# The twin check (bench/check_twins.py): each sample model and its PyTorch twin give the same
# logits, with weights going both ways through safetensors files.
#   scripts/check-twins.sh [build-dir]
# Needs a Python with torch (ATTOGRAD_PYTHON, else python3, else /usr/bin/python3). The
# safetensors package comes from a virtual environment made in <build-dir>/venv-twins (with the
# system's packages and torch's own site-packages visible, so that torch is used) when that Python
# lacks it.
# Part 2 trains each app for a few steps (tiny sizes) into <build-dir>/twin-runs and loads those
# checkpoints into the twins. textclf runs with its default word tokenizer, so its subword n-gram
# table (ngram.weight) is on in both parts; the script fails if the checkpoint lacks it.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

py=""
for cand in "${ATTOGRAD_PYTHON:-}" python3 /usr/bin/python3; do
  [[ -n "$cand" ]] && "$cand" -c "import torch" 2>/dev/null && { py=$cand; break; }
done
[[ -n "$py" ]] || { echo "check-twins: no Python with torch found (set ATTOGRAD_PYTHON)" >&2; exit 2; }
if ! "$py" -c "import safetensors.torch" 2>/dev/null; then
  venv="$build/venv-twins"
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "check-twins: making $venv with safetensors (torch from $py)" >&2
    "$py" -m venv --system-site-packages "$venv"
    # torch's own site-packages as well, for a torch that lives in another virtual environment
    # (--system-site-packages sees only the base installation's)
    "$py" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' \
      > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch-site.pth"
    "$venv/bin/pip" install -q safetensors
  fi
  py="$venv/bin/python"
fi

cmake --build "$build" -j "$(nproc)" --target twin_logits gpt vit textclf longseq imagetext > /dev/null
runs="$build/twin-runs"
rm -rf "$runs"
mkdir -p "$runs"
common=(--steps 3 --eval-every 3 --quiet --threads 2)
"$build/gpt" "${common[@]}" --out "$runs/gpt" --d-model 32 --layers 2 --context 32 --sample-tokens 0 > "$runs/gpt.log" 2>&1
"$build/vit" "${common[@]}" --out "$runs/vit" --d-model 32 --layers 2 --attention-images 1 > "$runs/vit.log" 2>&1
"$build/textclf" "${common[@]}" --out "$runs/textclf" --d-model 32 --layers 2 --max-len 64 --baseline off > "$runs/textclf.log" 2>&1
# longseq on ListOps generated from a seed (no data files), with a sparse pattern of small blocks
"$build/longseq" "${common[@]}" --out "$runs/longseq" --task listops --listops-train 64 --listops-val 16 \
  --listops-test 16 --listops-min-len 40 --listops-max-len 80 --d-model 32 --layers 2 --attention sparse --block 8 \
  > "$runs/longseq.log" 2>&1
# imagetext on scenes of Fashion-MNIST items (Debian's dataset-fashion-mnist), few scenes to evaluate
"$build/imagetext" "${common[@]}" --out "$runs/imagetext" --d-model 32 --enc-layers 1 --val-scenes 16 \
  --test-scenes 16 --retrieval-candidates 8 --attention-scenes 1 > "$runs/imagetext.log" 2>&1
"$py" bench/check_twins.py --binary "$build/twin_logits" \
  --checkpoint "gpt=$runs/gpt/checkpoint.safetensors" \
  --checkpoint "vit=$runs/vit/checkpoint.safetensors" \
  --checkpoint "textclf=$runs/textclf/checkpoint.safetensors" \
  --checkpoint "longseq=$runs/longseq/checkpoint.safetensors" \
  --checkpoint "imagetext=$runs/imagetext/checkpoint.safetensors"
# shellcheck disable=SC2016
"$py" -c 'import json, sys; from safetensors import safe_open
sys.exit(json.loads(safe_open(sys.argv[1], "pt").metadata()["extra.config"])["model"].get("ngram_buckets", 0) <= 0)' \
  "$runs/textclf/checkpoint.safetensors" ||
  { echo "check-twins: the textclf checkpoint has no subword n-grams (ngram_buckets 0)" >&2; exit 1; }
