#!/usr/bin/env python3
"""Interoperability check: a tchrun model directory loads into torchvision's model of the same
architecture with load_state_dict(strict=True), and its top-1 predictions on IMAGES equal the
ones `tchrun score` wrote to SCORES_CSV.

    interop.py MODEL_DIR IMAGES_DIR SCORES_CSV

Preprocessing is torchvision's eval transform (Resize(round(size*256/224)) + CenterCrop(size) +
Normalize), the same as tchrun's. Prints the agreement; exits 1 on any difference.
"""
import csv
import json
import os
import sys

import torch
import torchvision
from PIL import Image
from safetensors.torch import load_file
from torchvision import transforms


def main() -> int:
    model_dir, images, scores = sys.argv[1:4]
    cfg = json.load(open(os.path.join(model_dir, "model.json")))
    classes = cfg["class_names"]
    model = getattr(torchvision.models, cfg["arch"])(num_classes=len(classes))
    state = load_file(os.path.join(model_dir, "model.safetensors"))
    model.load_state_dict(state, strict=True)
    model.eval()
    size = cfg["input_size"]
    norm = cfg["normalization"]
    tf = transforms.Compose([
        transforms.Resize(round(size * 256 / 224)),
        transforms.CenterCrop(size),
        transforms.ToTensor(),
        transforms.Normalize(norm["mean"], norm["std"]),
    ])
    rows = list(csv.DictReader(open(scores, newline="")))
    assert rows, "no rows in " + scores
    agree = 0
    max_prob_diff = 0.0
    mismatches = []
    with torch.no_grad():
        for i in range(0, len(rows), 64):
            chunk = rows[i:i + 64]
            x = torch.stack([tf(Image.open(os.path.join(images, r["file"])).convert("RGB")) for r in chunk])
            probs = model(x).softmax(-1)
            p, idx = probs.max(-1)
            for r, pi, ii in zip(chunk, p.tolist(), idx.tolist()):
                if classes[ii] == r["predicted_class"]:
                    agree += 1
                    max_prob_diff = max(max_prob_diff, abs(pi - float(r["probability"])))
                else:
                    mismatches.append((r["file"], classes[ii], r["predicted_class"]))
    print(f"interop: strict load ok; top-1 agreement {agree}/{len(rows)}; max probability difference {max_prob_diff:.2e}")
    for m in mismatches[:10]:
        print("  differs:", m)
    return 0 if not mismatches else 1


if __name__ == "__main__":
    sys.exit(main())
