#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""check_docs.py - every pointer into the docs leads somewhere.

Run by CTest (label unit) with the source tree as its argument. Fails,
naming the file and line, when
  - a Markdown link of a .md file names a file that does not exist, or a
    heading that file does not have (http(s) and mailto links are not
    followed);
  - any file of the tree mentions a doc by path from the top of the tree
    (docs/ followed by a path ending in .md, or README.md), with or
    without a #fragment, and the file or the heading is missing;
  - a comment names a doc and one of its headings in quotes, README or a
    doc path followed by the heading in double quotes, and the doc has no
    such heading.
Anchors follow GitHub's rules: the heading's text lower-cased, what is
neither a letter, a digit, '_', '-' nor a space dropped, spaces turned
into '-', and a repeated heading numbered -1, -2, ...
"""

import os
import re
import sys

SKIP_DIRS = {".git", ".cache", ".run", "out", "node_modules", "__pycache__"}
# An applied migration is checksummed by `coderq migrate` and cannot be
# reworded, so its comments keep the pointers they were applied with.
SKIP_QUOTED = ("migrations/",)
SELF = "tests/check_docs.py"

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)\)")
MENTION = re.compile(
    r"(?<![\w./-])((?:docs/[\w./-]*?\.md)|README\.md)(?:#([\w-]+))?")
QUOTED = re.compile(
    r"(?<![\w./-])(README(?:\.md)?|docs/[\w./-]+?\.md),?"
    r"(?:\s|\*(?!/)|#|--)+\\?\"([A-Za-z][^\"\\\n]*)\\?\"")


def tree_files(root):
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs
            if d not in SKIP_DIRS and not d.startswith("build")
            and not os.path.exists(os.path.join(top, d, "CMakeCache.txt")))
        for name in sorted(files):
            path = os.path.join(top, name)
            yield os.path.relpath(path, root)


def read_text(root, rel):
    path = os.path.join(root, rel)
    try:
        if os.path.getsize(path) > 4 << 20:
            return None
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data:
        return None
    return data.decode("utf-8", errors="replace")


def strip_fences(text):
    """The text with fenced code blocks blanked, lines kept."""
    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return "\n".join(out)


def slug(heading):
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text):
    seen, out = {}, set()
    for line in strip_fences(text).split("\n"):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else "%s-%d" % (base, n))
    return out


class Docs:
    def __init__(self, root):
        self.root = root
        self.cache = {}

    def anchors_of(self, rel):
        if rel not in self.cache:
            text = read_text(self.root, rel)
            self.cache[rel] = anchors(text) if text is not None else None
        return self.cache[rel]

    def check(self, rel, fragment, heading=None):
        """None when rel (and its fragment or heading) exist, else why."""
        path = os.path.normpath(os.path.join(self.root, rel))
        if not path.startswith(os.path.normpath(self.root)):
            return "%s is outside the tree" % rel
        if not os.path.exists(path):
            return "%s does not exist" % rel
        want = fragment if fragment is not None else (
            slug(heading) if heading is not None else None)
        if want is None:
            return None
        if os.path.isdir(path) or not rel.endswith(".md"):
            return "%s is not a Markdown file with headings" % rel
        have = self.anchors_of(os.path.relpath(path, self.root))
        if have is None or want not in have:
            shown = fragment if fragment is not None else '"%s"' % heading
            return "%s has no heading %s" % (rel, shown)
        return None


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def check_file(docs, rel, text, problems):
    if rel.endswith(".md"):
        body = strip_fences(text)
        body = re.sub(r"`[^`]*`", lambda m: re.sub(r"[^\n]", " ", m.group()),
                      body)
        for m in LINK.finditer(body):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            path, _, fragment = target.partition("#")
            dest = (os.path.join(os.path.dirname(rel), path) if path
                    else rel)
            why = docs.check(dest, fragment or None)
            if why:
                problems.append("%s:%d: link %s: %s" %
                                (rel, line_of(body, m.start()), target, why))
    for m in MENTION.finditer(text):
        why = docs.check(m.group(1), m.group(2))
        if why:
            problems.append("%s:%d: %s: %s" % (rel, line_of(text, m.start()),
                                               m.group(0), why))
    if rel.startswith(SKIP_QUOTED):
        return
    for m in QUOTED.finditer(text):
        doc = m.group(1)
        if doc == "README":
            doc = "README.md"
        why = docs.check(doc, None, m.group(2))
        if why:
            problems.append("%s:%d: %s: %s" % (
                rel, line_of(text, m.start()), " ".join(m.group(0).split()),
                why))


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: check_docs.py SOURCE_DIR\n")
        return 2
    root = os.path.abspath(sys.argv[1])
    docs = Docs(root)
    problems, files = [], 0
    for rel in tree_files(root):
        if rel == SELF:
            continue
        text = read_text(root, rel)
        if text is None:
            continue
        files += 1
        check_file(docs, rel, text, problems)
    for p in problems:
        print(p)
    print("check_docs: %d files, %d broken pointers" % (files, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
