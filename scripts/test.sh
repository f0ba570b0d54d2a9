#!/usr/bin/env bash
# Quick start (2): install dependencies, build, run every test suite.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/build-dir.sh"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
ctest --test-dir "$(ampp_build_dir "$root")" --output-on-failure --timeout 600 -j 2 "$@"
