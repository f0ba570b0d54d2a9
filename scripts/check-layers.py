#!/usr/bin/env python3
"""Checks that the code respects the layers, and that the build and the docs say what the code does.

The layer order is the `foreach(layer ...)` list in the top CMakeLists.txt. For every file:
  - a library file (src/ampp/<L>/, include/ampp/<L>/) includes public headers of its own or lower
    layers only, and private headers only from beside itself;
  - a test or benchmark of layer L may include private headers of L and of layers below L (tests are
    white-box; the version shims in torch_compat.h are needed by tests above their layer); the CLI,
    examples and cross-layer suites include public headers only;
  - quoted includes ("x.h") are for private headers; public ones are written <ampp/...>.
For every layer, the ampp layers its CMakeLists.txt links are exactly the layers its files include.
The public API is what include/ampp/ampp.h reaches: those headers include no fmt, nlohmann-json or
protobuf header, every other header under include/ampp carries INTERNAL_MARKER (and is not installed:
cmake/AmppInstall.cmake), and examples/ and .ci/consumer/ include only the public API.
docs/architecture.md carries the generated layer graph between the layer-graph markers.

Usage: check-layers.py            check (exit 1 with one line per problem)
       check-layers.py --write    also rewrite the graph in docs/architecture.md
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
BEGIN, END = "<!-- layer-graph:begin -->", "<!-- layer-graph:end -->"
# Folders outside src/ and include/ that belong to a layer (their private headers are allowed).
SUITE_LAYER = {"launcher": "dist", "gpu": "train", "oracle": None, "examples": None, "tools": None, "fuzz": None}
INTERNAL_MARKER = "// Internal to ampp"
THIRD_PARTY_IN_API = re.compile(r"^(fmt|nlohmann|google/protobuf)/")


def check_public_api(problems):
    """ampp.h's reach: no third-party headers but LibTorch's; the headers outside it say they are internal.
    Returns the headers it reaches (what `cmake --install` installs)."""
    reached, todo = set(), ["ampp/ampp.h"]
    while todo:
        header = todo.pop()
        if header in reached:
            continue
        reached.add(header)
        for kind, name in INCLUDE.findall((ROOT / "include" / header).read_text()):
            if THIRD_PARTY_IN_API.match(name):
                problems.append(f"include/{header}: <{name}> in the public API (move it to a .cpp or src/)")
            elif name.startswith("ampp/") and (ROOT / "include" / name).exists():
                todo.append(name)
    for file in sorted((ROOT / "include" / "ampp").rglob("*.h")):
        header = str(file.relative_to(ROOT / "include"))
        if header not in reached and INTERNAL_MARKER not in file.read_text():
            problems.append(f"include/{header}: not reached from ampp.h and not marked \"{INTERNAL_MARKER}\"")
        elif header in reached and INTERNAL_MARKER in file.read_text():
            problems.append(f"include/{header}: marked internal (not installed) but reached from ampp.h")
    return reached


def check_examples_use_the_api(reached, problems):
    """Examples and the CI consumer are users' code: they include only what an install has."""
    for top in ("examples", ".ci/consumer"):
        for file in sorted((ROOT / top).rglob("*")):
            if file.suffix not in (".h", ".cpp"):
                continue
            for kind, name in INCLUDE.findall(file.read_text()):
                if name.startswith("ampp/") and name not in reached:
                    problems.append(f"{file.relative_to(ROOT)}: #include <{name}> is internal to ampp "
                                    "(not installed); use the API of <ampp/ampp.h>")


def layer_order():
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"foreach\(layer ([a-z_ ]+)\)", text)
    return match.group(1).split()


def forwarder_target(header):
    """include/ampp/x.h that forwards to one layer header -> that header's layer, else None."""
    layers = {m.group(2).split("/")[1] for m in INCLUDE.finditer(header.read_text())
              if m.group(2).startswith("ampp/") and m.group(2).count("/") >= 2}
    return layers.pop() if len(layers) == 1 else None


def public_layer(path):
    """Layer of a public header path 'ampp/...'; 'all' for ampp.h; None when it does not exist."""
    parts = path.split("/")
    if not (ROOT / "include" / path).exists():
        return None
    if len(parts) >= 3:
        return parts[1]
    return "all" if path == "ampp/ampp.h" else forwarder_target(ROOT / "include" / path) or "top-level"


