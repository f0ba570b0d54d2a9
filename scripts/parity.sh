#!/usr/bin/env bash
# Accuracy parity report: the CNN for 3 epochs on Fashion-MNIST at O0, O1 and O2 (bf16 and fp16),
# same seed, 2 workers; prints the test accuracies side by side with the difference to O0.
#
# Usage: scripts/parity.sh [extra ampp train flags]
#   AMPP_BUILD_DIR   the build to use (default build/)
#   PARITY_SEEDS     seeds to train each configuration with (default "0"); with several, the table
#                    shows the mean, the paired difference to O0 (same seed) and its spread, which is
#                    what separates a real gap from seed-to-seed noise
#   PARITY_CONFIGS   "level dtype" pairs, comma separated (default: O0, O1 and O2 in bf16 and fp16)
#   PARITY_OUT       output folder (default parity-out/); finished runs are reused, so an
#                    interrupted report continues where it stopped
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ampp=${AMPP_BUILD_DIR:-$root/build}/bin/ampp
out=${PARITY_OUT:-$root/parity-out}
seeds=${PARITY_SEEDS:-0}
[ -x "$ampp" ] || { echo "parity: $ampp not found; build first (scripts/build.sh)" >&2; exit 1; }
IFS=, read -r -a configs <<<"${PARITY_CONFIGS:-O0 bf16,O1 bf16,O2 bf16,O1 fp16,O2 fp16}"
[[ "${configs[0]}" == O0* ]] || { echo "parity: the first configuration must be O0 (the baseline)" >&2; exit 1; }
for seed in $seeds; do
  for config in "${configs[@]}"; do
    read -r level dtype <<<"$config"
    dir="$out/seed$seed/$level-$dtype"
    if [ -f "$dir/summary.json" ]; then continue; fi
    echo "parity: training $level $dtype, seed $seed -> $dir" >&2
    "$ampp" train --model cnn --epochs 3 --seed "$seed" --opt-level "$level" --dtype "$dtype" \
      --out "$dir" --no-plots --quiet "$@" >/dev/null
  done
done
python3 - "$out" "$seeds" "${configs[@]}" <<'PY'
import json, statistics, sys
out, seeds, configs = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
acc = {(c, s): json.load(open(f"{out}/seed{s}/{c.replace(' ', '-')}/summary.json"))["test_accuracy"]
       for c in configs for s in seeds}
base = configs[0]
several = len(seeds) > 1
head = f"{'opt level':<10}{'dtype':<7}" + "".join(f"{'seed ' + s:>10}" for s in seeds)
head += f"{'mean':>9}{'vs O0':>9}" + (f"{'spread':>9}" if several else "")
print(head)
worst = 0.0
for c in configs:
    level, dtype = c.split()
    diffs = [acc[(c, s)] - acc[(base, s)] for s in seeds]  # paired: same seed, same data order
    mean_acc = statistics.mean(acc[(c, s)] for s in seeds)
    mean_diff = statistics.mean(diffs)
    worst = max(worst, abs(mean_diff))
    row = f"{level:<10}{'fp32' if level == 'O0' else dtype:<7}" + "".join(f"{acc[(c, s)]:>9.2f}%" for s in seeds)
    row += f"{mean_acc:>8.2f}%"
    row += f"{'':>9}" if c == base else f"{mean_diff:>+9.2f}"
    if several:
        row += f"{'':>9}" if c == base else f"{statistics.stdev(diffs):>9.2f}"
    print(row)
if several:
    print(f"spread: standard deviation of the per-seed difference to O0; O0's own seed-to-seed "
          f"standard deviation is {statistics.stdev(acc[(base, s)] for s in seeds):.2f} points")
print(f"largest mean difference to O0: {worst:.2f} points (target: within 0.5)")
PY
