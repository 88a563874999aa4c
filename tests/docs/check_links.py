#!/usr/bin/env python3
"""Checks that every relative link in README.md and docs/*.md points to an existing file."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
bad = []
for md in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)  # code blocks
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code
    for target in re.findall(r"\]\(([^)]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # external URLs and in-page anchors
        path = (md.parent / target.split("#")[0]).resolve()
        if not path.exists():
            bad.append(f"{md.relative_to(root)}: broken link ({target})")
print("\n".join(bad) if bad else "all links resolve")
sys.exit(1 if bad else 0)
