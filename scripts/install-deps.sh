#!/usr/bin/env bash
# Installs what ampp needs. Idempotent; apt needs root or sudo.
#   AMPP_TORCH=wheel  (default) LibTorch 2.13 from the torch==2.13.0 wheel, in a venv at .venv/
#                     (or $AMPP_VENV); it also serves as the Python oracle of the tests.
#   AMPP_TORCH=cuda   LibTorch 2.14.1 with CUDA 13 from the torch==2.14.1 wheel (5.4 GB), in a venv at
#                     .venv-cuda/ (or $AMPP_CUDA_VENV), also the oracle; plus the default venv for the
#                     formatter and TensorBoard's reader. Builds without a GPU; CUDA's toolkit (nvcc)
#                     must be on the PATH.
# Either way apt provides the rest (Gloo headers, GoogleTest, Benchmark, CLI11, fmt, json, ...).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
torch=${AMPP_TORCH:-wheel}
venv=${AMPP_VENV:-$root/.venv}
torch_version=2.13.0

packages=(
  build-essential cmake ninja-build ccache git pkg-config binutils
  libgloo-dev libsleef-dev libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libfmt-dev nlohmann-json3-dev zlib1g-dev
  libprotobuf-dev protobuf-compiler libboost-dev  # TensorBoard event files: protobuf, CRC-32C (boost/crc.hpp)
  dataset-fashion-mnist fortunes gnuplot-nox iproute2 procps  # fortunes: the GPTs' default text
  clang libclang-rt-dev  # the fuzzers (libFuzzer + sanitizers): scripts/fuzz.sh
)
case "$torch" in
  wheel | cuda) ;;
  debian)
    echo "install-deps: AMPP_TORCH=debian is no longer offered: Debian's libtorch-dev (1.13 on Debian 12, 2.6 on" \
         "Debian 13) is older than the LibTorch 2.13 and 2.14 that ampp is built and tested against (fp8 needs" \
         "2.1+, the fused optimizers 2.4+). Use the default wheel (no AMPP_TORCH), or a LibTorch archive of" \
         "2.13+ with -DTorch_DIR=... (docs/build.md)." >&2
    exit 2 ;;
  *) echo "install-deps: AMPP_TORCH='$torch' is not known: use wheel (the default) or cuda" >&2; exit 2 ;;
esac

install_apt() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#packages[@]} apt packages already installed (Debian $(cat /etc/debian_version))"
    return
  fi
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The CPU wheel of torch 2.13.0 is built for CPython 3.11 (pinned: any other version is a
# multi-GB CUDA download).
clang_format_version=19.1.7

install_wheel() {  # $1: venv, $2: torch version
  local venv=$1 torch_version=$2
  if [ -x "$venv/bin/python" ] &&
     "$venv/bin/python" -c "import torch, numpy, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
    echo "install-deps: $venv has torch $torch_version"
    return
  fi
  local python=${AMPP_PYTHON311:-$(command -v python3.11 || true)}
  if [ -z "$python" ]; then
    echo "install-deps: the torch==$torch_version wheel needs Python 3.11 (python3.11 not found)." \
         "Install it, or point AMPP_PYTHON311 at it." >&2
    exit 1
  fi
  echo "install-deps: creating $venv with torch==$torch_version ($python)"
  "$python" -m venv "$venv"
  # No pip cache: the CUDA wheels are 5.4 GB, and a cached copy of them would double the disk they take.
  "$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir "torch==$torch_version" numpy
}

# The formatter CI checks with (scripts/check-format.sh), pinned so that every machine agrees.
install_clang_format() {
  if "$venv/bin/clang-format" --version 2>/dev/null | grep -q "version $clang_format_version"; then return; fi
  echo "install-deps: clang-format $clang_format_version into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "clang-format==$clang_format_version"
}

# TensorBoard's own reader, which the tests compare `ampp train --tensorboard`'s files with.
tensorboard_version=2.21.0
install_tensorboard() {
  if "$venv/bin/python" -c "import tensorboard, sys; sys.exit(tensorboard.__version__ != '$tensorboard_version')" 2>/dev/null; then return; fi
  echo "install-deps: tensorboard $tensorboard_version into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "tensorboard==$tensorboard_version"
}

# torchao's float8 training (Float8Linear), the fp8 oracle. --no-deps: its one dependency is torch, which the
# venv pins; its CUDA extensions fail to load on a CPU machine, with a warning, and float8 training does not
# need them.
torchao_version=0.18.0
install_torchao() {
  if "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('torchao') != '$torchao_version')" 2>/dev/null; then return; fi
  echo "install-deps: torchao $torchao_version into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "torchao==$torchao_version"
}

install_apt
# The CUDA wheel: LibTorch 2.14.1+cu130 (cuDNN, NCCL from the nvidia-* wheels), installed from this
# machine's disk in about 3.5 minutes. nvcc is CMake's way to the toolkit (cmake/AmppTorch.cmake).
cuda_torch_version=2.14.1
if [ "$torch" = cuda ]; then
  command -v nvcc >/dev/null || { echo "install-deps: AMPP_TORCH=cuda needs CUDA's nvcc on the PATH" >&2; exit 1; }
  install_wheel "${AMPP_CUDA_VENV:-$root/.venv-cuda}" "$cuda_torch_version"
fi
if [ "$torch" = wheel ] || [ "$torch" = cuda ]; then
  install_wheel "$venv" "$torch_version"
  install_clang_format
  install_tensorboard
  install_torchao
fi
