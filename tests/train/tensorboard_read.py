"""Reads a TensorBoard log folder with TensorBoard's own reader (EventAccumulator) and writes what it
found as JSON: {"scalars": {tag: [[step, value], ...]}, "histograms": {tag: [[step, num, min, max,
bucket_count], ...]}, "files": N}. Used by tests/train/tensorboard_cli_test.cpp to compare an
`ampp train --tensorboard` run with its metrics.jsonl.

    python tensorboard_read.py LOG_DIR OUT_JSON     (exit 3: the tensorboard package is not installed)
"""
import json
import os
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except Exception as e:  # no tensorboard in this Python: the C++ test skips
    print(f"import tensorboard failed: {e!r}", file=sys.stderr)
    sys.exit(3)


def main(log_dir, out):
    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0, "histograms": 0})  # 0: keep every event
    acc.Reload()
    tags = acc.Tags()
    scalars = {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]}
    histograms = {t: [[e.step, e.histogram_value.num, e.histogram_value.min, e.histogram_value.max,
                       len(e.histogram_value.bucket)] for e in acc.Histograms(t)] for t in tags["histograms"]}
    files = [f for f in os.listdir(log_dir) if "tfevents" in f]
    json.dump({"scalars": scalars, "histograms": histograms, "files": len(files)}, open(out, "w"))


main(sys.argv[1], sys.argv[2])
