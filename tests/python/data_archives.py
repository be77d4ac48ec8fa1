"""Test inputs of tests/data.rs, made with Pillow, zipfile and tarfile.

  formats OUT             images of every accepted format in OUT/fmt/, and OUT/ref.json: what
                          Pillow decodes from each file (.convert("RGB"), hex bytes)
  archive KIND DIR OUT [TOP]
                          DIR (an image folder) as a zip/tar/targz archive OUT, its class
                          folders at the top or under the folder TOP
  bad CASE DIR OUT        the image folder DIR as an archive OUT plus one bad member (CASE)
"""
import io
import json
import os
import struct
import sys
import tarfile
import zipfile

import numpy as np
from PIL import Image


def formats(out):
    rng = np.random.default_rng(7)
    os.makedirs(os.path.join(out, "fmt"), exist_ok=True)
    w, h = 23, 17
    # Smooth gradient plus noise: exercises every byte value path without being flat.
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 11, yy * 15, (xx + yy) * 6], axis=-1)
    rgb = ((base + rng.integers(0, 40, size=base.shape)) % 256).astype(np.uint8)
    rgba = np.concatenate([rgb, rng.integers(0, 256, size=(h, w, 1)).astype(np.uint8)], -1)
    gray = rgb[:, :, 0].copy()
    # A larger, odd-sized photo-like image for lossy WebP (chroma upsampling at the edges).
    by, bx = np.mgrid[0:77, 0:101]
    big = np.stack([np.sin(bx / 7.0) * 100 + 128, by * 3.0, (bx + by) * 1.2], -1)
    big = np.clip(big + rng.normal(0, 12, size=big.shape), 0, 255).astype(np.uint8)
    cases = [
        ("rgb.bmp", Image.fromarray(rgb, "RGB"), {}),
        ("gray.bmp", Image.fromarray(gray, "L"), {}),
        ("rgb.tif", Image.fromarray(rgb, "RGB"), {}),
        ("rgb_lzw.tiff", Image.fromarray(rgb, "RGB"), {"compression": "tiff_lzw"}),
        ("rgb_deflate.tiff", Image.fromarray(rgb, "RGB"), {"compression": "tiff_adobe_deflate"}),
        ("gray.tif", Image.fromarray(gray, "L"), {}),
        ("rgba.tif", Image.fromarray(rgba, "RGBA"), {}),
        ("lossless.webp", Image.fromarray(rgb, "RGB"), {"lossless": True}),
        ("lossless_rgba.webp", Image.fromarray(rgba, "RGBA"), {"lossless": True}),
        ("lossy.webp", Image.fromarray(rgb, "RGB"), {"quality": 80}),
        ("lossy_q30_odd.webp", Image.fromarray(big, "RGB"), {"quality": 30}),
        ("rgb.ppm", Image.fromarray(rgb, "RGB"), {}),
        ("gray.pgm", Image.fromarray(gray, "L"), {}),
        ("rgb.png", Image.fromarray(rgb, "RGB"), {}),
    ]
    ref = {}
    for name, img, kw in cases:
        path = os.path.join(out, "fmt", name)
        img.save(path, **kw)
        with Image.open(path) as back:
            arr = np.asarray(back.convert("RGB"))
        ref[name] = {"w": arr.shape[1], "h": arr.shape[0], "rgb": arr.tobytes().hex()}
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump(ref, f)


def members(folder):
    """(relative path, bytes) of every file under folder, sorted."""
    out = []
    for root, _, files in os.walk(folder):
        for name in files:
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                out.append((os.path.relpath(p, folder), f.read()))
    return sorted(out)


def write(kind, out, items, extra=()):
    """items: (name, bytes) regular files; extra: callables adding members (zip or tar)."""
    if kind == "zip":
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in items:
                z.writestr(name, data)
            for add in extra:
                add(z)
    else:
        with tarfile.open(out, "w:gz" if kind == "targz" else "w") as t:
            for name, data in items:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
            for add in extra:
                add(t)


def archive(kind, folder, out, top=None):
    items = [((top + "/" if top else "") + name, data) for name, data in members(folder)]
    write(kind, out, items)


def patch_zip_size(path, member, size):
    """Sets the declared uncompressed size of member in its local and central headers."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(member)
        offset = info.header_offset
    b = bytearray(open(path, "rb").read())
    assert b[offset : offset + 4] == b"PK\x03\x04"
    b[offset + 22 : offset + 26] = struct.pack("<I", size)
    i = b.find(b"PK\x01\x02")
    while i >= 0:
        n, m, k = struct.unpack("<HHH", b[i + 28 : i + 34])
        if b[i + 46 : i + 46 + n].decode() == member:
            b[i + 24 : i + 28] = struct.pack("<I", size)
            break
        i = b.find(b"PK\x01\x02", i + 46 + n + m + k)
    else:
        raise SystemExit("member not in the central directory")
    open(path, "wb").write(bytes(b))


def tar_member(name, data=b"", **attrs):
    def add(t):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        for k, v in attrs.items():
            setattr(info, k, v)
        t.addfile(info, io.BytesIO(data) if data else None)

    return add


def zip_member(name, data, external=None):
    def add(z):
        info = zipfile.ZipInfo(name)
        info.compress_type = zipfile.ZIP_DEFLATED
        if external is not None:
            info.create_system = 3
            info.external_attr = external << 16
        z.writestr(info, data)

    return add


def bad(case, folder, out):
    items = members(folder)
    zeros = bytes(3_000_000)
    if case == "zip_dotdot":
        write("zip", out, items, [zip_member("../evil.png", b"x")])
    elif case == "zip_absolute":
        write("zip", out, items, [zip_member("/tmp/evil.png", b"x")])
    elif case == "zip_symlink":
        write("zip", out, items, [zip_member("0/link.png", b"/etc/passwd", 0o120777)])
    elif case == "tar_dotdot":
        write("tar", out, items, [tar_member("0/../../evil.png", b"x")])
    elif case == "tar_absolute":
        write("tar", out, items, [tar_member("/tmp/evil.png", b"x")])
    elif case == "tar_symlink":
        write("tar", out, items, [tar_member("0/link.png", type=tarfile.SYMTYPE, linkname="/etc/passwd")])
    elif case == "tar_hardlink":
        write("tar", out, items, [tar_member("0/hard.png", type=tarfile.LNKTYPE, linkname="/etc/passwd")])
    elif case in ("zip_declares_huge", "zip_declares_small"):
        write("zip", out, items, [zip_member("0/zeros.png", bytes(100_000))])
        patch_zip_size(out, "0/zeros.png", 0xFFFFFF00 if case == "zip_declares_huge" else 10)
    elif case == "zip_big":
        write("zip", out, items, [zip_member("0/zeros.png", zeros)])
    elif case == "targz_big":
        write("targz", out, items, [tar_member("0/zeros.png", zeros)])
    elif case == "zip_flat":
        write("zip", out, [(n.replace("/", "_"), d) for n, d in items])
    elif case == "not_zip":
        open(out, "wb").write(np.random.default_rng(3).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    else:
        raise SystemExit(f"unknown case {case}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"formats": formats, "archive": archive, "bad": bad}[cmd](*args)
