"""Drift guards: what each patch relies on in pristine upstream SGLang. Patch authors append entries.

tests/patches/test_drift_guards.py checks every entry against the PRISTINE sources of each listed version
(parsed with `ast`, never imported), so an SGLang bump that moves or reshapes a seam fails here, by name,
before a patch is half-understood. Every patch of every pinned series needs at least one entry.

Fields of Guard (file is relative to the folder that contains sglang/, as in the patches):
  patch           the patch file name, e.g. "0001-ngram-corpus-cstddef.patch"
  versions        the SGLang versions whose pristine source must satisfy the entry
  file            the upstream file the patch touches
  symbol          optional, in a .py file: "func", "Class", "Class.method", "Class.field" (a class-level
                  assignment or annotation, e.g. a ServerArgs dataclass field), "NAME" (module-level)
  params          optional, the exact parameter names of that function/method in order, with "*args",
                  "**kwargs" and "*" (bare star) written as such
  params_include  optional, names that must be among the parameters (any order)
  contains        optional, text that must occur in the file (the lines the patch anchors to)
  lacks           optional, text that must NOT occur upstream (when it appears, upstream has the fix:
                  retire the patch)
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Guard:
    patch: str
    versions: tuple
    file: str
    symbol: str | None = None
    params: tuple | None = None
    params_include: tuple = ()
    contains: tuple = ()
    lacks: tuple = ()

    def __str__(self):
        what = f"{self.file}::{self.symbol}" if self.symbol else self.file
        return f"{self.patch}:{what}"


GUARDS = [
    # 0001: result.h declares Result::truncate(size_t) without including <cstddef> (fails with GCC 12).
    Guard(patch="0001-ngram-corpus-cstddef.patch", versions=("0.5.16",),
          file="sglang/jit_kernel/csrc/ngram_corpus/result.h",
          contains=("#pragma once", "#include <cstdint>", "void truncate(size_t n);"),
          lacks=("#include <cstddef>",)),
]
