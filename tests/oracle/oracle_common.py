"""Shared I/O of the oracle scripts: JSON in/out, tensors as exact bit patterns.

Every script is run as `python <script>.py <in.json> <out.json>` by tests/oracle/oracle.cpp.
Exit code 3 means "this Python is no oracle for this build" (no torch, a torch of another version
than the LibTorch ampp was built against, or one without the feature): the C++ test then skips.
"""
import json
import os
import struct
import sys

TORCH_MISSING_EXIT = 3


def import_torch():
    try:
        import torch  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising anything else
        print(f"import torch failed: {e!r}", file=sys.stderr)
        sys.exit(TORCH_MISSING_EXIT)
    import torch
    # An oracle of another version would report its own version's semantics (op lists, kernels).
    built = os.environ.get("AMPP_ORACLE_TORCH", "")
    if built and torch.__version__.split(".")[:2] != built.split(".")[:2]:
        print(f"Python torch {torch.__version__} is not the LibTorch {built} ampp was built against",
              file=sys.stderr)
        sys.exit(TORCH_MISSING_EXIT)
    # One thread: reductions (sum, GEMMs) then follow one fixed order, as on the C++ side.
    torch.set_num_threads(1)
    return torch


torch = import_torch()
import numpy as np  # noqa: E402  (after the torch check: the venv that has torch has numpy)


def unsupported(reason):
    """This torch lacks what the oracle needs (e.g. CPU GradScaler before 2.3): the test skips."""
    print(f"Python torch {torch.__version__}: {reason}", file=sys.stderr)
    sys.exit(TORCH_MISSING_EXIT)


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}
# Integer view with the element size of each dtype: bits are transmitted as unsigned integers.
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MASK = {1: 0xFF, 2: 0xFFFF, 4: 0xFFFFFFFF, 8: 0xFFFFFFFFFFFFFFFF}


def encode(t):
    """{"dtype", "shape", "bits"}: bits are the unsigned integer patterns of the elements (row-major)."""
    t = t.detach().contiguous().cpu()
    size = t.element_size()
    ints = t.view(_INT_VIEW[size]).reshape(-1).tolist()
    return {"dtype": dtype_name(t.dtype), "shape": list(t.shape), "bits": [i & _MASK[size] for i in ints]}


def decode(j):
    dtype = _DTYPES[j["dtype"]]
    size = torch.empty((), dtype=dtype).element_size()
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[size]
    signed = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[size]
    arr = np.array(j["bits"], dtype=np.uint64).astype(unsigned).view(signed)
    return torch.from_numpy(arr.copy()).view(dtype).reshape(j["shape"]).clone()


def double_bits(x):
    return struct.unpack("<Q", struct.pack("<d", float(x)))[0]


def bits_double(b):
    return struct.unpack("<d", struct.pack("<Q", int(b)))[0]


def main(handler):
    """Reads argv[1], calls handler(input) -> output, writes argv[2]."""
    if len(sys.argv) != 3:
        print(f"usage: {sys.argv[0]} <in.json> <out.json>", file=sys.stderr)
        sys.exit(2)
    with open(sys.argv[1]) as f:
        data = json.load(f)
    out = handler(data)
    out["torch_version"] = torch.__version__
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
