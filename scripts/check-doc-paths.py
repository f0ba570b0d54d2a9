#!/usr/bin/env python3
"""Lists the repository paths that README.md and docs/*.md cite but that do not exist; exit 1 if any.

What counts as a cited path (outside fenced code blocks, and inside ```sh / ```bash / ```cmake blocks,
which hold commands; other fenced blocks are code or a command's output and are not read):
- the target of a markdown link or image that is not a URL: resolved from the page's folder; a
  `#anchor` on a .md target (or a link to `#anchor` in the same page) must name one of its headings;
- a word, in a code span or in the text, that starts with one of the repository's folders
  (src/ include/ tests/ tools/ bench/ scripts/ docs/ examples/ cmake/ .ci/): resolved from the
  repository root;
- a short form: a word with a slash whose first folder is one of ampp's own (a layer under src/ampp/
  or include/ampp/, a folder of tests/, bench/ or examples/, or `ampp`) and whose name ends in a source
  or script extension, e.g. `amp/torch_compat.h` or `ampp/util/remove_tree.h`: it must exist under
  src/ampp/, include/ampp/, src/, include/, tests/, bench/, examples/ or the root;
- `../shared/...`: checked against the folder beside the checkout, when that folder exists.
`{a,b}` expands to both, `<name>` and `*` match any name (at least one file must match), a `:123` line
suffix and a `FLAG=` prefix are dropped. Not read: URLs, absolute paths, `$VARIABLE/...`, and build
outputs and scratch folders (build/, build-*/, .venv*/, gpu-kit/, OUT/, ampp-train-out/, ...).

Usage: check-doc-paths.py [-v] [files...]   (default: README.md and docs/*.md; -v lists every path read)
"""
import argparse
import glob
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PREFIXES = {"src", "include", "tests", "tools", "bench", "scripts", "docs", "examples", "cmake", ".ci"}
EXTENSIONS = {".h", ".hpp", ".cpp", ".cc", ".c", ".py", ".sh", ".cmake", ".in", ".txt", ".md", ".json",
              ".supp", ".proto", ".yml", ".yaml", ".png", ".svg"}
COMMAND_BLOCKS = {"sh", "bash", "shell", "cmake"}
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
URL = re.compile(r"\b[a-zA-Z][\w+.-]*://\S*")
LEAD_CHARS = "([\"'`*_"
TRAIL_CHARS = ")]\"'`,.:;!?*_"


def strip(word):
    return word.lstrip(LEAD_CHARS).rstrip(TRAIL_CHARS)


def own_folders():
    """First folders a short form may start with: ampp's layers and the folders of tests/, bench/, examples/."""
    names = {"ampp"}
    for base in ("src/ampp", "include/ampp", "tests", "bench", "examples"):
        folder = ROOT / base
        if folder.is_dir():
            names.update(p.name for p in folder.iterdir() if p.is_dir())
    return names


SHORT_FORM_FOLDERS = own_folders()


def slug(heading):
    """GitHub's anchor for a heading: rendered text, lower case, punctuation dropped, spaces as hyphens."""
    text = LINK.sub(lambda m: m.group(1), heading)
    text = re.sub(r"[`*]", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, seen, fenced = set(), {}, False
        for line in path.read_text(errors="replace").split("\n"):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                continue
            found.update(HTML_ANCHOR.findall(line))
            heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if heading:
                base = slug(heading.group(1))
                count = seen.get(base, 0)
                seen[base] = count + 1
                found.add(base if count == 0 else f"{base}-{count}")
        cache[path] = found
    return cache[path]


def expand_braces(word):
    match = re.search(r"\{([^{}]*)\}", word)
    if not match:
        return [word]
    return [w for part in match.group(1).split(",")
            for w in expand_braces(word[:match.start()] + part + word[match.end():])]


def exists(candidate):
    pattern = re.sub(r"<[^<>/]*>", "*", candidate)
    if any(ch in pattern for ch in "*?["):
        return bool(glob.glob(str(ROOT / pattern)))
    return (ROOT / pattern).exists()


def word_candidates(word):
    """The places a cited word may refer to (any one existing is enough), or None if it is no repo path."""
    word = strip(strip(word).rsplit("=", 1)[-1])
    word = re.sub(r":\d+(-\d+)?$", "", word)
    if "/" not in word or not word or URL.search(word) or word[0] in "/~$-<@":
        return None
    if word.startswith("../shared/"):
        shared = ROOT.parent / "shared"
        return [str(pathlib.Path("..") / word[3:])] if shared.is_dir() else None
    if word.startswith("./"):
        word = word[2:]
    first = word.split("/", 1)[0]
    if first in PREFIXES:
        return [word]
    if first in SHORT_FORM_FOLDERS and pathlib.PurePath(word.rstrip("/")).suffix in EXTENSIONS:
        bases = ("src/ampp/", "include/ampp/", "src/", "include/", "tests/", "bench/", "examples/", "")
        return [base + word for base in bases]
    return None


def check_word(word, report):
    candidates = word_candidates(word)
    if candidates is None:
        return
    for variant in zip(*(expand_braces(c) for c in candidates)):
        report(strip(word), any(exists(c) for c in variant))


def check_link(target, page, report):
    if URL.match(target) or target.startswith("mailto:"):
        return
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    if not file.exists():
        report(target, False)
        return
    if anchor and file.suffix == ".md":
        report(target, anchor in anchors(file))
    else:
        report(target, True)


def check_text(text, page, report):
    """A line outside code blocks: its links, then the words of its code spans and of its prose."""
    for ref in REF_LINK.findall(text):
        check_link(ref, page, report)
        text = ""
    spans = []
    text = CODE_SPAN.sub(lambda m: spans.append(m.group(2)) or " ", text)
    for match in LINK.finditer(text):
        check_link(match.group(2), page, report)
    text = LINK.sub(lambda m: " " + m.group(1) + " ", URL.sub(" ", text))
    for part in spans + [text]:
        for word in URL.sub(" ", part).split():
            check_word(word, report)


def check_page(page, verbose):
    missing = []
    fence, language = None, ""
    for number, line in enumerate(page.read_text(errors="replace").split("\n"), start=1):
        opener = re.match(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)", line)
        if opener and (fence is None or opener.group(1).startswith(fence)):
            if fence is None:
                fence, language = opener.group(1), opener.group(2).lower()
            else:
                fence = None
            continue

        def report(path, ok):
            if verbose:
                print(f"{page.relative_to(ROOT)}:{number}: {'ok     ' if ok else 'MISSING'} {path}")
            if not ok:
                missing.append(f"{page.relative_to(ROOT)}:{number}: {path}")

        if fence is None:
            check_text(line, page, report)
        elif language in COMMAND_BLOCKS:
            for word in line.split():
                check_word(word, report)
    return missing


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="list every path read, found or not")
    parser.add_argument("files", nargs="*", type=pathlib.Path)
    args = parser.parse_args()
    pages = [p.resolve() for p in args.files] or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = [m for page in pages for m in check_page(page, args.verbose)]
    for line in missing:
        print(line)
    if missing:
        print(f"check-doc-paths: {len(missing)} cited path(s) do not exist", file=sys.stderr)
        return 1
    print(f"check-doc-paths: every path cited in {len(pages)} page(s) exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
