#!/usr/bin/env python3
"""torchvision counterpart of `tchrun-worker bench-loader`: the input pipeline alone.

    benches/reference/bench_loader.py --images DIR [--size 224] [--threads N] [--batch-size B]
        [--epochs K] [--eval] [--auto-augment ta_wide|ra|augmix|imagenet]

ImageFolder + RandomResizedCrop(size) + RandomHorizontalFlip + ToTensor + Normalize(ImageNet)
(or Resize + CenterCrop with --eval), DataLoader(num_workers=N, shuffle). --auto-augment puts
torchvision's v2 policy after the flip, as ClassificationPresetTrain (on the PIL crop, its
default backend; bilinear, its default interpolation) — the transform of
torchvision's classification reference. Prints one JSON line: images/s per epoch (epoch =
iterator creation, which starts the workers, to the last batch; like tchrun's loader, which
starts its threads per epoch).
"""
import argparse
import json
import sys
import time

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import transforms as T

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", required=True)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--eval", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--auto-augment", choices=["ta_wide", "ra", "augmix", "imagenet"])
    args = ap.parse_args()
    if args.eval:
        tf = [T.Resize(round(args.size * 256 / 224)), T.CenterCrop(args.size)]
    else:
        tf = [T.RandomResizedCrop(args.size), T.RandomHorizontalFlip()]
        if args.auto_augment:
            from torchvision.transforms import v2
            bil = v2.InterpolationMode.BILINEAR
            tf.append({
                "ta_wide": lambda: v2.TrivialAugmentWide(interpolation=bil),
                "ra": lambda: v2.RandAugment(interpolation=bil),
                "augmix": lambda: v2.AugMix(interpolation=bil),
                "imagenet": lambda: v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET, interpolation=bil),
            }[args.auto_augment]())
    tf = T.Compose(tf + [T.ToTensor(), T.Normalize(MEAN, STD)])
    t0 = time.time()
    ds = torchvision.datasets.ImageFolder(args.images, tf)
    scan_s = time.time() - t0
    torch.manual_seed(args.seed)
    dl = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.threads)
    per_epoch, checksum = [], 0.0
    for _ in range(args.epochs):
        t = time.time()
        n = 0
        for x, _y in dl:
            n += x.shape[0]
            checksum += float(x[0, 0, 0, 0])
        per_epoch.append(n / max(time.time() - t, 1e-9))
    print(json.dumps({"tool": "torchvision", "images": len(ds), "size": args.size,
                      "threads": args.threads, "batch_size": args.batch_size, "scan_s": scan_s,
                      "auto_augment": args.auto_augment,
                      "images_per_sec": per_epoch, "checksum": checksum}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
