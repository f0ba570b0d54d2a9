#!/usr/bin/env bash
# examples/handoff_cnn.cpp with its Python half (examples/python/train_cnn.py): Python takes 5 steps,
# C++ continues from Python's file to step 16 (across an epoch), Python continues from the C++ file to
# step 20. Python alone, from its own step-5 file to step 16, must equal the C++ result bit for bit.
#   handoff_round_trip.sh PYTHON HANDOFF_CNN TRAIN_CNN_PY     (exit 3: no usable Python torch: skipped)
set -euo pipefail
python=$1 handoff=$2 script=$3
if ! "$python" -c 'import torch; torch.amp.GradScaler' 2>/dev/null; then
  echo "skipped: $python has no torch with torch.amp.GradScaler (PyTorch 2.3+)"; exit 3
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--data synthetic:384 --batch-size 32)
"$python" "$script" "${common[@]}" --steps 5 --save "$dir/py5.pt"
"$handoff" "${common[@]}" --resume-from "$dir/py5.pt" --steps 16 --save "$dir/cpp16.pt"
"$python" "$script" "${common[@]}" --resume-from "$dir/cpp16.pt" --steps 20 --save "$dir/py20.pt"
"$python" "$script" "${common[@]}" --resume-from "$dir/py5.pt" --steps 16 --save "$dir/py16.pt"
"$python" - "$dir/cpp16.pt" "$dir/py16.pt" <<'PY'
import sys
import torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert [a[k] for k in ("epoch", "batch", "step")] == [b[k] for k in ("epoch", "batch", "step")], "positions differ"
for name, t in a["model"].items():
    assert torch.equal(t, b["model"][name]), f"{name} differs"
for i, s in a["optimizer"]["state"].items():
    assert torch.equal(s["momentum_buffer"], b["optimizer"]["state"][i]["momentum_buffer"]), f"momentum {i} differs"
assert a["scaler"]["scale"] == b["scaler"]["scale"], "loss scales differ"
print(f"C++ and Python agree bit for bit after {a['step']} steps ({len(a['model'])} tensors)")
PY
