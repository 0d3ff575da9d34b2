"""scripts/gpu/cuda_symcheck.py on small libraries built here: one soname in an old and a new
version, consumers that need functions of either, a versioned symbol and a missing soname."""
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if not (shutil.which("cc") and shutil.which("readelf")):
    pytest.skip("needs a C compiler and readelf", allow_module_level=True)

spec = importlib.util.spec_from_file_location("gpu_cuda_symcheck",
                                              ROOT / "scripts/gpu/cuda_symcheck.py")
symcheck = importlib.util.module_from_spec(spec)
spec.loader.exec_module(symcheck)


def _so(out, soname, source, needed=(), version_script=None, libdirs=()):
    src = out.with_suffix(".c")
    src.write_text(source)
    cmd = ["cc", "-shared", "-fPIC", "-o", str(out), str(src), f"-Wl,-soname,{soname}"]
    if version_script:
        vs = out.with_suffix(".map")
        vs.write_text(version_script)
        cmd.append(f"-Wl,--version-script={vs}")
    for d in libdirs:
        cmd.append(f"-L{d}")
    cmd += [f"-l:{n}" for n in needed]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


@pytest.fixture
def libs(tmp_path):
    old, new, cons = tmp_path / "old", tmp_path / "new", tmp_path / "cons"
    for d in (old, new, cons):
        d.mkdir()
    vs = "PROV_1 { global: prov_versioned; local: *; };\n"
    _so(old / "libprov.so.1", "libprov.so.1", "int prov_a(void){return 1;}\n")
    _so(new / "libprov.so.1", "libprov.so.1",
        "int prov_a(void){return 1;}\nint prov_b(void){return 2;}\n")
    _so(old / "libver.so.1", "libver.so.1", "int prov_versioned(void){return 3;}\n",
        version_script=vs)
    _so(new / "libver.so.1", "libver.so.1", "int prov_versioned(void){return 3;}\n",
        version_script=vs)
    _so(new / "libonlynew.so.2", "libonlynew.so.2", "int onlynew(void){return 4;}\n")
    good = _so(cons / "libgood.so", "libgood.so",
               "int prov_a(void); int prov_versioned(void);\n"
               "int good(void){return prov_a() + prov_versioned();}\n",
               needed=("libprov.so.1", "libver.so.1"), libdirs=(old,))
    bad = _so(cons / "libbad.so", "libbad.so",
              "int prov_a(void); int prov_b(void); int onlynew(void);\n"
              "int bad(void){return prov_a() + prov_b() + onlynew();}\n",
              needed=("libprov.so.1", "libonlynew.so.2"), libdirs=(new,))
    return old, new, good, bad


def test_symbols_reads_versions(libs):
    old, _, good, _ = libs
    undefined, defined = symcheck.symbols(str(good))
    assert "prov_versioned@PROV_1" in undefined and "prov_a" in undefined
    assert "good" in defined and "prov_a" not in defined
    _, provided = symcheck.symbols(str(old / "libver.so.1"))
    assert {"prov_versioned", "prov_versioned@PROV_1"} <= provided


def test_consumer_served_by_the_old_set_passes(libs, capsys):
    old, new, good, _ = libs
    assert symcheck.main([str(old), str(new), str(good)]) == 0
    out = capsys.readouterr().out
    assert "libgood.so: 2 undefined symbols resolved by CUDA libraries" in out
    assert "only in" in out and "libonlynew.so.2" in out


def test_missing_function_and_soname_are_named(libs, capsys):
    old, new, _, bad = libs
    assert symcheck.main([str(old), str(new), str(bad)]) == 1
    out = capsys.readouterr().out
    assert "MISSING libbad.so: prov_b (defined by libprov.so.1" in out
    assert "libbad.so: needs libonlynew.so.2" in out
    assert "MISSING libbad.so: prov_a" not in out


def test_bad_arguments(tmp_path):
    with pytest.raises(SystemExit, match="is not a folder"):
        symcheck.main([str(tmp_path / "nope"), str(tmp_path), "x.so"])
    with pytest.raises(SystemExit):
        symcheck.main([str(tmp_path)])
