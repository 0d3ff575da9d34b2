"""Apply, revert, check and inspect the patch series of the installed SGLang.

Standard library only (plus the GNU ``patch`` program; ``git`` only for git checkouts), so it runs
with a plain system ``python3`` before any project environment exists:

    python -m fastverify patches apply  [--sglang-dir DIR] [--verbose]
    python -m fastverify patches revert [--sglang-dir DIR]
    python -m fastverify patches check  [--sglang-dir DIR]
    python -m fastverify patches status [--sglang-dir DIR]

The target is the SGLang importable by the running interpreter (found without importing it), or DIR:
a folder that contains the ``sglang`` package (site-packages, an unpacked wheel) or a git checkout
of SGLang (package under DIR/python/). Its version picks ``patches/sglang-<version>/series``.

How a run decides, per patch, without touching the target:
  1. copy every file the series touches into a scratch folder;
  2. walk the series backwards: a patch whose reverse applies (``patch -R --fuzz=0 --dry-run``) is
     applied; reverse it in the scratch copy -> the copy now holds upstream (the *base*);
  3. walk the series forwards applying each patch to the copy (offsets are fine, fuzz is not): the
     copy now holds the fully patched result. A patch that applies in neither direction has
     *drifted*: the run names the patch, the file and the hunk, and changes nothing.
Only then are the real files patched; a failure half-way restores every touched file byte for byte.

Exit codes: 0 success; 1 drift (or, for ``status``, files modified by someone else); 2 a problem
with the environment or the input (no SGLang, unsupported version, no ``patch`` program, read-only
target, a series naming a missing file).
"""
from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from fastverify import pins as pins_mod

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PATCHES_DIR = REPO_ROOT / "patches"

APPLIED, NOT_APPLIED, DRIFTED = "applied", "not applied", "drifted"


class PatchToolError(Exception):
    """A problem with the environment or the input; nothing was changed."""

    exit_code = 2


class DriftError(PatchToolError):
    """A patch applies neither forwards nor backwards; nothing was changed."""

    exit_code = 1


# The signals that end a run early (Ctrl-C, kill, a closed terminal): each is turned into
# Interrupted in the main thread, so the all-or-nothing step restores the files before the end.
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, n))


