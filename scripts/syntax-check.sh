#!/usr/bin/env bash
# Compiles one or more C++ files with -fsyntax-only using the flags CMake gave a sibling file in
# build/compile_commands.json (same folder when the file is new, or its folder's unity batch). Touches nothing in build/, so it is
# safe to run while a build is going on.   Usage: scripts/syntax-check.sh FILE...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
db=${AMPP_COMPILE_DB:-$root/build/compile_commands.json}
status=0
for f in "$@"; do
  abs=$(realpath "$f")
  cmd=$(python3 - "$db" "$abs" "$root" <<'PY'
import json, os, shlex, sys
db, f, root = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
exact = [e for e in db if e["file"] == f]
near = [e for e in db if os.path.dirname(e["file"]) == os.path.dirname(f)]
# A unity build lists its batches (BUILD/<the source's folder>/.../Unity/unity_N_cxx.cxx), not the files.
folder = "/" + os.path.relpath(os.path.dirname(f), root) + "/"
unity = [e for e in db if "/Unity/" in e["file"] and folder in e["file"]]
e = (exact or near or unity or [x for x in db if "/src/ampp/" in x["file"]])[0]
args = shlex.split(e["command"])
out, skip = [], False
for a in args:
    if skip: skip = False; continue
    if a in ("-o", "-c"): skip = True; continue
    if a == e["file"]: continue
    out.append(a)
# The cmake_pch.hxx include is fine without its .gch (GCC then reads the header itself).
print(shlex.join(out + ["-fsyntax-only", f]) + "\n" + e["directory"])
PY
)
  dir=$(echo "$cmd" | tail -1)
  if ! (cd "$dir" && eval "$(echo "$cmd" | head -1)"); then status=1; echo "FAILED: $f" >&2; fi
done
exit $status
