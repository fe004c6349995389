#!/usr/bin/env bash
# The demo: serve the tiny model with vLLM on CPU (the `tiny` profile), run both tasks on the bundled sample,
# print the tables. A server already answering on the profile's port is used as is.
set -euo pipefail
cupid=.venv/bin/cupid
port=8011
$cupid serve prepare-tiny >/dev/null
started=0
if ! curl -sf "http://127.0.0.1:${port}/health" >/dev/null; then
  $cupid serve up --profile tiny
  started=1
fi
cleanup() { if [ "$started" = 1 ]; then $cupid serve down tiny >/dev/null || true; fi; }
trap cleanup EXIT
$cupid eval run --config configs/eval/tiny.yaml --allow-failures "$@"
# What it did, beyond the tables: every unit with its answers and labels, and the report with its intervals.
echo
echo "See what it did:  $cupid view runs/demo     (each unit: answers, checklists, labels, failures)"
echo "                  $cupid report runs/demo   (the report: figures with their intervals)"
