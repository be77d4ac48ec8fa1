"""Inputs and the Python side of tests/pack.rs (`tchrun data pack`).

  make OUT              a tiny image folder OUT/<class>/<image>: 3 classes x 12 images, 40x36
                        px, JPEG (.jpg and .JPEG) and PNG
  read PACK OUT.json    the shards of PACK read with the `webdataset` package: per sample in
                        order, its key, its members' extensions, the image member's extension and
                        SHA-256, and the class (`cls` as webdataset decodes it)
"""
import glob
import hashlib
import json
import os
import sys

import numpy as np
from PIL import Image


def make(out):
    rng = np.random.default_rng(3)
    exts = ["jpg", "JPEG", "png"]
    for c, cls in enumerate(["cat", "dog", "emu"]):
        os.makedirs(os.path.join(out, cls), exist_ok=True)
        for i in range(12):
            yy, xx = np.mgrid[0:36, 0:40]
            base = np.stack([xx * (3 + c), yy * 5, (xx + yy) * (2 + i % 3)], -1)
            rgb = ((base + rng.integers(0, 60, size=base.shape)) % 256).astype(np.uint8)
            ext = exts[i % 3]
            img = Image.fromarray(rgb, "RGB")
            path = os.path.join(out, cls, f"img_{i}.v1.{ext}")
            if ext == "png":
                img.save(path, format="PNG")
            else:
                img.save(path, format="JPEG", quality=90)


def read(pack, out):
    import webdataset as wds

    shards = sorted(glob.glob(os.path.join(pack, "shard-*.tar")))
    ds = wds.WebDataset(shards, shardshuffle=False, empty_check=False)
    rows = []
    for s in ds:
        exts = sorted(k for k in s if not k.startswith("__"))
        image = [k for k in exts if k != "cls"]
        assert len(image) == 1, exts
        rows.append(
            {
                "key": s["__key__"],
                "shard": os.path.basename(s["__url__"]),
                "exts": exts,
                "ext": image[0],
                "sha256": hashlib.sha256(s[image[0]]).hexdigest(),
                # webdataset's default decoder for .cls: int(text)
                "cls": wds.autodecode.basichandlers("cls", s["cls"]),
            }
        )
    with open(out, "w") as f:
        json.dump(rows, f)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"make": make, "read": read}[cmd](*args)
