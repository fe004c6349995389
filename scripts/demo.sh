#!/usr/bin/env bash
# The demo: serve the tiny model on CPU, run the inference task on the bundled sample, print the table.
set -euo pipefail
cupid=.venv/bin/cupid
name=smollm2-135m-instruct
port=8011
model_dir=$($cupid serve prepare-tiny)
started=0
if ! curl -sf "http://127.0.0.1:${port}/health" >/dev/null; then
  $cupid serve up --engine transformers --model "$model_dir" --name "$name" --port "$port"
  started=1
fi
cleanup() { if [ "$started" = 1 ]; then $cupid serve down "$name" >/dev/null || true; fi; }
trap cleanup EXIT
$cupid eval run --config configs/eval/tiny.yaml --allow-failures "$@"
