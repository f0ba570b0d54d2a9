#!/usr/bin/env bash
# ampp on a machine with an NVIDIA GPU and no apt or network, in one command there (docs/gpu.md).
#
#   scripts/gpu-check.sh prepare    here (Debian, apt): gpu-kit/ holds what the GPU machine lacks or may
#                                   lack, from Debian's packages: Gloo's headers (the torch wheels ship
#                                   none), GoogleTest, CLI11, fmt's and nlohmann-json's CMake packages, zlib,
#                                   protobuf (protoc and the lite runtime) and the boost headers that
#                                   boost/crc.hpp needs; and torchao (gpu-kit/python, 26 MB), the Python
#                                   side of the benchmark's fp8 cases. About 41 MB; it travels with the
#                                   working tree (the device tool: carry ["gpu-kit"]).
#   scripts/gpu-check.sh run OUT    there: builds ampp's library (with the train layer and the CLI, which
#                                   the suite's `ampp train` tests drive) and the GPU suite against the torch
#                                   of that machine's python3 (or AMPP_PYTHON), runs the suite (each test against
#                                   Python torch on the same GPU), one process per test, and writes to OUT:
#                                   summary.txt (nvidia-smi, results), build.log, gpu_tests.log, fp16_emulation.md.
#   scripts/gpu-check.sh bench OUT  there: the GPU benchmark against Python torch (bench/gpu/compare.py):
#                                   gpu_bench.md, gpu_bench.log. Its results stay in the build folder, and a
#                                   second call on the same warm machine runs only the cases not run yet.
#   scripts/gpu-check.sh train OUT  there: `ampp train --device cuda` (below): train-runs.log.
#   scripts/gpu-check.sh all OUT    the three, most important first, in one call of the device tool that ends
#                                   within AMPP_GPU_CHECK_S (default 540 s): 8 files, the tool's most; then
#                                   the verdict.
#   scripts/gpu-check.sh verdict OUT  one screen from OUT's files: each GPU test, each `ampp train` run and
#                                   each benchmark bar, PASS, FAIL or SKIP (also appended to summary.txt);
#                                   exit 1 on a FAIL.
# Took 111 s on a 16-core H100 machine (80 s to configure and build); docs/gpu.md has its results.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kit=$root/gpu-kit

