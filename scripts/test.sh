#!/usr/bin/env bash
# Quick start (2): install dependencies, build, run every test suite.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
ctest --test-dir "${AMPP_BUILD_DIR:-$root/build}" --output-on-failure --timeout 600 -j 2 "$@"
