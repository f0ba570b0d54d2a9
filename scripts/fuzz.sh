#!/usr/bin/env bash
# Runs the libFuzzer harnesses (tests/fuzz; clang, AddressSanitizer and UndefinedBehaviorSanitizer, against
# the wheel's LibTorch: scripts/install-deps.sh first) for a bounded time each, from its committed seed
# corpus (tests/fuzz/corpus/<name>) plus what earlier runs found (<build>/corpus/<name>). Exit 1 when a
# harness finds a crash, a leak, a timeout or an out-of-memory input; the input is saved as
# <build>/findings/<harness>-crash-<sha1> (add it to the seed corpus and a test once fixed).
#   scripts/fuzz.sh [SECONDS] [HARNESS...]   default: 1800 s each, all of fuzz_pt fuzz_ampp_checkpoint fuzz_idx
#   AMPP_FUZZ_BUILD_DIR: the build (default build-fuzz/, configured here with the harnesses alone). CI passes
#   its sanitized build, which was configured with -DAMPP_BUILD_FUZZERS=ON and has them built already.
# CI (.ci/run) runs 40 s each. Prints each harness's executions and coverage (docs/training.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-1800}
shift || true
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=(fuzz_pt fuzz_ampp_checkpoint fuzz_idx)
build=${AMPP_FUZZ_BUILD_DIR:-$root/build-fuzz}
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found; scripts/install-deps.sh installs it" >&2; exit 1; }

if ! grep -qs "^AMPP_BUILD_FUZZERS:BOOL=ON" "$build/CMakeCache.txt"; then
  CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAMPP_TORCH=wheel \
    -DAMPP_PYTHON="${AMPP_VENV:-$root/.venv}/bin/python" -DAMPP_BUILD_FUZZERS=ON \
    -DAMPP_SANITIZE=address,undefined,fuzzer-no-link -DAMPP_BUILD_TESTS=OFF -DAMPP_BUILD_BENCH=OFF \
    -DAMPP_BUILD_TOOLS=OFF -DAMPP_BUILD_EXAMPLES=OFF >/dev/null
fi
cmake --build "$build" -j "${AMPP_JOBS:-$(nproc)}" --target "${harnesses[@]}"

# Leaks are checked per input; tests/lsan.supp lists the ones inside LibTorch (with their seeds).
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=0
mkdir -p "$build/findings"
for h in "${harnesses[@]}"; do
  name=${h#fuzz_}
  work=$build/corpus/$name
  mkdir -p "$work"
  log=$build/$h.log
  echo "=== $h: ${seconds}s from tests/fuzz/corpus/$name ($(ls "$root/tests/fuzz/corpus/$name" | wc -l) seeds)"
  # -max_len: the largest seed (an 800 KB tensor record) fits; -rss_limit_mb: a declared size that
  # gets allocated is a finding, not a slow machine.
  if ! "$build/tests/fuzz/$h" "$work" "$root/tests/fuzz/corpus/$name" -max_total_time="$seconds" -timeout=20 \
      -rss_limit_mb=3072 -max_len=1048576 -print_final_stats=1 -artifact_prefix="$build/findings/$h-" >"$log" 2>&1; then
    failed=1
    grep -E "ERROR|SUMMARY|==[0-9]+==|Test unit written|deadly signal" "$log" | head -20
    echo "FAIL: $h found a problem ($log)"
  fi
  # The last status line (executions, coverage) and the final stats.
  grep -E "^#[0-9]+.*(DONE|pulse|NEW|REDUCE)" "$log" | tail -1
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added" "$log" || true
done
exit $failed
