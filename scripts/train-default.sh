#!/usr/bin/env bash
# Quick start (1): install dependencies, build, run the main job on its built-in default
# (Fashion-MNIST, mixed precision with dynamic loss scaling, 2 workers with DDP).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/build-dir.sh"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
exec "$(ampp_build_dir "$root")/bin/ampp" train "$@"
