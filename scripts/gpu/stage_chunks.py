#!/usr/bin/env python3
"""Move files larger than one transfer to an offline machine in several transfers, with checksums.

  split    --out STAGE --max-mib 60 FILE...
           STAGE/chunk-01/, chunk-02/, ... each one part (<= max-mib) of the files laid end to end,
           plus MANIFEST.json (every file's name, size, sha256; every part's sha256) in each chunk
           folder
  receive  CHUNK_DIR STORE
           on the target: copy one arrived chunk into STORE (outside the work tree, so it survives
           the next transfer) and check its part's sha256
  assemble STORE OUT_DIR
           once all parts are in STORE: rebuild every file into OUT_DIR and check its sha256; exits
           1 naming what is missing or wrong
  status   STORE
           which parts are there

Standard library only (the target has only Python). A chunk folder carries one transfer; send
chunk-01 first, then the others while the machine is still up (see docs/gpu-staging.md). Re-running
split with unchanged inputs rewrites nothing, so the chunks keep their checksums.
"""
import argparse
import hashlib
import json
import os
import shutil
import sys

MANIFEST = "MANIFEST.json"
BLOCK = 1 << 22


def sha256_file(path, start=0, length=None):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = os.path.getsize(path) - start if length is None else length
        while left > 0:
            b = f.read(min(BLOCK, left))
            if not b:
                break
            h.update(b)
            left -= len(b)
    return h.hexdigest()


def plan(files, max_bytes):
    """Lay the files end to end and cut every max_bytes. Returns (file entries, parts); a part is a
    list of (file index, offset, length) pieces."""
    entries = [{"name": os.path.basename(p), "size": os.path.getsize(p)} for p in files]
    names = [e["name"] for e in entries]
    if len(set(names)) != len(names):
        raise SystemExit(f"error: file names must be distinct: {names}")
    parts, cur, room = [], [], max_bytes
    for i, e in enumerate(entries):
        off = 0
        while off < e["size"]:
            n = min(room, e["size"] - off)
            cur.append((i, off, n))
            off += n
            room -= n
            if room == 0:
                parts.append(cur)
                cur, room = [], max_bytes
    if cur:
        parts.append(cur)
    return entries, parts


def _piece_blocks(files, pieces):
    """The bytes of a part, in blocks: each piece is (file index, offset, length)."""
    for i, off, n in pieces:
        with open(files[i], "rb") as f:
            f.seek(off)
            left = n
            while left:
                b = f.read(min(BLOCK, left))
                yield b
                left -= len(b)


