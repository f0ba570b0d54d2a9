#!/usr/bin/env bash
# examples/dcgan.cpp (two models under one ampp::initialize, both in DDP over 2 ranks) stopped after its
# first epoch and resumed from its checkpoint must end with the uninterrupted run's weights, bit for bit.
#   dcgan_resume.sh DCGAN PORT [dcgan flags...]
set -euo pipefail
dcgan=$1 port=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--steps 4 "$@")
whole=$("$dcgan" "${common[@]}" --epochs 2 --dist-url "tcp://127.0.0.1:$port" --checkpoint "$dir/whole.pt" | tee /dev/stderr |
  grep "weights checksum")
"$dcgan" "${common[@]}" --epochs 1 --dist-url "tcp://127.0.0.1:$((port + 10))" --checkpoint "$dir/resumed.pt" \
  >/dev/null
resumed=$("$dcgan" "${common[@]}" --epochs 2 --resume --dist-url "tcp://127.0.0.1:$((port + 20))" --checkpoint "$dir/resumed.pt" |
  tee /dev/stderr | grep "weights checksum")
[ "$whole" = "$resumed" ] || { echo "resumed: $resumed, uninterrupted: $whole"; exit 1; }
echo "dcgan $*: the resumed run ends as the uninterrupted one ($whole)"
