#!/usr/bin/env bash
# Configures and builds ampp into build/ (or $AMPP_BUILD_DIR). Extra arguments go to cmake configure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${AMPP_BUILD_DIR:-$root/build}
jobs=${AMPP_JOBS:-$(nproc)}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${AMPP_BUILD_TYPE:-RelWithDebInfo} "$@" >/dev/null
cmake --build "$build" -j "$jobs"
