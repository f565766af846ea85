#!/usr/bin/env python3
"""Every relative link in the markdown files points at a file that exists.

Checks README.md, ARCHITECTURE.md and docs/**/*.md: the target of each
[text](target) that is not a URL or a bare #anchor, resolved from the file's
own directory; anchors are not checked. Exits 1 listing the broken ones.
"""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
files = [root / "README.md", root / "ARCHITECTURE.md", *sorted((root / "docs").rglob("*.md"))]
link = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
fence = re.compile(r"^\s*```")
broken = []
for f in files:
    if not f.exists():
        continue
    in_code = False
    for n, line in enumerate(f.read_text().splitlines(), 1):
        if fence.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        for target in link.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if not (f.parent / path).exists():
                broken.append(f"{f.relative_to(root)}:{n}: {target}")
if broken:
    print("broken links:", *broken, sep="\n  ")
    sys.exit(1)
print(f"doc links: {len(files)} files, every relative link resolves")
