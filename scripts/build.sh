#!/usr/bin/env bash
# Configures and builds ampp. Extra arguments go to cmake configure.
#   AMPP_TORCH=wheel (default: build/) or cuda (build-cuda/): which LibTorch (install-deps.sh).
#   AMPP_BUILD_DIR, AMPP_JOBS, AMPP_BUILD_TYPE: build folder, parallelism, build type.
#   AMPP_TARGETS: what to build (default: everything), e.g. "ampp_cli" for the CLI and its library.
#   CXX: the compiler of a new build folder; clang++ by default, which compiles LibTorch's headers about
#   2.5x faster than gcc 12 here (docs/build.md); CXX=g++ is supported as well.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
torch=${AMPP_TORCH:-wheel}
source "$root/scripts/build-dir.sh"
build=$(ampp_build_dir "$root")
jobs=${AMPP_JOBS:-$(nproc)}
# The tests' Python oracle is the torch of the same version: the wheel's venv.
python=${AMPP_VENV:-$root/.venv}/bin/python
[ "$torch" = cuda ] && python=${AMPP_CUDA_VENV:-$root/.venv-cuda}/bin/python
if [ -z "${CXX:-}" ] && command -v clang++ >/dev/null; then export CXX=clang++; fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${AMPP_BUILD_TYPE:-RelWithDebInfo} \
  -DAMPP_TORCH="$torch" -DAMPP_PYTHON="$python" "$@" >/dev/null
targets=()
for t in ${AMPP_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$jobs" "${targets[@]}"
