#!/usr/bin/env python3
"""Write a copy of a wheel without the members under the given path prefixes.

    repack_wheel.py IN.whl OUT_DIR PREFIX [PREFIX ...]

The copy keeps the file name (so pip still sees the same distribution and version) and its
.dist-info/RECORD loses the lines of the dropped members, so `pip install` accepts it. Used to drop
payload an offline H200 server never loads (diffusion CLI, FA3 kernels, static libraries), which
keeps the carried bundle inside one transfer.
"""
import os
import sys
import zipfile


def repack(src: str, outdir: str, prefixes: tuple) -> tuple:
    """Return (dropped_bytes_uncompressed, out_path)."""
    if not prefixes:
        raise SystemExit("repack_wheel.py: give at least one path prefix to drop")
    dst = os.path.join(outdir, os.path.basename(src))
    tmp = dst + ".part"
    dropped = 0
    with zipfile.ZipFile(src) as zin, \
            zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info in zin.infolist():
            if info.filename.startswith(prefixes):
                dropped += info.file_size
                continue
            data = zin.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                keep = [ln for ln in data.decode().splitlines(True) if not ln.startswith(prefixes)]
                data = "".join(keep).encode()
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    os.replace(tmp, dst)
    return dropped, dst


def main(argv):
    if len(argv) < 4:
        raise SystemExit(__doc__)
    dropped, dst = repack(argv[1], argv[2], tuple(argv[3:]))
    print(f"{os.path.basename(dst)}: dropped {dropped / 2**20:.1f} MiB unpacked, "
          f"now {os.path.getsize(dst) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main(sys.argv)
