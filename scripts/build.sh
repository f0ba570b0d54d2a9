#!/usr/bin/env bash
# Configures and builds ampp. Extra arguments go to cmake configure.
#   AMPP_TORCH=wheel (default: build/), cuda (build-cuda/) or debian (build-debian/): which LibTorch
#   (install-deps.sh).
#   AMPP_BUILD_DIR, AMPP_JOBS, AMPP_BUILD_TYPE: build folder, parallelism, build type.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
torch=${AMPP_TORCH:-wheel}
source "$root/scripts/build-dir.sh"
build=$(ampp_build_dir "$root")
jobs=${AMPP_JOBS:-$(nproc)}
# The tests' Python oracle is the torch of the same version: the wheel's venv, or Debian's python3-torch.
python=${AMPP_VENV:-$root/.venv}/bin/python
[ "$torch" = cuda ] && python=${AMPP_CUDA_VENV:-$root/.venv-cuda}/bin/python
[ "$torch" = debian ] && python=/usr/bin/python3
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${AMPP_BUILD_TYPE:-RelWithDebInfo} \
  -DAMPP_TORCH="$torch" -DAMPP_PYTHON="$python" "$@" >/dev/null
cmake --build "$build" -j "$jobs"