prepare() {
  rm -rf "$kit"
  mkdir -p "$kit/debs"
  # zlib (util), protobuf (train's TensorBoard events) and boost/crc.hpp (train) were never seen on that
  # machine (../shared/notes/cuda-build.md): brought along, so that the train and bench steps build there.
  (cd "$kit/debs" && apt-get download -q libgloo-dev libgtest-dev libgmock-dev libfmt-dev libfmt9 nlohmann-json3-dev \
    zlib1g-dev zlib1g protobuf-compiler libprotoc32 libprotobuf32 libprotobuf-lite32 libprotobuf-dev libcli11-dev)
  for deb in "$kit"/debs/*.deb; do dpkg -x "$deb" "$kit"; done
  rm -rf "$kit/debs" "$kit/usr/share/doc" "$kit/usr/share/lintian" "$kit/usr/share/man" "$kit/usr/src"
  # protobuf's and zlib's shared libraries only: their static ones are most of the bytes (GoogleTest has
  # only static ones, which the GPU suite links).
  rm -f "$kit"/usr/lib/x86_64-linux-gnu/{libprotobuf,libprotobuf-lite,libprotoc,libz}.a
  # zlib1g puts libz.so.1 in /lib: beside its libz.so symlink, where the linker and the rpath find it.
  mv "$kit"/lib/x86_64-linux-gnu/libz.so.* "$kit/usr/lib/x86_64-linux-gnu/" && rm -rf "$kit/lib"
  # Debian's libgloo-dev would also bring its libgloo.so: never link it next to a wheel's (linked-in) Gloo.
  rm -rf "$kit/usr/lib/libgloo.so"* "$kit/usr/share/cmake/Gloo"
  # The boost headers that boost/crc.hpp includes (a few hundred KB of the hundreds of MB of boost).
  echo '#include <boost/crc.hpp>' | g++ -M -x c++ - | tr ' \\' '\n\n' | grep '^/usr/include/boost/' | sort -u |
    while read -r header; do mkdir -p "$kit$(dirname "$header")" && cp "$header" "$kit$header"; done
  # protoc with the kit's libprotoc and libprotobuf, for the build only (the kit's libraries are never put
  # on LD_LIBRARY_PATH: its zlib would replace the system's in Python). ampp's binaries find theirs by rpath.
  cat > "$kit/usr/bin/protoc-kit" <<'SH'
#!/bin/sh
here=$(cd "$(dirname "$0")" && pwd)
LD_LIBRARY_PATH="$here/../lib/x86_64-linux-gnu" exec "$here/protoc" "$@"
SH
  chmod +x "$kit/usr/bin/protoc-kit"
  "$kit/usr/bin/protoc-kit" --version > /dev/null
  # torchao's Float8Linear for the benchmark's fp8 cases (the GPU machine has no network): the wheel unpacked,
  # without its dependency (torch, which that machine has). The bench puts it on PYTHONPATH.
  local python=${AMPP_PYTHON:-$root/.venv/bin/python}
  "$python" -m pip download -q --disable-pip-version-check --no-deps -d "$kit/wheels" torchao==0.18.0
  "$python" -m zipfile -e "$kit"/wheels/torchao-*.whl "$kit/python" && rm -rf "$kit/wheels"
  echo "gpu-check: $kit: $(du -sh "$kit" | cut -f1) ($(find "$kit" -type f | wc -l) files)"
}

run() {
  local out=${1:?usage: scripts/gpu-check.sh run OUT}
  [ -d "$kit/usr/include/gloo" ] && [ -x "$kit/usr/bin/protoc-kit" ] ||
    { echo "gpu-check: $kit is missing or old: run 'scripts/gpu-check.sh prepare' first" >&2; exit 1; }
  mkdir -p "$out"
  local python=${AMPP_PYTHON:-$(command -v python3)} build=${AMPP_BUILD_DIR:-$root/build-gpu} start=$SECONDS
  nvidia-smi >> "$out/summary.txt" 2>&1 || echo "gpu-check: nvidia-smi failed (no GPU?)" | tee -a "$out/summary.txt"
  # The GPU's own architecture, so that nothing is compiled for others (ampp has no .cu files; the
  # wheel's CMake wants the list all the same).
  local arch
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 || true)
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-${arch:-9.0}}
  "$python" -c "import torch; print('python torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)" \
    | tee -a "$out/summary.txt"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAMPP_TORCH=wheel \
    -DAMPP_PYTHON="$python" -DCMAKE_PREFIX_PATH="$kit/usr" -DProtobuf_PROTOC_EXECUTABLE="$kit/usr/bin/protoc-kit" \
    -DAMPP_BUILD_EXAMPLES=OFF -DAMPP_BUILD_BENCH=OFF > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  cmake --build "$build" -j "$(nproc)" --target ampp_gpu_tests ampp_io_tests >> "$out/build.log" 2>&1 ||
    { tail -40 "$out/build.log"; exit 1; }
  echo "gpu-check: configured and built in $((SECONDS - start)) s" | tee -a "$out/summary.txt"
  # One process per test: a crash (its backtrace printed by the suite) costs that test, not the rest, and
  # a hang at most 120 s (or what is left of the call).
  local suite=$build/tests/gpu/ampp_gpu_tests code=0 status test limit
  for test in $("$suite" --gtest_list_tests | awk '/^[^ ]/ {s = $1} /^  / {print s $1}'); do
    status=0 limit=$(seconds_left)
    limit=$(( limit < 120 ? (limit > 5 ? limit : 5) : 120 ))
    AMPP_GPU_REPORT_DIR="$out" timeout -k 5 "$limit" "$suite" --gtest_filter="$test" >> "$out/gpu_tests.log" 2>&1 || status=$?
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then echo "[ CRASHED  ] $test (timed out after $limit s)" >> "$out/gpu_tests.log"
    elif [ "$status" -gt 128 ]; then echo "[ CRASHED  ] $test (signal $((status - 128)))" >> "$out/gpu_tests.log"; fi
    if [ "$status" -ne 0 ]; then code=1; fi
  done
  # The io suite's GPU branches: storages saved on cuda:0 go back there, or to the device map_location names.
  status=0
  timeout -k 5 120 "$build/tests/io/ampp_io_tests" --gtest_filter='ArchiveReader.*' >> "$out/gpu_tests.log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then code=1; echo "[ CRASHED  ] ampp_io_tests (exit $status)" >> "$out/gpu_tests.log"; fi
  # The suite's own frames of any backtrace, as function and line (binutils' addr2line; debug info).
  grep -o "ampp_gpu_tests(+0x[0-9a-f]*)" "$out/gpu_tests.log" | grep -o "0x[0-9a-f]*" |
    sort -u | xargs -r addr2line -a -f -C -i -e "$suite" >> "$out/gpu_tests.log" 2>&1 || true
  grep -E "^\[ +(OK|FAILED|SKIPPED|CRASHED) +\] [A-Za-z0-9_]+\.[A-Za-z0-9_]+ \(" "$out/gpu_tests.log" | tee -a "$out/summary.txt" || true
  echo "gpu-check: done in $((SECONDS - start)) s, GPU suite exit code $code" | tee -a "$out/summary.txt"
  return $code
}

# `ampp train --device cuda` there: the whole library and the CLI (with the kit's zlib, protobuf, boost
# headers and CLI11), then short synthetic-data runs per precision, each beside the same run on the CPU's cores.
# Never run on a GPU yet (docs/gpu.md): a first run may well stop in the build; its log says where.
# The whole library, Release, for the GPU's architecture (train and bench share it): builds target $3 in
# folder $1 with $4's torch, adds to OUT ($2) / build.log, and says how long it took in OUT / $5.
build_full() {
  local build=$1 out=$2 target=$3 python=$4 start=$SECONDS arch
  local log=$out/build.log
  mkdir -p "$out"
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 || true)
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-${arch:-9.0}}
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAMPP_TORCH=wheel -DAMPP_PYTHON="$python" \
    -DCMAKE_PREFIX_PATH="$kit/usr" -DProtobuf_PROTOC_EXECUTABLE="$kit/usr/bin/protoc-kit" -DAMPP_BUILD_TESTS=OFF -DAMPP_BUILD_EXAMPLES=OFF -DAMPP_BUILD_BENCH=OFF \
    -DAMPP_BUILD_GPU_BENCH=ON >> "$log" 2>&1 || { tail -30 "$log"; exit 1; }
  cmake --build "$build" -j "$(nproc)" --target "$target" >> "$log" 2>&1 || { tail -40 "$log"; exit 1; }
  echo "gpu-check: $target configured and built in $((SECONDS - start)) s" | tee -a "$out/$5"
}

# Seconds left of the call that `all` runs in (AMPP_GPU_CHECK_END, a time in seconds since the epoch); a
# day when there is no such call.
seconds_left() { echo $(( ${AMPP_GPU_CHECK_END:-$(( $(date +%s) + 86400 ))} - $(date +%s) )); }

# One short synthetic-data run of `ampp train $4`, and its images/s and test accuracy in summary.txt; not
# run when less than 20 s of the call is left, and stopped when none is.
train_once() {
  local out=$1 build=$2 python=$3 flags=$4 left
  left=$(seconds_left)
  [ "$left" -ge 20 ] || { echo "$flags: not run (the call's time is spent)" | tee -a "$out/summary.txt"; return 0; }
  local data="--data synthetic:32768 --epochs 1"
  [[ "$flags" == *--data* ]] && data=""
  # shellcheck disable=SC2086
  timeout -k 5 "$left" "$build/bin/ampp" train $data --quiet --no-plots --out "$build/run" $flags \
    >> "$out/train-runs.log" 2>&1 &&
    echo "$flags: $("$python" -c 'import json, sys; s = json.load(open(sys.argv[1]));
print("%.0f images/s steady (%d steps), %.0f over the run, test accuracy %.2f %%" % (s["images_per_sec"],
      s.get("steady_steps", 0), s.get("wall_images_per_sec", 0), s["test_accuracy"]))' \
      "$build/run/summary.json")" | tee -a "$out/summary.txt" ||
    { echo "$flags: failed (train-runs.log)" | tee -a "$out/summary.txt"; return 1; }
}

train() {
  local out=${1:?usage: scripts/gpu-check.sh train OUT}
  local python=${AMPP_PYTHON:-$(command -v python3)} build=${AMPP_BUILD_DIR:-$root/build-gpu-train}
  if [ -z "${AMPP_BUILD_DIR:-}" ] && [ -x "$root/build-gpu/bin/ampp" ]; then
    build=$root/build-gpu  # the suite's build (RelWithDebInfo, -O2) has the CLI already: no second build
    echo "gpu-check: ampp train from the GPU suite's build ($build)" | tee -a "$out/summary.txt"
  else
    build_full "$build" "$out" ampp_cli "$python" summary.txt
  fi
  local failed=0 left
  # The main job against its Python twin on this GPU (bench/peer/compare_gpu.py): eager and --cuda-graphs
  # at each opt level, the cnn first, then the resnet, while 60 s of the call are left for the runs below.
  left=$(( $(seconds_left) - 60 ))
  if [ "$left" -ge 30 ]; then
    timeout -k 5 "$(( left + 40 ))" "$python" "$root/bench/peer/compare_gpu.py" --ampp "$build/bin/ampp" --python "$python" \
      --rounds 1 --images 16384 --budget-s "$left" > "$out/peer_gpu.md" 2>&1 || failed=1
    grep -E "^\||^left out|^\`" "$out/peer_gpu.md" | tee -a "$out/summary.txt" || true
  else
    echo "peer comparison: not run (the call's time is spent)" | tee -a "$out/summary.txt"
  fi
  # What the GPU suite's `ampp train` tests do not time: the CPU's cores on the same job, the distributed
  # flags with two workers sharing the GPU, the doctor, and `ampp bench`.
  # A text of about 2 MB for GPT-2 124M's evaluation (issue 52, defect 3: its batch once needed 105 GB).
  local flags text=$build/gpu-check-text.txt
  cat "$root"/docs/*.md "$root"/src/ampp/*/*.cpp "$root"/tests/*/*.cpp > "$text"
  for flags in "--device cpu --nproc 1 --opt-level O1 --dtype bf16" \
    "--device cuda --nproc 2 --opt-level O1 --dtype bf16 --sync-bn --zero" \
    "--device cuda --nproc 2 --opt-level O1 --dtype bf16 --fsdp" \
    "--device cuda --opt-level O2 --dtype bf16 --deterministic" \
    "--device cuda --opt-level O1 --dtype fp16 --doctor" \
    "--device cuda --model gpt2-124m --data text:$text --opt-level O1 --dtype bf16 --batch-size 8 --steps 20"; do
    train_once "$out" "$build" "$python" "$flags" || failed=1
  done
  # `ampp bench` on the GPU: the opt levels against O0, and the fused unscale against a flat copy.
  { [ "$(seconds_left)" -ge 30 ] && timeout -k 5 "$(seconds_left)" "$build/bin/ampp" bench --device cuda --models mlp cnn > "$build/bench.txt" 2>&1 &&
      tail -13 "$build/bench.txt" | tee -a "$out/summary.txt"; } ||
    { echo "ampp bench --device cuda: failed or not run" | tee -a "$out/summary.txt"; failed=1; }
  cat "$build/bench.txt" >> "$out/train-runs.log" 2>/dev/null || true
  return $failed
}

# The GPU benchmark (bench/gpu/compare.py): ampp beside Python torch on this GPU, the cases in order of
# importance until AMPP_GPU_BENCH_BUDGET_S (default 300) is spent, or under `all` until AMPP_GPU_BENCH_RESERVE_S
# are left of its call. The results stay in the build folder: a later call on the same warm machine adds
# the cases not run yet (remove gpu_bench_results.json there to measure again).
bench() {
  local out=${1:?usage: scripts/gpu-check.sh bench OUT}
  local python=${AMPP_PYTHON:-$(command -v python3)} build=${AMPP_BUILD_DIR:-$root/build-gpu-train} start=$SECONDS
  build_full "$build" "$out" ampp_gpu_bench "$python" gpu_bench.log
  local code=0 budget=${AMPP_GPU_BENCH_BUDGET_S:-300} left
  # Less 45 s: a case begun just before the budget's end may run on (each side at most 30 s past it), and
  # the limit (a matrix product) is measured after the cases.
  left=$(( $(seconds_left) - ${AMPP_GPU_BENCH_RESERVE_S:-0} - 45 ))
  if [ "$left" -lt "$budget" ]; then budget=$(( left > 30 ? left : 30 )); fi
  echo "gpu-check bench: a budget of $budget s" | tee -a "$out/gpu_bench.log"
  # torchao from the kit (prepare), for the fp8 cases' Python side; without it they say "skipped".
  [ -d "$kit/python/torchao" ] && export PYTHONPATH=$kit/python${PYTHONPATH:+:$PYTHONPATH}
  "$python" "$root/bench/gpu/compare.py" --ampp "$build/bench/gpu/ampp_gpu_bench" --python "$python" \
    --budget-s "$budget" --results "$build/gpu_bench_results.json" --out "$out/gpu_bench.md" \
    >> "$out/gpu_bench.log" 2>&1 || code=$?
  { echo; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } >> "$out/gpu_bench.md" 2>&1 || true
  echo "gpu-check bench: done in $((SECONDS - start)) s, exit code $code" | tee -a "$out/gpu_bench.log"
  return $code
}

# The verdict, one screen, from OUT's files: each GPU test, each `ampp train` run and each bar of the
# benchmarks, PASS, FAIL or SKIP (a bar not met is FAIL here; not measured, or not run for lack of time: SKIP).
verdict() {
  local out=${1:?usage: scripts/gpu-check.sh verdict OUT} lines
  lines=$(
    grep -hE "^\[ +(OK|FAILED|SKIPPED|CRASHED) +\] [A-Za-z0-9_/]+\.[A-Za-z0-9_/]+" "$out/summary.txt" 2>/dev/null |
      sed -E 's/^\[ +OK +\] /PASS  test /; s/^\[ +(FAILED|CRASHED) +\] /FAIL  test /; s/^\[ +SKIPPED +\] /SKIP  test /; s/ \([0-9]+ ms\)$//'
    grep -hE "^--device [^:]*: " "$out/summary.txt" 2>/dev/null |
      sed -E 's/^([^:]*): failed.*/FAIL  ampp train \1/; t; s/^([^:]*): not run.*/SKIP  ampp train \1/; t
        s/^([^:]*): .*/PASS  ampp train \1/'
    grep -hE "^- [0-9]+\. .*: (met|NOT met|not measured)" "$out/summary.txt" "$out/gpu_bench.md" 2>/dev/null | sort -u |
      sed -E 's/^- (.*): NOT met.*/FAIL  bar \1/; t; s/^- (.*): not measured.*/SKIP  bar \1/; t; s/^- (.*): met.*/PASS  bar \1/'
  )
  local pass fail skip
  pass=$(grep -c "^PASS" <<<"$lines" || true)
  fail=$(grep -c "^FAIL" <<<"$lines" || true)
  skip=$(grep -c "^SKIP" <<<"$lines" || true)
  # Appended to summary.txt (the device tool brings back 8 files at most): the last screen of it.
  printf 'gpu-check verdict:\n%s\ngpu-check verdict: %s passed, %s failed, %s skipped\n' "$lines" "$pass" "$fail" "$skip" |
    tee -a "$out/summary.txt"
  [ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
}

