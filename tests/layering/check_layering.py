#!/usr/bin/env python3
"""tests/layering/check_layering.py: the module layering of cmake/SpmdModules.cmake holds.

Usage: check_layering.py SOURCE_DIR LAYERING_JSON [LIBRARIES_TXT NM]

LAYERING_JSON is written by CMake at configure time (spmd_write_layering_file): the modules,
lowest first, with their folders, backend/separate flags, USES lists and, for built modules, the
link libraries their targets were given. The rule, from that one list:

  a module may include and link a module before it, except a backend, which only the modules
  naming it in USES may use; nothing in spmd/ includes the umbrella <spmd/spmd.h>, and the
  umbrella spmd::spmd does not link a SEPARATE module. A file belongs to the module whose folder
  is the longest prefix of its path; spmd/<module>.h to that module (its one-include header).

And tests/ mirrors spmd/: every module's first folder spmd/X has a folder tests/X.

With LIBRARIES_TXT (`module=path` of each built module library) and an nm program, also the
symbols: a module library may use (leave undefined) only symbols that it or a module it may use
defines. That catches a function declared in a low module and defined in a higher one whenever a
low module calls it, however the headers look.

Every violation is printed as `file:line: ...` (includes), `target -> target: ...` (links) or
`target uses symbol ... of target` (symbols); the exit code is 1 when there is any.
"""
import json
import os
import re
import subprocess
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
# spmd_<module> (a target) or spmd::<module> (its alias or exported name).
LINKED = re.compile(r"(?<![A-Za-z0-9_])spmd(?:_|::)([a-z0-9_]+)")
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc")


def main():
    source_dir, layering_file = sys.argv[1], sys.argv[2]
    with open(layering_file) as f:
        layering = json.load(f)
    modules = layering["modules"]
    index = {m["name"]: i for i, m in enumerate(modules)}
    by_name = {m["name"]: m for m in modules}
    folders = sorted(((folder, m["name"]) for m in modules for folder in m["folders"]),
                     key=lambda fm: -len(fm[0]))

    def module_of(path):
        for folder, name in folders:
            if path == folder or path.startswith(folder + "/"):
                return name
        # spmd/<module>.h: the module's one-include header (spmd/testing.h).
        m = re.fullmatch(r"spmd/([a-z0-9_]+)\.h", path)
        if m and m.group(1) in index:
            return m.group(1)
        return None

    def why_not(user, dep):
        """None when `user` may use `dep`, else the reason it may not."""
        if dep == user:
            return None
        if index[dep] > index[user]:
            return f"{dep} is above {user} in cmake/SpmdModules.cmake"
        if by_name[dep]["backend"] and dep not in by_name[user]["uses"]:
            target = f"spmd::{dep}" if by_name[dep]["separate"] else "spmd::spmd"
            return (f"{dep} is a backend: only the modules naming it in USES may use it "
                    f"(a program gets it by linking {target})")
        return None

    order = ", ".join(m["name"] for m in modules)
    violations = []
    files = includes = 0

    # ---- includes ----
    root = os.path.join(source_dir, "spmd")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for filename in sorted(filenames):
            if not filename.endswith(SOURCE_SUFFIXES):
                continue
            full = os.path.join(dirpath, filename)
            path = os.path.relpath(full, source_dir).replace(os.sep, "/")
            user = module_of(path)
            if user is None:
                if path != "spmd/spmd.h":
                    violations.append(f"{path}:1: the file is in no module's folder; add its "
                                      f"module to cmake/SpmdModules.cmake ({order})")
                continue
            files += 1
            with open(full, encoding="utf-8", errors="replace") as f:
                for line_number, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    quote, header = m.groups()
                    if quote == '"':
                        violations.append(f"{path}:{line_number}: {user} includes \"{header}\"; "
                                          f"spmdsim's headers are included as <spmd/...>")
                        continue
                    if not header.startswith("spmd/"):
                        continue
                    includes += 1
                    if header == "spmd/spmd.h":
                        violations.append(f"{path}:{line_number}: {user} includes the umbrella "
                                          f"<spmd/spmd.h>, which includes every module")
                        continue
                    dep = module_of(header)
                    if dep is None:
                        continue  # spmd/config.h, generated: says what the build holds
                    reason = why_not(user, dep)
                    if reason:
                        violations.append(f"{path}:{line_number}: {user} includes <{header}> of "
                                          f"module {dep}: {reason}")

    # ---- links ----
    links = 0
    for m in modules:
        seen = set()
        for item in m["links"]:
            for dep in LINKED.findall(item):
                if dep in seen:
                    continue  # the same link as a LINK_LIBRARIES and an INTERFACE_ item
                seen.add(dep)
                links += 1
                if dep == "spmd":
                    violations.append(f"spmd_{m['name']} -> spmd (the umbrella): a module links "
                                      f"only modules below it, not every module")
                    continue
                if dep not in index:
                    continue  # not a module target (none of the modules links one today)
                reason = why_not(m["name"], dep)
                if reason:
                    violations.append(f"spmd_{m['name']} -> spmd_{dep}: {reason}")
    for item in layering["umbrella"]["links"]:
        for dep in LINKED.findall(item):
            if dep in by_name and by_name[dep]["separate"]:
                violations.append(f"spmd -> spmd_{dep}: {dep} is SEPARATE; a program links "
                                  f"spmd::{dep} itself when it wants it")

    # ---- symbols ----
    symbols = 0  # defined by the module libraries
    if len(sys.argv) > 4:
        libraries = {}
        with open(sys.argv[3]) as f:
            for line in f:
                name, _, path = line.strip().partition("=")
                if name in index and os.path.exists(path):
                    libraries[name] = path
        nm = sys.argv[4]

        def nm_symbols(path, *flags):
            out = subprocess.run([nm, "-g", *flags, path], check=True, capture_output=True,
                                 text=True).stdout
            return {line.split()[-1] for line in out.splitlines()
                    if line.strip() and not line.endswith(":") and len(line.split()) >= 2}

        defined = {m: nm_symbols(p, "--defined-only") for m, p in libraries.items()}
        for user, path in libraries.items():
            allowed = set(defined[user])
            for m in libraries:
                if why_not(user, m) is None:
                    allowed |= defined[m]
            for symbol in sorted(nm_symbols(path, "--undefined-only") - allowed):
                owners = [m for m in libraries if symbol in defined[m]]
                if not owners:
                    continue  # a system or third-party library's
                name = subprocess.run(["c++filt", symbol], capture_output=True,
                                      text=True).stdout.strip() or symbol
                owner = owners[0]
                violations.append(f"spmd_{user} uses symbol {name} of spmd_{owner}: "
                                  f"{why_not(user, owner)}")
        symbols = sum(len(d) for d in defined.values())

    # tests/ mirrors spmd/: every module's first folder spmd/X has its tests in tests/X.
    for m in modules:
        folder = m["folders"][0]
        mirror = "tests/" + folder[len("spmd/"):]
        if not os.path.isdir(os.path.join(source_dir, mirror)):
            violations.append(f"{mirror}: module {m['name']} ({folder}) has no tests folder; "
                              "tests/ mirrors spmd/ module for module")

    if violations:
        print(f"layering violations ({len(violations)}); the modules, lowest first: {order}")
        for v in violations:
            print(f"  {v}")
        return 1
    print(f"layering ok: {len(modules)} modules ({order}); {files} files, {includes} includes "
          f"of <spmd/...>, {links} links between module targets, {symbols} symbols defined by "
          f"the module libraries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
