#!/usr/bin/env python3
"""Builds a small real image directory (ImageFolder layout, train/valid split) from
scikit-learn's bundled handwritten digits (1797 8x8 images, 10 classes): no download.

    scripts/make_digits.py OUT [--size 32] [--valid-fraction 0.2] [--format png|jpg] [--repeat 1]

OUT/train/<digit>/<n>.png and OUT/valid/<digit>/<n>.png. Deterministic (fixed split seed).
Without scikit-learn (a GPU machine's Python), it reads the same data from a `digits.csv.gz`
beside this script (scripts/gpu-kit.sh puts scikit-learn's copy there).
--repeat N writes N jittered copies of every training image (a larger set for benchmarks).
"""
import argparse
import os
import sys

import numpy as np
from PIL import Image


def load_digits():
    """(images 8x8 in 0..16, labels): scikit-learn's digits, or its CSV beside this script."""
    try:
        from sklearn.datasets import load_digits as sk_load
    except ImportError:
        csv = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.csv.gz")
        if not os.path.isfile(csv):
            raise SystemExit("make_digits.py: needs scikit-learn, or its digits.csv.gz beside this script")
        data = np.loadtxt(csv, delimiter=",")
        return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    d = sk_load()
    return d.images, d.target


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--size", type=int, default=32, help="side of the written images in pixels")
    ap.add_argument("--valid-fraction", type=float, default=0.2)
    ap.add_argument("--format", choices=["png", "jpg"], default="png")
    ap.add_argument("--repeat", type=int, default=1, help="copies of each training image (shifted)")
    ap.add_argument("--rgb", action="store_true", help="write RGB instead of grayscale")
    args = ap.parse_args()

    images, labels = load_digits()
    rng = np.random.default_rng(12345)
    order = rng.permutation(len(labels))
    n_valid = int(round(len(labels) * args.valid_fraction))
    valid_idx, train_idx = set(order[:n_valid].tolist()), order[n_valid:]
    counts = {"train": 0, "valid": 0}
    for split in ("train", "valid"):
        for c in range(10):
            os.makedirs(os.path.join(args.out, split, str(c)), exist_ok=True)

    def write(split: str, i: int, copy: int, shift: tuple) -> None:
        arr = (images[i] / 16.0 * 255.0).clip(0, 255).astype(np.uint8)
        if shift != (0, 0):
            arr = np.roll(arr, shift, axis=(0, 1))
        img = Image.fromarray(arr, mode="L").resize((args.size, args.size), Image.BILINEAR)
        if args.rgb or args.format == "jpg":
            img = img.convert("RGB")
        name = f"{i:04d}" if copy == 0 else f"{i:04d}_{copy}"
        path = os.path.join(args.out, split, str(labels[i]), f"{name}.{args.format}")
        img.save(path, quality=90) if args.format == "jpg" else img.save(path)
        counts[split] += 1

    for i in sorted(valid_idx):
        write("valid", i, 0, (0, 0))
    for i in sorted(train_idx.tolist()):
        for copy in range(args.repeat):
            shift = (0, 0) if copy == 0 else (int(rng.integers(-1, 2)), int(rng.integers(-1, 2)))
            write("train", i, copy, shift)
    print(f"digits: {counts['train']} train and {counts['valid']} valid images "
          f"({args.size}x{args.size} {args.format}) in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