def owner(file):
    """(kind, layer) of a file: kind 'lib' for src/ampp/<L> and include/ampp/<L>, else 'user'."""
    rel = file.relative_to(ROOT).parts
    if rel[0] in ("src", "include") and len(rel) >= 4 and rel[1] == "ampp":
        return "lib", rel[2]
    if rel[0] == "include":  # a top-level forwarder, or ampp.h (the whole API: no layer)
        target = None if file.name == "ampp.h" else forwarder_target(file)
        return ("lib", target) if target else ("user", None)
    if rel[0] in ("tests", "bench") and len(rel) >= 3:
        return "user", SUITE_LAYER.get(rel[1], rel[1])
    return "user", None


def check_private(where, target, kind, layer, rank, problems):
    """A private header (src/ampp/<target>/...) included by path, not from beside itself."""
    if kind == "user" and layer in rank and rank[target] <= rank[layer]:
        return
    problems.append(f"{where}: private header of layer '{target}'; include it beside its own files "
                    "only (\"x.h\"), or make it public")


def check_file(file, order, problems, uses):
    kind, layer = owner(file)
    rank = {name: i for i, name in enumerate(order)}
    for match in INCLUDE.finditer(file.read_text(errors="replace")):
        quote, path = match.groups()
        where = f"{file.relative_to(ROOT)}: #include {quote}{path}"
        if quote == '"':
            beside = (file.parent / path).exists()
            private = re.match(r"ampp/([a-z_]+)/", path)
            if private and (ROOT / "src" / path).exists():
                check_private(where, private.group(1), kind, layer, rank, problems)
            elif path.startswith("ampp/") and (ROOT / "include" / path).exists():
                problems.append(f"{where}: public header in quotes; write #include <{path}>")
            elif not beside and not (kind == "user" and file.parts[len(ROOT.parts)] in ("tests", "bench")):
                problems.append(f"{where}: quoted include not found beside the file")
            continue
        if not path.startswith("ampp/"):
            continue
        target = public_layer(path)
        if target == "top-level":
            problems.append(f"{where}: top-level headers are one-line forwarders to include/ampp/<layer>/")
        elif target is None and (ROOT / "src" / path).exists():
            check_private(where, path.split("/")[1], kind, layer, rank, problems)
        elif target is None:
            problems.append(f"{where}: no such public header (include/{path})")
        elif kind == "lib" and layer in rank:
            if target == "all" or rank.get(target, -1) > rank[layer]:
                problems.append(f"{where}: layer '{layer}' must not include layer '{target}' (higher)")
            elif target != layer:
                uses.setdefault(layer, set()).add(target)


def check_links(order, uses, problems):
    for layer in order:
        cmake = ROOT / "src" / "ampp" / layer / "CMakeLists.txt"
        linked = set(re.findall(r"ampp::([a-z_]+)", re.sub(r"#.*", "", cmake.read_text())))
        included = uses.get(layer, set())
        for extra in sorted(linked - included):
            problems.append(f"{cmake.relative_to(ROOT)}: links ampp::{extra} but includes nothing of it")
        for missing in sorted(included - linked):
            problems.append(f"{cmake.relative_to(ROOT)}: includes layer '{missing}' but does not link ampp::{missing}")


def graph(order, uses):
    lines = [BEGIN, "", "| layer | links (exactly the layers it includes) |", "|---|---|"]
    for layer in order:
        deps = ", ".join(f"`ampp::{d}`" for d in sorted(uses.get(layer, set()), key=order.index)) or "LibTorch only"
        lines.append(f"| `ampp::{layer}` | {deps} |")
    lines.append("| `ampp` (CLI, `tools/ampp/`) | `ampp::ampp` (all layers) |")
    return "\n".join(lines + ["", "Generated by `scripts/check-layers.py --write`; CI fails when it is stale.", END])


def main():
    order, problems, uses = layer_order(), [], {}
    for top in ("src", "include", "tools", "tests", "bench", "examples"):
        for file in sorted((ROOT / top).rglob("*")):
            if file.suffix in (".h", ".hpp", ".cpp", ".cc"):
                check_file(file, order, problems, uses)
    check_links(order, uses, problems)
    check_examples_use_the_api(check_public_api(problems), problems)
    doc = ROOT / "docs" / "architecture.md"
    text = doc.read_text()
    block = re.search(re.escape(BEGIN) + ".*?" + re.escape(END), text, re.S)
    wanted = graph(order, uses)
    if "--write" in sys.argv:
        text = text.replace(block.group(0), wanted) if block else text + "\n" + wanted + "\n"
        doc.write_text(text)
    elif not block or block.group(0) != wanted:
        problems.append("docs/architecture.md: the layer graph is stale; run scripts/check-layers.py --write")
    for problem in problems:
        print(problem)
    print(f"check-layers: {len(problems)} problem(s) in the layers {' < '.join(order)}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
