#!/usr/bin/env bash
# Fails when a C++ file differs from .clang-format; `scripts/check-format.sh --fix` rewrites them.
# Uses the pinned clang-format of the venv (scripts/install-deps.sh), so every machine formats alike.
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format=.venv/bin/clang-format
[[ -x $clang_format ]] || { echo "check-format: $clang_format missing; run scripts/install-deps.sh" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.h' '*.hpp' '*.cpp')
if [[ ${1:-} == --fix ]]; then
  "$clang_format" -i "${files[@]}"
else
  "$clang_format" --dry-run --Werror "${files[@]}"
  echo "check-format: ${#files[@]} files formatted as .clang-format says"
fi
