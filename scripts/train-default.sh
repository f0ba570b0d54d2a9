#!/usr/bin/env bash
# Quick start (1): install dependencies, build, run the main job on its built-in default
# (Fashion-MNIST, mixed precision with dynamic loss scaling, 2 workers with DDP).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
exec "${AMPP_BUILD_DIR:-$root/build}/bin/ampp" train "$@"