# The three in one call of the device tool (one machine start), most important first: the GPU suite (until
# 240 s are left), `ampp train` against its Python twin and with every flag (until 90 s are left), then
# the benchmark, each run while time is left. Each goes on if another fails.
all() {
  local out=${1:?usage: scripts/gpu-check.sh all OUT} code=0
  AMPP_GPU_CHECK_END=${AMPP_GPU_CHECK_END:-$(( $(date +%s) + ${AMPP_GPU_CHECK_S:-540} ))}
  export AMPP_GPU_CHECK_END
  (AMPP_GPU_CHECK_END=$(( AMPP_GPU_CHECK_END - 240 )) run "$out") || code=1
  (AMPP_GPU_CHECK_END=$(( AMPP_GPU_CHECK_END - 90 )) train "$out") || code=1
  (bench "$out") || code=1
  echo "gpu-check all: $(seconds_left) s of the call left, exit code $code" | tee -a "$out/summary.txt"
  verdict "$out" || code=1
  return $code
}

# Any part ends within AMPP_GPU_CHECK_S seconds when it is set (a second call with what is left of the
# device's time: AMPP_GPU_CHECK_S=200 scripts/gpu-check.sh bench OUT); `all` within 540 s when it is not.
if [ -n "${AMPP_GPU_CHECK_S:-}" ]; then
  AMPP_GPU_CHECK_END=$(( $(date +%s) + AMPP_GPU_CHECK_S ))
  export AMPP_GPU_CHECK_END
fi
case "${1:-}" in
  prepare) prepare ;;
  run) run "${2:-}" ;;
  train) train "${2:-}" ;;
  all) all "${2:-}" ;;
  bench) bench "${2:-}" ;;
  verdict) verdict "${2:-}" ;;
  *) echo "usage: scripts/gpu-check.sh prepare | run OUT | train OUT | all OUT | bench OUT | verdict OUT" >&2; exit 2 ;;
esac
