#!/usr/bin/env python3
"""Lists functions (and lambdas) longer than a limit in the library and the CLI; exit 1 if any.

A function is a brace block whose opening line ends in `) {` (after optional const, noexcept,
override, mutable or a trailing return type) and is not an if/for/while/switch/catch. Braces in
strings, characters and comments are ignored. Data tables are not functions, so they never count.

Usage: check-function-length.py [--limit N] [paths...]   (default: 80 lines, src/ and tools/)
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OPENER = re.compile(r"\)\s*(const|noexcept|override|final|mutable|->\s*[\w:<>,\s*&]+|\s)*\{\s*$")
CONTROL = re.compile(r"^\s*(\}\s*)?(if|for|while|switch|catch|else if)\b")
STRIP = re.compile(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'|//.*$')


def code_lines(text):
    """The text's lines with strings, characters and comments blanked."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r'R"\((.*?)\)"', lambda m: '""' + "\n" * m.group(0).count("\n"), text, flags=re.S)
    return [STRIP.sub('""', line) for line in text.split("\n")]


def long_functions(path, limit):
    stack, found = [], []
    for number, line in enumerate(code_lines(path.read_text(errors="replace")), start=1):
        for i, char in enumerate(line):
            if char == "{":
                head = line[: i + 1]
                is_function = bool(OPENER.search(head)) and not CONTROL.search(head)
                stack.append((number, is_function, head.strip()))
            elif char == "}" and stack:
                start, is_function, head = stack.pop()
                length = number - start + 1
                if is_function and length > limit:
                    found.append((length, f"{path.relative_to(ROOT)}:{start}: {length} lines: {head[:70]}"))
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=80)
    parser.add_argument("paths", nargs="*", default=["src", "tools"])
    args = parser.parse_args()
    found = []
    for top in args.paths:
        base = ROOT / top
        files = [base] if base.is_file() else sorted(base.rglob("*"))
        for file in files:
            if file.suffix in (".h", ".cpp"):
                found += long_functions(file, args.limit)
    for _, text in sorted(found, reverse=True):
        print(text)
    print(f"check-function-length: {len(found)} function(s) over {args.limit} lines", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
