#!/usr/bin/env bash
# Sets up everything (apt packages, venv with torch, release build) and runs the demo job:
# a ResNet-18 trained data-parallel on 2 local ranks on the handwritten-digits images that
# scikit-learn bundles (no download), then scored and evaluated.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh
cargo build --release --workspace --bins
OUT="${1:-$ROOT/demo-out}"
rm -rf "$OUT"
mkdir -p "$OUT"
.venv/bin/python scripts/make_digits.py "$OUT/digits"
target/release/tchrun model init --arch resnet18 --input-size 32 --output "$OUT/untrained"
target/release/tchrun train --model "$OUT/untrained" --train "$OUT/digits/train" --valid "$OUT/digits/valid" \
  --output "$OUT/model" --procs-per-node 2 --epochs 4 --batch-size 32 --lr 0.025 \
  --min-crop-scale 0.5 --no-hflip --print-freq 20
target/release/tchrun score --model "$OUT/model" --images "$OUT/digits/valid" --output "$OUT/scores.csv"
target/release/tchrun evaluate --model "$OUT/model" --images "$OUT/digits/valid" --output "$OUT/eval"
echo "demo: model in $OUT/model (model.json, model.safetensors, metrics.jsonl, metrics.png),"
echo "      driver logs in $OUT/model/logs, predictions in $OUT/scores.csv,"
echo "      metrics and the confusion matrix in $OUT/eval"
