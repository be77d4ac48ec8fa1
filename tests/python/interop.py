#!/usr/bin/env python3
"""Interoperability check: a tchrun model directory loads into torchvision's model of the same
architecture with load_state_dict(strict=True), and its top-1 predictions on IMAGES equal the
ones `tchrun score` wrote to SCORES_CSV.

    interop.py MODEL_DIR IMAGES_DIR SCORES_CSV

Preprocessing is torchvision's eval transform (Resize(round(size*256/224)) + CenterCrop(size) +
Normalize), the same as tchrun's. Prints the agreement; exits 1 on any difference but a near tie:
the two decoders resize with different arithmetic (probabilities differ by up to ~5e-3), so an
image whose two best classes torchvision puts within NEAR_TIE of each other may go to the other
one of the two in tchrun; that is printed, and any other difference fails.
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

NEAR_TIE = 0.02


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
    ties = []
    with torch.no_grad():
        for i in range(0, len(rows), 64):
            chunk = rows[i:i + 64]
            x = torch.stack([tf(Image.open(os.path.join(images, r["file"])).convert("RGB")) for r in chunk])
            probs = model(x).softmax(-1)
            top_p, top_i = probs.topk(2, -1)
            for r, ps, ids in zip(chunk, top_p.tolist(), top_i.tolist()):
                if classes[ids[0]] == r["predicted_class"]:
                    agree += 1
                    max_prob_diff = max(max_prob_diff, abs(ps[0] - float(r["probability"])))
                elif classes[ids[1]] == r["predicted_class"] and ps[0] - ps[1] < NEAR_TIE:
                    ties.append((r["file"], classes[ids[0]], r["predicted_class"], round(ps[0] - ps[1], 5)))
                else:
                    mismatches.append((r["file"], classes[ids[0]], r["predicted_class"]))
    # A near tie counts as agreeing (and is listed): the two sides' inputs differ in rounding.
    print(f"interop: strict load ok; top-1 agreement {agree + len(ties)}/{len(rows)} "
          f"({len(ties)} near tie(s)); max probability difference {max_prob_diff:.2e}")
    for t in ties[:10]:
        print("  near tie (torchvision's two best within %g):" % NEAR_TIE, t)
    for m in mismatches[:10]:
        print("  differs:", m)
    return 0 if not mismatches else 1


if __name__ == "__main__":
    sys.exit(main())