class Interrupted(BaseException):
    """A stop signal arrived; a BaseException like KeyboardInterrupt, so only the handlers meant
    for it catch it. Exit code 128 + the signal number, as a shell reports a process ended by it."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by {self.name}")


class InterruptedRun(PatchToolError):
    """A stop signal arrived while files were being written; every touched file was restored."""

    def __init__(self, interrupted: Interrupted, message: str):
        super().__init__(message)
        self.exit_code = interrupted.exit_code


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


@contextlib.contextmanager
def _signals(handler):
    """Within the block the stop signals call ``handler`` (a function, or signal.SIG_IGN); the
    previous handlers come back after it. A no-op outside the main thread (no handlers there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# --------------------------------------------------------------------------------------------------
# The target: where SGLang lives and which version it is


@dataclass(frozen=True)
class Target:
    root: Path  # the folder that contains sglang/ (patches apply here with -p1)
    version: str
    layout: str  # "site-packages" | "folder" | "git checkout"
    record: Path | None = None  # the dist-info RECORD (pip's sha256 per file), if any
    checkout: Path | None = None  # the git work tree, for a checkout

    def describe(self) -> str:
        where = f"{self.layout} {self.root}"
        if self.checkout is not None:
            where = f"git checkout {self.checkout}"
        return f"SGLang {self.version} at {where}"


def _is_package(path: Path) -> bool:
    return (path / "__init__.py").is_file()


def _installed_root() -> Path:
    """The folder holding the sglang package the running interpreter would import (not imported)."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise PatchToolError(
            f"no SGLang found for {sys.executable}: the package 'sglang' is not importable. "
            "Install a supported release (pip install sglang==<version>) or pass --sglang-dir DIR "
            "(a folder that contains sglang/, or a git checkout of SGLang)."
        )
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent


def _dist_info(root: Path) -> Path | None:
    """The sglang-<ver>.dist-info next to the package, if exactly one is there."""
    found = sorted(p for p in root.glob("*.dist-info")
                   if re.fullmatch(r"sglang-[^-]+\.dist-info", p.name))
    if len(found) > 1:
        raise PatchToolError(
            f"more than one SGLang dist-info in {root}: {', '.join(p.name for p in found)}; "
            "remove the stale one(s) (pip uninstall sglang, then reinstall one release)"
        )
    return found[0] if found else None


def _metadata_version(dist_info: Path) -> str | None:
    meta = dist_info / "METADATA"
    if not meta.is_file():
        return None
    for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
        if not line.strip():  # end of the header block
            break
    return None


_VERSION_ASSIGN = re.compile(
    r"""^(?:__version__|version)\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", re.M)


def _checkout_version(pkg_parent: Path, checkout: Path | None) -> str | None:
    """The version of a source tree: _version.py, a literal in version.py,
    pyproject, or a git tag."""
    for name in ("_version.py", "version.py"):
        f = pkg_parent / "sglang" / name
        if f.is_file():
            m = _VERSION_ASSIGN.search(f.read_text(encoding="utf-8", errors="replace"))
            if m:
                return m.group(1)
    pyproject = pkg_parent / "pyproject.toml"
    if pyproject.is_file():
        m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(encoding="utf-8"), re.M)
        if m:
            return m.group(1)
    if checkout is not None and shutil.which("git"):
        out = subprocess.run(
            ["git", "-C", str(checkout), "describe", "--tags", "--exact-match"],
            capture_output=True, text=True,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().lstrip("v")
    return None


def _git_toplevel(path: Path) -> Path | None:
    if not (path / ".git").exists():
        return None
    return path


def find_target(sglang_dir: str | Path | None = None) -> Target:
    """Locate SGLang (the importable one, or the folder given) and read its version."""
    if sglang_dir is None:
        root = _installed_root()
        layout = "site-packages"
        checkout = _git_toplevel(root.parent) if root.name == "python" else None
    else:
        d = Path(sglang_dir).expanduser().resolve()
        if not d.is_dir():
            raise PatchToolError(f"--sglang-dir {sglang_dir}: no such folder")
        if _is_package(d / "sglang"):
            root, layout = d, "folder"
            checkout = _git_toplevel(d.parent) if d.name == "python" else None
        elif _is_package(d / "python" / "sglang"):
            root, layout, checkout = d / "python", "git checkout", d
        elif d.name == "sglang" and _is_package(d):
            root, layout, checkout = d.parent, "folder", None
        else:
            raise PatchToolError(
                f"--sglang-dir {sglang_dir}: no SGLang package there. Give a folder that contains "
                "sglang/__init__.py (site-packages, an unpacked wheel) or a git checkout of SGLang "
                "(python/sglang/__init__.py)."
            )
    if checkout is not None:
        layout = "git checkout"
    dist = _dist_info(root)
    version = _metadata_version(dist) if dist else None
    if version is None:
        version = _checkout_version(root, checkout)
    if version is None and sglang_dir is None:
        try:
            version = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            version = None
    if version is None:
        hint = (" and git is not installed (apt-get install git)"
                if checkout and not shutil.which("git") else "")
        raise PatchToolError(
            f"cannot tell the SGLang version at {root}: no sglang-*.dist-info/METADATA, no version "
            f"in sglang/_version.py, sglang/version.py or pyproject.toml, no exact git tag{hint}"
        )
    record = dist / "RECORD" if dist and (dist / "RECORD").is_file() else None
    return Target(root=root, version=version, layout=layout, record=record, checkout=checkout)


# --------------------------------------------------------------------------------------------------
# Patches and the series


@dataclass(frozen=True)
class FilePatch:
    path: str  # relative to the target root, e.g. "sglang/srt/server_args.py"
    created: bool  # the patch creates the file
    deleted: bool  # the patch deletes the file
    hunks: tuple = ()  # the "@@ ... @@" header of each hunk, in order (hunk #1 first)


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    subject: str
    files: tuple  # FilePatch, in the order patch(1) visits them

    def hunk_header(self, file: str, number: int) -> str:
        for fp in self.files:
            if fp.path == file and 1 <= number <= len(fp.hunks):
                return fp.hunks[number - 1]
        return ""


def _strip_header_path(text: str) -> str | None:
    name = text.split("\t", 1)[0].strip()
    if name == "/dev/null":
        return None
    if name.startswith('"') and name.endswith('"'):
        name = name[1:-1]
    return name.split("/", 1)[1] if "/" in name else name  # -p1


def parse_patch(path: Path) -> Patch:
    """Read a unified diff (with an optional git format-patch header) and list what it touches."""
    try:
        lines = path.read_text(encoding="utf-8", errors="surrogateescape").splitlines()
    except FileNotFoundError:
        raise PatchToolError(f"patch file not found: {path}") from None
    subject = ""
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not subject and line.startswith("Subject:"):
            subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", line.split(":", 1)[1].strip())
        if line.startswith("--- ") and i + 2 < len(lines) and lines[i + 1].startswith("+++ ") \
                and lines[i + 2].startswith("@@"):
            old, new = _strip_header_path(line[4:]), _strip_header_path(lines[i + 1][4:])
            name = new or old
            if name is None:
                raise PatchToolError(f"{path.name}: line {i + 1}: both sides are /dev/null")
            if not name.startswith("sglang/"):
                raise PatchToolError(
                    f"{path.name}: line {i + 1}: path {name!r} is not under sglang/ (paths are "
                    "relative to the folder that contains the sglang package, with a/ and b/ "
                    "prefixes)"
                )
            hunks = []
            j = i + 2
            while j < len(lines) and not (lines[j].startswith("--- ") and j + 1 < len(lines)
                                          and lines[j + 1].startswith("+++ ")):
                if lines[j].startswith("@@"):
                    hunks.append(lines[j])
                j += 1
            created = old is None or all(h.startswith("@@ -0,0 ") for h in hunks)
            files.append(FilePatch(name, created=created, deleted=new is None, hunks=tuple(hunks)))
            i = j
            continue
        i += 1
    if not files:
        raise PatchToolError(f"{path}: no file diffs found (expected unified diff '--- "
                             "a/sglang/...' lines)")
    return Patch(name=path.name, path=path, subject=subject, files=tuple(files))


def series_dir(version: str, patches_dir: Path = DEFAULT_PATCHES_DIR) -> Path:
    return Path(patches_dir) / f"sglang-{version}"


def load_series(version: str, patches_dir: Path = DEFAULT_PATCHES_DIR,
                pins_file: Path | None = None) -> list[Patch]:
    """The patches for one SGLang version, in series order. An unsupported version is an error."""
    try:
        pins_mod.pin_for(version, pins_file)
    except pins_mod.PinsError as e:
        raise PatchToolError(str(e)) from None
    folder = series_dir(version, patches_dir)
    series = folder / "series"
    if not series.is_file():
        raise PatchToolError(f"SGLang {version} is pinned but has no series file: {series}")
    patches = []
    for lineno, raw in enumerate(series.read_text(encoding="utf-8").splitlines(), start=1):
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        f = folder / name
        if not f.is_file():
            raise PatchToolError(f"{series}:{lineno}: names {name}, which does not exist in "
                                 f"{folder}")
        patches.append(parse_patch(f))
    return patches


# --------------------------------------------------------------------------------------------------
# Running patch(1)


def patch_program() -> str:
    exe = shutil.which("patch")
    if exe is None:
        raise PatchToolError(
            "the 'patch' program (GNU patch) is not installed or not on PATH; install it with "
            "'apt-get install patch' (Debian/Ubuntu), 'dnf install patch' or 'brew install "
            "gpatch'. Nothing changed."
        )
    return exe


@dataclass(frozen=True)
class Failure:
    file: str
    hunk: int | None  # None: the file itself is missing
    line: int | None
    header: str = ""

    def describe(self) -> str:
        if self.hunk is None:
            return f"{self.file}: file not found"
        where = f" (expected near line {self.line})" if self.line else ""
        return f"{self.file}: hunk #{self.hunk}{where} {self.header}".rstrip()


@dataclass
class PatchRun:
    ok: bool
    output: str
    failures: list = field(default_factory=list)


_CHECKING = re.compile(r"^(?:checking|patching) file (.+)$")
_FAILED = re.compile(r"^Hunk #(\d+) FAILED at (\d+)")
_MISSING_CONTEXT = re.compile(r"^\|(?:---|\+\+\+) (.+)$")


def parse_patch_output(output: str, patch: Patch) -> list:
    """Failures in patch(1)'s output: (file, hunk number, line) for 'Hunk #N FAILED
    at L', missing files."""
    failures, current, missing = [], None, False
    for line in output.splitlines():
        m = _CHECKING.match(line)
        if m:
            current, missing = m.group(1), False
            continue
        if line.startswith("can't find file to patch"):
            missing = True
            continue
        m = _MISSING_CONTEXT.match(line)
        if missing and m:
            name = _strip_header_path(m.group(1))
            if name and name.startswith("sglang/"):
                failures.append(Failure(name, None, None))
                missing = False
            continue
        m = _FAILED.match(line)
        if m and current is not None:
            n = int(m.group(1))
            failures.append(Failure(current, n, int(m.group(2)), patch.hunk_header(current, n)))
    return failures


def run_patch(root: Path, patch: Patch, *, reverse=False, dry_run=False) -> PatchRun:
    """patch -p1 --fuzz=0 in root; --force so it never guesses a direction or asks a question."""
    cmd = [patch_program(), "-p1", "--fuzz=0", "--force", "--no-backup-if-mismatch",
           "--reject-file=-", "--quoting-style=literal", "-d", str(root), "-i", str(patch.path)]
    if reverse:
        cmd.append("--reverse")
    if dry_run:
        cmd.append("--dry-run")
    env = dict(os.environ, LC_ALL="C", LANGUAGE="C")
    env.pop("POSIXLY_CORRECT", None)
    env.pop("PATCH_GET", None)
    env.pop("SIMPLE_BACKUP_SUFFIX", None)
    env.pop("VERSION_CONTROL", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    output = proc.stdout + proc.stderr
    return PatchRun(ok=proc.returncode == 0, output=output,
                    failures=parse_patch_output(output, patch))


# --------------------------------------------------------------------------------------------------
# The plan: the state of every patch, worked out in a scratch copy


def touched_files(patches) -> list[str]:
    seen: dict[str, None] = {}
    for p in patches:
        for fp in p.files:
            seen.setdefault(fp.path, None)
    return list(seen)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _snapshot(root: Path, files) -> dict:
    return {f: _read(root / f) for f in files}


@dataclass
class PatchState:
    patch: Patch
    state: str
    # hunks that apply in neither direction, missing files
    failures: list = field(default_factory=list)
    in_place: list = field(default_factory=list)  # partly applied: hunks already there ...
    not_in_place: list = field(default_factory=list)  # ... and hunks that are not
    output: str = ""

    def drift_message(self) -> str:
        lines = [f"patch {self.patch.name} no longer applies "
                 f"({self.patch.subject or 'no subject'}):"]
        lines += [f"  drifted: {f.describe()}" for f in self.failures]
        lines += [f"  partly applied, this hunk is in place: {f.describe()}" for f in self.in_place]
        lines += [f"  partly applied, this hunk is missing: {f.describe()}"
                  for f in self.not_in_place]
        if len(lines) == 1:
            lines.append("  patch reported: " + " | ".join(self.output.strip().splitlines()[-3:]))
        return "\n".join(lines)


@dataclass
class Plan:
    target: Target
    patches: list
    states: list  # PatchState, series order
    files: list  # every touched file, relative to the root
    current: dict  # file -> bytes | None: the target now
    base: dict  # ... with every applied patch reversed (upstream, if nobody else edited the files)
    final: dict  # ... with the whole series applied

    @property
    def drifted(self) -> list:
        return [s for s in self.states if s.state == DRIFTED]

    def with_state(self, state: str) -> list:
        return [s for s in self.states if s.state == state]


def _remove_if_empty(path: Path) -> None:
    if path.is_file() and path.stat().st_size == 0:
        path.unlink()


def make_plan(target: Target, patches, *, log=None) -> Plan:
    """Work out which patches are applied, which would apply, and which drifted.
    Reads the target only."""
    files = touched_files(patches)
    current = _snapshot(target.root, files)
    states: dict[str, PatchState] = {}
    with tempfile.TemporaryDirectory(prefix="fastverify-plan-") as tmp:
        ws = Path(tmp)
        for f, data in current.items():
            if data is not None:
                (ws / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(target.root / f, ws / f)
        applied = set()
        reverse_runs = {}
        for p in reversed(patches):  # peel off what is applied, newest first
            r = run_patch(ws, p, reverse=True, dry_run=True)
            reverse_runs[p.name] = r
            if r.ok:
                run_patch(ws, p, reverse=True)
                for fp in p.files:
                    if fp.created:
                        _remove_if_empty(ws / fp.path)
                applied.add(p.name)
        base = _snapshot(ws, files)
        for p in patches:  # then build the whole series on top of the base
            r = run_patch(ws, p, dry_run=True)
            if r.ok:
                run_patch(ws, p)
                states[p.name] = PatchState(p, APPLIED if p.name in applied else NOT_APPLIED,
                                            output=r.output)
                continue
            # forward failures: hunks not applicable; reverse failures: hunks not in place
            fwd = {(f.file, f.hunk): f for f in r.failures}
            rev = {(f.file, f.hunk): f for f in reverse_runs[p.name].failures}
            state = PatchState(p, DRIFTED, output=r.output + reverse_runs[p.name].output)
            state.failures = [f for key, f in fwd.items() if key in rev or f.hunk is None]
            if not state.failures:  # every hunk is fine one way or the other: a half-applied patch
                state.in_place = [f for key, f in fwd.items() if key not in rev]
                state.not_in_place = [f for key, f in rev.items() if key not in fwd]
            states[p.name] = state
        final = _snapshot(ws, files)
    ordered = [states[p.name] for p in patches]
    if log is not None:
        for k, s in enumerate(ordered, start=1):
            log(f"  [{k}/{len(ordered)}] {s.patch.name}: {s.state}")
    return Plan(target, list(patches), ordered, files, current, base, final)


# --------------------------------------------------------------------------------------------------
# RECORD (pip's list of installed files with sha256) and git


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def read_record(record: Path) -> dict:
    """{path relative to the root: 'sha256=...'} for every hashed file of the sglang package."""
    entries = {}
    with open(record, newline="", encoding="utf-8") as fh:
        for row in csv.reader(fh):
            if len(row) < 2 or not row[1]:
                continue  # RECORD itself and compiled files carry no hash
            path = row[0]
            if not path.startswith("sglang/"):
                continue  # the dist-info itself, console scripts, helper top-level folders
            entries[path] = row[1]
    return entries


def _git(checkout: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True)


def _git_head_bytes(target: Target, rel: str) -> bytes | None:
    """The file as committed at HEAD of the checkout (None: not in HEAD, or no git)."""
    if target.checkout is None or not shutil.which("git"):
        return None
    rel_checkout = (target.root / rel).relative_to(target.checkout).as_posix()
    out = _git(target.checkout, "show", f"HEAD:{rel_checkout}")
    return out.stdout if out.returncode == 0 else None


def foreign_changes_in_base(plan: Plan, record: dict | None) -> list:
    """Touched files that, with our patches reversed, still differ from upstream
    (RECORD, else git HEAD)."""
    bad = []
    for rel in plan.files:
        base = plan.base[rel]
        if record is not None:
            want = record.get(rel)
            if ((want is None and base is not None)
                    or (want is not None and (base is None or record_hash(base) != want))):
                bad.append(rel)
        elif target_has_git(plan.target):
            if base != _git_head_bytes(plan.target, rel):
                bad.append(rel)
    return bad


def target_has_git(target: Target) -> bool:
    return target.checkout is not None and shutil.which("git") is not None


# --------------------------------------------------------------------------------------------------
# Writing: access checks, backup and restore, __pycache__


def _pycache_files(root: Path, rel: str) -> list:
    p = root / rel
    if p.suffix != ".py":
        return []
    cache = p.parent / "__pycache__"
    return sorted(cache.glob(f"{p.stem}.*.pyc")) if cache.is_dir() else []


def check_writable(target: Target, files) -> None:
    """Every touched file, the folder it is in, and its compiled copies must be writable."""
    problems = []
    for rel in files:
        path = target.root / rel
        if path.exists():
            if not os.access(path, os.W_OK):
                problems.append(str(path))
            folder = path.parent
        else:
            folder = path.parent
            while not folder.exists():
                folder = folder.parent
        if not os.access(folder, os.W_OK | os.X_OK):
            problems.append(f"{folder}/ (folder)")
        pyc = _pycache_files(target.root, rel)
        if pyc and not os.access(pyc[0].parent, os.W_OK | os.X_OK):
            problems.append(f"{pyc[0].parent}/ (folder)")
    if problems:
        shown = "\n  ".join(dict.fromkeys(problems))
        raise PatchToolError(
            f"{target.describe()} is read-only for this user; cannot write:\n  {shown}\n"
            "Nothing changed. Run as a user who owns that installation, or patch a copy "
            "(pip install --target DIR --no-deps sglang==<version>, then --sglang-dir DIR)."
        )


@dataclass
class Backup:
    root: Path
    files: dict  # rel -> (bytes | None, mode | None)
    new_dirs: list  # folders that did not exist before (created for new files), deepest last

    @classmethod
    def take(cls, root: Path, files) -> "Backup":
        saved, new_dirs = {}, []
        for rel in files:
            path = root / rel
            data = _read(path)
            saved[rel] = (data, path.stat().st_mode if data is not None else None)
            folder = path.parent
            missing = []
            while not folder.exists():
                missing.append(folder)
                folder = folder.parent
            new_dirs.extend(reversed(missing))
        return cls(root, saved, list(dict.fromkeys(new_dirs)))

    def restore(self) -> None:
        for rel, (data, mode) in self.files.items():
            _write_exact(self.root / rel, data, mode)
        for folder in reversed(self.new_dirs):
            try:
                folder.rmdir()
            except OSError:
                pass


def _write_exact(path: Path, data: bytes | None, mode: int | None = None) -> None:
    """Make path hold exactly data (None: absent), via a temporary file and an atomic rename."""
    if data is None:
        if path.exists():
            path.unlink()
        return
    if _read(path) == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.fastverify-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        if mode is not None:
            os.chmod(tmp, mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def purge_pycache(root: Path, files) -> None:
    for rel in files:
        for pyc in _pycache_files(root, rel):
            pyc.unlink(missing_ok=True)


def _mismatches(root: Path, expected: dict) -> list:
    return [rel for rel, data in expected.items() if _read(root / rel) != data]


# --------------------------------------------------------------------------------------------------
# The four commands


class Reporter:
    def __init__(self, verbose=False, out=None):
        self.verbose = verbose
        self.out = out if out is not None else sys.stdout

    def __call__(self, msg: str) -> None:
        print(msg, file=self.out, flush=True)

    def detail(self, text: str) -> None:
        if self.verbose and text.strip():
            for line in text.rstrip().splitlines():
                print(f"      | {line}", file=self.out, flush=True)


def _prepare(sglang_dir, patches_dir, pins_file, say: Reporter):
    patch_program()  # a clear error before anything else if patch(1) is missing
    target = find_target(sglang_dir)
    say(f"{target.describe()}")
    patches = load_series(target.version, Path(patches_dir), pins_file)
    say(f"series {series_dir(target.version, Path(patches_dir)) / 'series'}: {len(patches)} "
        "patch(es)")
    return target, patches


def _plan_or_drift(target, patches, say: Reporter) -> Plan:
    plan = make_plan(target, patches, log=say)
    for s in plan.states:
        say.detail(s.output)
    if plan.drifted:
        raise DriftError("\n".join(s.drift_message() for s in plan.drifted)
                         + f"\nNothing changed in {target.root}.")
    return plan


def cmd_check(sglang_dir=None, patches_dir=DEFAULT_PATCHES_DIR, pins_file=None, say=None) -> int:
    say = say or Reporter()
    target, patches = _prepare(sglang_dir, patches_dir, pins_file, say)
    plan = _plan_or_drift(target, patches, say)
    todo = plan.with_state(NOT_APPLIED)
    if todo:
        check_writable(target, plan.files)
    say(f"check: OK ({len(plan.with_state(APPLIED))} applied, {len(todo)} would apply, 0 drifted)")
    return 0


def _transaction(target, plan, steps, expected: dict, verb: str) -> None:
    """Run ``steps`` on the touched files all or nothing: every file is backed up first,
    and restored byte for byte if a step fails or a file does not end as the dry run
    computed (``expected``)."""
    check_writable(target, plan.files)
    with _signals(_raise_interrupted):  # SIGTERM and SIGHUP restore the files too, as SIGINT does
        backup = Backup.take(target.root, plan.files)
        try:
            steps()
            wrong = _mismatches(target.root, expected)
            if wrong:
                raise PatchToolError(f"after {verb}, these files differ from the checked result: "
                                     f"{', '.join(wrong)}")
        except BaseException as e:
            with _signals(signal.SIG_IGN):  # a second Ctrl-C does not stop the restore
                backup.restore()
            if isinstance(e, (Interrupted, KeyboardInterrupt)):
                why = e if isinstance(e, Interrupted) else Interrupted(signal.SIGINT)
                raise InterruptedRun(why, f"{why} while {verb}: restored every touched file byte "
                                          f"for byte; nothing changed in {target.root}.") from None
            if isinstance(e, PatchToolError):
                e.args = (f"{e.args[0]}\nRestored every touched file; nothing changed in "
                          f"{target.root}.",)
            raise
        with _signals(signal.SIG_IGN):  # the series is in: finish the clean-up
            purge_pycache(target.root, plan.files)


def cmd_apply(sglang_dir=None, patches_dir=DEFAULT_PATCHES_DIR, pins_file=None, say=None) -> int:
    say = say or Reporter()
    target, patches = _prepare(sglang_dir, patches_dir, pins_file, say)
    plan = _plan_or_drift(target, patches, say)
    todo = plan.with_state(NOT_APPLIED)
    if not todo:
        say(f"nothing to do: all {len(patches)} patch(es) already applied")
        return 0
    def apply_all():
        for s in todo:
            r = run_patch(target.root, s.patch)
            say.detail(r.output)
            if not r.ok:
                raise DriftError(f"patch {s.patch.name} failed while applying for real although "
                                 f"its dry run passed:\n{r.output.strip()}")
            say(f"  applied {s.patch.name} ({len(s.patch.files)} file(s))")

    _transaction(target, plan, apply_all, plan.final, "applying")
    say(f"done: {len(todo)} applied, {len(plan.with_state(APPLIED))} were already applied")
    return 0


def cmd_revert(sglang_dir=None, patches_dir=DEFAULT_PATCHES_DIR, pins_file=None, say=None,
               keep_foreign=False) -> int:
    say = say or Reporter()
    target, patches = _prepare(sglang_dir, patches_dir, pins_file, say)
    plan = _plan_or_drift(target, patches, say)
    record = read_record(target.record) if target.record else None
    foreign = foreign_changes_in_base(plan, record)
    if foreign and not keep_foreign:
        raise PatchToolError(
            "with our patches reversed, these files would still differ from upstream "
            f"({'RECORD' if record is not None else 'git HEAD'}): someone else modified them:\n  "
            + "\n  ".join(foreign)
            + f"\nNothing changed. Reinstall SGLang {target.version} to get upstream back, or pass "
              "--keep-foreign to reverse only our patches and keep those changes."
        )
    todo = [s for s in reversed(plan.states) if s.state == APPLIED]
    if not todo:
        say("nothing to do: no patch of the series is applied")
        return 0
    def revert_all():
        for s in todo:
            r = run_patch(target.root, s.patch, reverse=True)
            say.detail(r.output)
            if not r.ok:
                raise DriftError(f"reversing {s.patch.name} failed although its dry run "
                                 f"passed:\n{r.output.strip()}")
            for fp in s.patch.files:
                if fp.created and plan.base.get(fp.path) is None:
                    _remove_if_empty(target.root / fp.path)
            say(f"  reverted {s.patch.name}")

    _transaction(target, plan, revert_all, plan.base, "reverting")
    if record is not None:
        ok = [rel for rel in plan.files if rel in record
              and record_hash(_read(target.root / rel) or b"") == record[rel]]
        say(f"done: {len(todo)} reverted; {len(ok)}/{sum(rel in record for rel in plan.files)} "
            "touched file(s) match RECORD byte for byte")
    else:
        say(f"done: {len(todo)} reverted")
    return 0


@dataclass
class StatusReport:
    plan: Plan
    verdict: str  # "pristine" | "patched by us" | "modified by someone else" | "drifted"
    modified: list  # untouched files that differ from upstream
    missing: list  # untouched upstream files that are gone
    foreign: list  # touched files that differ from upstream even with our patches reversed
    checked: int  # untouched files compared
    method: str  # how they were compared


def status_report(target: Target, patches) -> StatusReport:
    plan = make_plan(target, patches)
    touched = set(plan.files)
    modified, missing, checked = [], [], 0
    if target.record is not None:
        record = read_record(target.record)
        method = f"RECORD {target.record}"
        for rel, want in record.items():
            if rel in touched:
                continue
            data = _read(target.root / rel)
            checked += 1
            if data is None:
                missing.append(rel)
            elif record_hash(data) != want:
                modified.append(rel)
        foreign = foreign_changes_in_base(plan, record)
    elif target_has_git(target):
        method = f"git HEAD of {target.checkout} (a checkout has no RECORD)"
        pkg = (target.root / "sglang").relative_to(target.checkout).as_posix()
        out = _git(target.checkout, "status", "--porcelain", "--untracked-files=no", "--", pkg)
        for line in out.stdout.decode(errors="replace").splitlines():
            rel = (target.checkout / line[3:].strip()).relative_to(target.root).as_posix()
            if rel not in touched:
                (missing if "D" in line[:2] else modified).append(rel)
        listed = _git(target.checkout, "ls-files", "--", pkg).stdout.decode(
            errors="replace").splitlines()
        checked = sum(1 for f in listed
                      if (target.checkout / f).relative_to(target.root).as_posix() not in touched)
        foreign = foreign_changes_in_base(plan, None)
    else:
        why = ("git is not installed (apt-get install git)" if target.checkout is not None
               else "no RECORD found")
        method = f"not verified: {why}"
        foreign = []
    if modified or missing or foreign:
        verdict = "modified by someone else"
    elif plan.drifted:
        verdict = "drifted"
    elif plan.with_state(APPLIED):
        verdict = "patched by us"
    else:
        verdict = "pristine"
    return StatusReport(plan, verdict, sorted(modified), sorted(missing), sorted(foreign),
                        checked, method)


def cmd_status(sglang_dir=None, patches_dir=DEFAULT_PATCHES_DIR, pins_file=None, say=None) -> int:
    say = say or Reporter()
    target, patches = _prepare(sglang_dir, patches_dir, pins_file, say)
    rep = status_report(target, patches)
    for k, s in enumerate(rep.plan.states, start=1):
        say(f"  [{k}/{len(rep.plan.states)}] {s.patch.name}: {s.state}")
        say.detail(s.output)
        if s.state == DRIFTED:
            for line in s.drift_message().splitlines()[1:]:
                say(f"      {line.strip()}")
    say(f"files compared with: {rep.method}")
    if rep.checked:
        say(f"  {rep.checked - len(rep.modified) - len(rep.missing)} of {rep.checked} file(s) no "
            "patch touches are pristine")
    for rel in rep.modified:
        say(f"  modified by someone else: {rel}")
    for rel in rep.missing:
        say(f"  missing: {rel}")
    for rel in rep.foreign:
        say(f"  modified by someone else (beyond our patches): {rel}")
    n = len(rep.plan.with_state(APPLIED))
    say(f"status: {rep.verdict} ({n}/{len(rep.plan.states)} patch(es) applied)")
    return 0 if rep.verdict in ("pristine", "patched by us") else 1


# --------------------------------------------------------------------------------------------------
# CLI


def add_parser(subparsers) -> argparse.ArgumentParser:
    """`fastverify patches {apply,revert,check,status}`."""
    parser = subparsers.add_parser(
        "patches", help="apply/revert/check/status of the SGLang patch series",
        description="Manage the patch series of the installed SGLang (or --sglang-dir DIR). "
                    "Exit codes: 0 ok, 1 drift / foreign modifications, 2 environment or input "
                    "error.")
    actions = parser.add_subparsers(dest="patches_action", metavar="{apply,revert,check,status}",
                                    required=True)
    helps = {
        "apply": "apply the series (all or nothing; already applied patches are skipped)",
        "revert": "reverse the applied patches, restoring upstream byte for byte",
        "check": "dry run of apply: exit 0 if it would apply or is applied, 1 on drift",
        "status": "per patch applied/not applied/drifted, and every other file against RECORD",
    }
    for name, text in helps.items():
        p = actions.add_parser(name, help=text, description=text)
        p.add_argument("--sglang-dir", metavar="DIR",
                       help="folder that contains the sglang package, or a git checkout of SGLang "
                            "(default: the SGLang this Python imports)")
        p.add_argument("--patches-dir", metavar="DIR", default=str(DEFAULT_PATCHES_DIR),
                       help="folder with sglang-<version>/series (default: %(default)s)")
        p.add_argument("--pins", metavar="FILE", default=None,
                       help="pin file (default: the repository's pins.txt)")
        p.add_argument("-v", "--verbose", action="store_true", help="show the output of patch(1)")
        if name == "revert":
            p.add_argument("--keep-foreign", action="store_true",
                           help="reverse our patches even if someone else also changed the touched "
                                "files")
    parser.set_defaults(func=run_cli)
    return parser


def run_cli(args) -> int:
    say = Reporter(verbose=args.verbose)
    common = dict(sglang_dir=args.sglang_dir, patches_dir=Path(args.patches_dir),
                  pins_file=Path(args.pins) if args.pins else None, say=say)
    commands = {"apply": cmd_apply, "revert": cmd_revert, "check": cmd_check, "status": cmd_status}
    if args.patches_action == "revert":
        common["keep_foreign"] = args.keep_foreign
    try:
        with _signals(_raise_interrupted):
            return commands[args.patches_action](**common)
    except PatchToolError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except Interrupted as e:  # outside the writing step: no file was being changed
        print(f"error: {e} while no file was being written; the files are whole "
              "(`fastverify patches status` shows their state)", file=sys.stderr, flush=True)
        return e.exit_code
