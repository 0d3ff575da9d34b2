"""scripts/gpu/device_env.sh on a stand-in bundle and store: a 0.5.23 bundle (stage.sha256) takes
only the store of its own chunks, a bundle without one takes any store (0.5.16), and a site tree
that holds its own torch gets torch's cuDNN minor-version check skipped."""
import hashlib
import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "scripts" / "gpu"


def _tar_xz(path, files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())


def _stage(tmp, name, site_files):
    """A store holding the chunks of a site.tar.xz (and a stand-in GGUF)."""
    src = tmp / f"src-{name}"
    src.mkdir()
    _tar_xz(src / "site.tar.xz", site_files)
    (src / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"gguf " + name.encode())
    out, store = tmp / f"stage-{name}", tmp / f"store-{name}"
    py = [sys.executable, str(GPU / "stage_chunks.py")]
    subprocess.run(py + ["split", "--max-mib", "1", "--out", str(out), str(src / "site.tar.xz"),
                         str(src / "SmolLM2-135M-Instruct.Q4_1.gguf")], check=True)
    for c in sorted(out.iterdir()):
        subprocess.run(py + ["receive", str(c), str(store)], check=True, capture_output=True)
    return store


def _bundle(tmp, name, stage_sha=None):
    b = tmp / f"bundle-{name}"
    (b / "models").mkdir(parents=True)
    for f in ("device_env.sh", "stage_chunks.py"):
        (b / f).write_bytes((GPU / f).read_bytes())
    _tar_xz(b / "overlay.tar.xz", {"fastverify/__init__.py": b""})
    _tar_xz(b / "jitcache.tar.xz", {})
    if stage_sha is not None:
        (b / "PIN").write_text("0.5.23\n")
        (b / "stage.sha256").write_text(stage_sha + "\n")
    return b


def _source(home, bundle, store):
    home.mkdir(exist_ok=True)
    script = (f'source "{bundle}/device_env.sh" "{bundle}" "{store}" || exit 7; '
              'echo "PYTHONPATH=$PYTHONPATH"; '
              'echo "SKIP=${PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK:-}"')
    env = {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)


def _manifest_sha(store):
    return hashlib.sha256((store / "MANIFEST.json").read_bytes()).hexdigest()[:16]


@pytest.fixture
def stores(tmp_path):
    old = _stage(tmp_path, "old", {"sglang/__init__.py": b"# 0.5.16\n"})
    new = _stage(tmp_path, "new", {"sglang/__init__.py": b"# 0.5.23\n",
                                   "torch/__init__.py": b"# staged torch\n"})
    return old, new


def test_pinned_bundle_refuses_another_builds_store(tmp_path, stores):
    old, new = stores
    b = _bundle(tmp_path, "pinned", stage_sha=_manifest_sha(new))
    r = _source(tmp_path / "home-a", b, old)
    assert r.returncode == 7
    assert "holds the parts of another build" in r.stderr and "SGLang 0.5.23" in r.stderr
    assert not (tmp_path / "home-a" / "big" / ".stamp").exists()        # nothing assembled


def test_pinned_bundle_takes_its_own_store_and_skips_the_cudnn_check(tmp_path, stores):
    _, new = stores
    b = _bundle(tmp_path, "pinned", stage_sha=_manifest_sha(new))
    home = tmp_path / "home-b"
    r = _source(home, b, new)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2:] == [f"PYTHONPATH={home}/site", "SKIP=1"]
    assert (home / "site" / "torch" / "__init__.py").read_bytes() == b"# staged torch\n"
    assert (home / "site" / "fastverify" / "__init__.py").exists()       # the overlay on top


def test_unpinned_bundle_takes_any_store_and_keeps_the_check(tmp_path, stores):
    old, _ = stores
    b = _bundle(tmp_path, "plain")
    home = tmp_path / "home-c"
    r = _source(home, b, old)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2:] == [f"PYTHONPATH={home}/site", "SKIP="]
    assert (home / "site" / "sglang" / "__init__.py").read_bytes() == b"# 0.5.16\n"


def test_the_cute_dsl_folder_joins_the_path_where_the_tree_has_it(tmp_path):
    # its own .pth would name the folder, but a tree on PYTHONPATH runs none
    dsl = _stage(tmp_path, "dsl", {"sglang/__init__.py": b"# 0.5.23\n",
                                   "nvidia_cutlass_dsl/dsl_packages/cutlass/__init__.py": b"",
                                   "nvidia_cutlass_dsl_packages.pth": b"import sys\n"})
    b = _bundle(tmp_path, "dsl", stage_sha=_manifest_sha(dsl))
    home = tmp_path / "home-d"
    r = _source(home, b, dsl)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2] == (
        f"PYTHONPATH={home}/site:{home}/site/nvidia_cutlass_dsl/dsl_packages")
