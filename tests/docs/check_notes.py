#!/usr/bin/env python3
"""tests/docs/check_notes.py: the named notes and the paths in comments hold together.

Usage: check_notes.py SOURCE_DIR

In the C++ sources (spmd/, tools/, tests/, examples/, bench/):
  - a note is defined by a comment line that is only `// Note [Name]` (the text follows on the
    next lines), exactly once;
  - every `Note [Name]` cited anywhere (sources, CMake, scripts, README.md, docs/) is defined;
  - docs/design.md's table of named notes lists every note with the file that defines it (its
    path under spmd/, or under the repository root for files outside spmd/), and nothing else;
  - every path a comment names (`tensor/dtype.h`, `spmd/world/world.h`, `tests/x/y.cpp`) exists,
    relative to the repository root, to spmd/ or to the commenting file's folder. Generated files
    (spmd/config.h) count as existing.

Every problem is printed as `file:line: ...`; the exit code is 1 when there is any.
"""
import pathlib
import re
import subprocess
import sys

GENERATED = {"spmd/config.h"}
SOURCE = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
DEFINITION = re.compile(r"^\s*(?://|#) Note \[([^\]]+)\]\s*$")
CITATION = re.compile(r"Note \[([^\]]+)\]")
# A path: at least one folder, a file name with a known extension, not part of a longer token.
PATH = re.compile(
    r"(?<![\w./$-])((?:[a-z_0-9]+/)+[A-Za-z_0-9.-]+\.(?:h|hpp|cpp|cu|md|cmake|py|json|txt))\b")


def main():
    root = pathlib.Path(sys.argv[1])
    files = subprocess.check_output(["git", "-C", str(root), "ls-files"], text=True).split()
    sources = [f for f in files if f.endswith(SOURCE)]
    others = [f for f in files
              if f.endswith((".md", ".cmake", ".py")) or f.endswith("CMakeLists.txt")
              or f.startswith("scripts/")]
    problems = []
    defined = {}
    cited = {}
    for f in sources + others:
        path = root / f
        try:
            lines = path.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(lines, 1):
            where = f"{f}:{i}"
            m = DEFINITION.match(line)
            if m and f in sources:
                defined.setdefault(m.group(1), []).append(where)
            for name in CITATION.findall(line):
                if name != "Name" and "{" not in name:  # the docs' example, this script's text
                    cited.setdefault(name, []).append(where)
            if f in sources and "//" in line:
                comment = line[line.index("//"):]
                for named in PATH.findall(comment):
                    if named in GENERATED:
                        continue
                    candidates = [root / named, root / "spmd" / named, path.parent / named]
                    if not any(c.exists() for c in candidates):
                        problems.append(f"{where}: the comment names {named}, which does not exist")
    for name, where in sorted(cited.items()):
        if name not in defined:
            problems.append(f"{where[0]}: cites Note [{name}], which no `// Note [{name}]` line "
                            "defines")
    for name, where in sorted(defined.items()):
        if len(where) > 1:
            problems.append(f"{where[1]}: defines Note [{name}] again (first at {where[0]})")

    # docs/design.md's table: | note | where |, after the "## Named notes" heading.
    design = (root / "docs" / "design.md").read_text()
    section = design.split("## Named notes", 1)
    table = {}
    if len(section) == 2:
        for line in section[1].splitlines():
            m = re.match(r"^\| ([^|]+?) \| ([^|]+?) \|$", line)
            if m and m.group(1) not in ("note", "---"):
                table[m.group(1)] = m.group(2)
    else:
        problems.append("docs/design.md: no '## Named notes' section")
    for name, where in sorted(defined.items()):
        file = where[0].split(":")[0]
        listed = file[len("spmd/"):] if file.startswith("spmd/") else file
        if name not in table:
            problems.append(f"docs/design.md: the table of named notes lacks Note [{name}] "
                            f"({listed})")
        elif table[name] != listed:
            problems.append(f"docs/design.md: Note [{name}] is listed at {table[name]}, but "
                            f"{where[0]} defines it")
    for name in sorted(table):
        if name not in defined:
            problems.append(f"docs/design.md: the table of named notes lists Note [{name}], "
                            "which no source defines")
    print("\n".join(problems) if problems else
          f"{len(defined)} notes, each defined once, cited only by name, listed in docs/design.md; "
          "every path in a comment exists")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
