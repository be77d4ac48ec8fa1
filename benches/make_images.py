#!/usr/bin/env python3
"""Generates a textured RGB JPEG ImageFolder dataset for benchmarks (no download).

    benches/make_images.py OUT --train N --valid M [--classes 10] [--size 256] [--jobs 2]

OUT/train/<class>/<n>.jpg and OUT/valid/<class>/<n>.jpg. Each image is a smooth random field
plus fine noise with a class-dependent tint (so it is learnable), sides drawn around --size with
aspect ratios 3:4..4:3 (like photos), quality 90: the JPEGs carry real entropy-coded detail,
so decoding costs what a photo of that size costs. Deterministic (seeded per image).
Existing files are kept (re-running is cheap).
"""
import argparse
import os
import sys
from multiprocessing import Pool

import numpy as np
from PIL import Image


def one(job):
    path, cls, classes, seed, size = job
    if os.path.exists(path):
        return
    rng = np.random.default_rng(seed)
    ar = rng.uniform(0.75, 4.0 / 3.0)
    w = int(round(size * rng.uniform(0.9, 1.25) * ar ** 0.5))
    h = int(round(size * rng.uniform(0.9, 1.25) / ar ** 0.5))
    coarse = rng.uniform(0, 255, size=(8, 8, 3)).astype(np.uint8)
    base = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), dtype=np.float32)
    hue = np.array([np.cos(2 * np.pi * (cls / classes + k / 3)) for k in range(3)], np.float32)
    img = 0.6 * base + 60.0 * hue + rng.normal(0, 18, size=(h, w, 3)).astype(np.float32) + 40
    Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(path, quality=90)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--train", type=int, required=True, help="training images in total")
    ap.add_argument("--valid", type=int, required=True, help="validation images in total")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--size", type=int, default=256, help="typical side in pixels")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    jobs = []
    for split, n, salt in (("train", args.train, 0), ("valid", args.valid, 1 << 40)):
        for c in range(args.classes):
            os.makedirs(os.path.join(args.out, split, f"c{c:02d}"), exist_ok=True)
        for i in range(n):
            c = i % args.classes
            path = os.path.join(args.out, split, f"c{c:02d}", f"{i:06d}.jpg")
            jobs.append((path, c, args.classes, salt + i, args.size))
    with Pool(max(args.jobs, 1)) as p:
        p.map(one, jobs, chunksize=64)
    print(f"{args.train} train and {args.valid} valid JPEGs (~{args.size}px) in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