def cmd_split(a):
    if a.max_mib <= 0:
        raise SystemExit(f"error: --max-mib must be > 0, got {a.max_mib}")
    for p in a.files:
        if not os.path.isfile(p):
            raise SystemExit(f"error: no such file: {p}")
    entries, parts = plan(a.files, int(a.max_mib * 2**20))
    for e, p in zip(entries, a.files):
        e["sha256"] = sha256_file(p)
    manifest = {"files": entries, "parts": []}
    os.makedirs(a.out, exist_ok=True)
    for k, pieces in enumerate(parts, 1):
        h = hashlib.sha256()
        for b in _piece_blocks(a.files, pieces):
            h.update(b)
        manifest["parts"].append({"index": k, "file": f"part-{k:02d}.bin", "sha256": h.hexdigest(),
                                  "pieces": [[entries[i]["name"], off, n] for i, off, n in pieces]})
    # one folder per transfer; skip rewriting a part whose checksum is already right
    keep = {f"chunk-{k:02d}" for k in range(1, len(parts) + 1)}
    for d in os.listdir(a.out):
        if d.startswith("chunk-") and d not in keep:
            shutil.rmtree(os.path.join(a.out, d))
    for part, pieces in zip(manifest["parts"], parts):
        d = os.path.join(a.out, f"chunk-{part['index']:02d}")
        os.makedirs(d, exist_ok=True)
        dst = os.path.join(d, part["file"])
        if not (os.path.isfile(dst) and sha256_file(dst) == part["sha256"]):
            with open(dst + ".tmp", "wb") as out:
                for b in _piece_blocks(a.files, pieces):
                    out.write(b)
            os.replace(dst + ".tmp", dst)
        with open(os.path.join(d, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
        print(f"{d}: {os.path.getsize(dst) / 2**20:.1f} MiB")
    return 0


def read_manifest(d):
    p = os.path.join(d, MANIFEST)
    if not os.path.isfile(p):
        raise SystemExit(f"error: {p} is missing")
    with open(p) as f:
        return json.load(f)


def cmd_receive(a):
    m = read_manifest(a.chunk_dir)
    os.makedirs(a.store, exist_ok=True)
    got = 0
    for part in m["parts"]:
        src = os.path.join(a.chunk_dir, part["file"])
        if not os.path.isfile(src):
            continue
        if sha256_file(src) != part["sha256"]:
            raise SystemExit(f"error: {src} is damaged (sha256 differs from the manifest)")
        shutil.copyfile(src, os.path.join(a.store, part["file"]))
        got += 1
        print(f"received {part['file']} ({os.path.getsize(src) / 2**20:.1f} MiB)")
    if not got:
        raise SystemExit(f"error: no part file in {a.chunk_dir}")
    shutil.copyfile(os.path.join(a.chunk_dir, MANIFEST), os.path.join(a.store, MANIFEST))
    return cmd_status(argparse.Namespace(store=a.store))


def missing_parts(store, m):
    out = []
    for part in m["parts"]:
        p = os.path.join(store, part["file"])
        if not os.path.isfile(p) or os.path.getsize(p) != sum(n for _, _, n in part["pieces"]):
            out.append(part["file"])
    return out


def cmd_status(a):
    m = read_manifest(a.store)
    miss = missing_parts(a.store, m)
    print(f"{a.store}: {len(m['parts']) - len(miss)}/{len(m['parts'])} parts" +
          (f"; missing {', '.join(miss)}" if miss else "; complete"))
    return 0


def cmd_assemble(a):
    m = read_manifest(a.store)
    miss = missing_parts(a.store, m)
    if miss:
        raise SystemExit(f"error: parts missing in {a.store}: {', '.join(miss)}")
    for part in m["parts"]:
        if sha256_file(os.path.join(a.store, part["file"])) != part["sha256"]:
            raise SystemExit(f"error: {part['file']} is damaged (sha256 differs from the manifest)")
    os.makedirs(a.out_dir, exist_ok=True)
    handles = {}
    try:
        for e in m["files"]:
            handles[e["name"]] = open(os.path.join(a.out_dir, e["name"] + ".tmp"), "wb")
        for part in m["parts"]:
            with open(os.path.join(a.store, part["file"]), "rb") as f:
                for name, off, n in part["pieces"]:
                    out = handles[name]
                    out.seek(off)
                    out.write(f.read(n))
    finally:
        for h in handles.values():
            h.close()
    for e in m["files"]:
        tmp = os.path.join(a.out_dir, e["name"] + ".tmp")
        if os.path.getsize(tmp) != e["size"] or sha256_file(tmp) != e["sha256"]:
            raise SystemExit(f"error: rebuilt {e['name']} does not match its manifest checksum")
        os.replace(tmp, os.path.join(a.out_dir, e["name"]))
        print(f"assembled {e['name']} ({e['size'] / 2**20:.1f} MiB, sha256 ok)")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("--out", required=True)
    s.add_argument("--max-mib", type=float, default=60)
    s.add_argument("files", nargs="+")
    s.set_defaults(func=cmd_split)
    r = sub.add_parser("receive")
    r.add_argument("chunk_dir")
    r.add_argument("store")
    r.set_defaults(func=cmd_receive)
    b = sub.add_parser("assemble")
    b.add_argument("store")
    b.add_argument("out_dir")
    b.set_defaults(func=cmd_assemble)
    t = sub.add_parser("status")
    t.add_argument("store")
    t.set_defaults(func=cmd_status)
    a = ap.parse_args(argv)
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
