#!/usr/bin/env bash
# Accuracy parity report: the CNN for 3 epochs on Fashion-MNIST at O0, O1 and O2 (bf16 and fp16),
# same seed, 2 workers; prints the test accuracies side by side with the difference to O0.
# Usage: scripts/parity.sh [extra ampp train flags]   (AMPP_BUILD_DIR selects the build, default build/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ampp=${AMPP_BUILD_DIR:-$root/build}/bin/ampp
out=${PARITY_OUT:-$root/parity-out}
[ -x "$ampp" ] || { echo "parity: $ampp not found; build first (scripts/build.sh)" >&2; exit 1; }
configs=("O0 bf16" "O1 bf16" "O2 bf16" "O1 fp16" "O2 fp16")
for config in "${configs[@]}"; do
  read -r level dtype <<<"$config"
  dir="$out/$level-$dtype"
  echo "parity: training $level $dtype -> $dir" >&2
  "$ampp" train --model cnn --epochs 3 --seed 0 --opt-level "$level" --dtype "$dtype" \
    --out "$dir" --no-plots --quiet "$@" >/dev/null
done
python3 - "$out" "${configs[@]}" <<'PY'
import json, sys
out, configs = sys.argv[1], sys.argv[2:]
acc = {c: json.load(open(f"{out}/{c.replace(' ', '-')}/summary.json"))["test_accuracy"] for c in configs}
base = acc["O0 bf16"]
print(f"{'opt level':<10}{'dtype':<7}{'test accuracy':>14}{'vs O0':>9}")
for c in configs:
    level, dtype = c.split()
    shown = "fp32" if level == "O0" else dtype
    print(f"{level:<10}{shown:<7}{acc[c]:>13.2f}%{acc[c] - base:>+8.2f}")
worst = max(abs(acc[c] - base) for c in configs)
print(f"largest difference to O0: {worst:.2f} points (target: within 0.5)")
PY
