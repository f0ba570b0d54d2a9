#!/usr/bin/env bash
# Quick start (1): install dependencies, build the `ampp` CLI and its library (not the tests: the test
# command builds those into the same folder later), run the main job on its built-in default
# (Fashion-MNIST, mixed precision with dynamic loss scaling, 2 workers with DDP).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/build-dir.sh"
"$root/scripts/install-deps.sh"
start=$(date +%s)
echo "train-default: building the ampp CLI and its library (about 50 steps; about 3 minutes on 2 cores" \
     "from a fresh clone, seconds once built: docs/build.md)"
AMPP_TARGETS=ampp_cli "$root/scripts/build.sh"
echo "train-default: built in $(( $(date +%s) - start )) s; training (about 30 s on 2 cores)"
exec "$(ampp_build_dir "$root")/bin/ampp" train "$@"
