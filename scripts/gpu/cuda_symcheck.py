#!/usr/bin/env python3
"""Would these libraries load against the CUDA libraries a machine already has?

    cuda_symcheck.py MACHINE_DIR PINNED_DIR CONSUMER.so [CONSUMER.so ...]

MACHINE_DIR and PINNED_DIR each hold shared libraries (searched recursively, e.g. the unpacked
nvidia-* wheels of the machine's torch and of the torch being staged). For every consumer, each
undefined dynamic symbol (with its version tag) that a library of PINNED_DIR named in the
consumer's DT_NEEDED defines must also be defined by the MACHINE_DIR library of the same soname.
Prints every symbol that is not, every needed soname MACHINE_DIR lacks, and per consumer how many
symbols the CUDA libraries resolve; exit status 1 when anything is missing. Reads ELF headers with
`readelf` (binutils) only: nothing is loaded. docs/gpu-staging.md (0.5.23) has the result for torch
2.14.1 on the H200 machine's torch 2.11.0 CUDA set.
"""
import os
import re
import subprocess
import sys
from collections import Counter


def _readelf(args, path):
    return subprocess.run(["readelf", *args, "-W", path], capture_output=True, text=True,
                          check=True).stdout


def symbols(path):
    """(undefined, defined): undefined as 'name' or 'name@VERSION'; defined holds both the bare
    name and 'name@VERSION' for a versioned definition, so either kind of reference matches."""
    undefined, defined = set(), set()
    for line in _readelf(["--dyn-syms"], path).splitlines():
        f = line.split()
        if len(f) < 8 or not f[0].endswith(":"):
            continue
        name = f[7].split(" (")[0]
        if f[6] == "UND":
            undefined.add(name)
            continue
        base, _, version = name.replace("@@", "@").partition("@")
        defined.add(base)
        if version:
            defined.add(f"{base}@{version}")
    return undefined, defined


def dynamic(path):
    """(soname or None, [needed sonames])."""
    text = _readelf(["-d"], path)
    m = re.search(r"\(SONAME\).*\[(.*)\]", text)
    return (m.group(1) if m else None), re.findall(r"\(NEEDED\).*\[(.*)\]", text)


def libraries(root):
    """soname -> path of every shared library under root (symlinks skipped)."""
    found = {}
    for d, _, files in os.walk(root):
        for name in sorted(files):
            p = os.path.join(d, name)
            if ".so" not in name or os.path.islink(p):
                continue
            try:
                soname, _ = dynamic(p)
            except subprocess.CalledProcessError:
                continue                                      # not an ELF file
            if soname:
                found.setdefault(soname, p)
    return found


def check(machine, pinned, consumers):
    """Lines of the report and whether everything resolves."""
    old, new = libraries(machine), libraries(pinned)
    cache = {}

    def defined(p):
        if p not in cache:
            cache[p] = symbols(p)[1]
        return cache[p]

    lines, ok = [], True
    for soname in sorted(set(new) - set(old)):
        lines.append(f"only in {pinned}: {soname}")
    resolved = Counter()
    for cons in consumers:
        label = os.path.basename(cons)
        undefined, _ = symbols(cons)
        needed = [n for n in dynamic(cons)[1] if n in old or n in new]
        for n in needed:
            if n not in old:
                ok = False
                lines.append(f"{label}: needs {n}, which {machine} lacks")
        for sym in sorted(undefined):
            by_new = [n for n in needed if n in new and sym in defined(new[n])]
            by_old = [n for n in needed if n in old and sym in defined(old[n])]
            if by_new or by_old:
                resolved[label] += 1
            if by_new and not by_old:
                ok = False
                lines.append(f"MISSING {label}: {sym} (defined by {', '.join(by_new)} of "
                             f"{pinned} only)")
    for cons in consumers:
        label = os.path.basename(cons)
        lines.append(f"{label}: {resolved[label]} undefined symbols resolved by CUDA libraries")
    return lines, ok


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        raise SystemExit(__doc__)
    for d in argv[:2]:
        if not os.path.isdir(d):
            raise SystemExit(f"cuda_symcheck.py: {d!r} is not a folder")
    lines, ok = check(argv[0], argv[1], argv[2:])
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
