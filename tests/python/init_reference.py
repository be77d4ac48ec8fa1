"""Compares tchrun's from-scratch initialisation with torchvision's, tensor by tensor.

Usage: init_reference.py SIZE CLASSES DIR
DIR holds `<arch>.safetensors`: the tensors of tchrun's model built from scratch
(`worker/src/models/init.rs`'s test writes them). For each, torchvision builds the same
architecture (`torchvision.models.get_model(arch, num_classes=CLASSES)`, a ViT for SIZE) from a
fixed seed, and every tensor of its state_dict is compared with tchrun's of the same name:
- a constant tensor (every value equal: batch-norm weights, zero biases, running statistics,
  layer scales, ViT's zero head) must be that constant in tchrun too;
- any other is a sample of torchvision's law, and tchrun's must be a sample of the same law:
  the two-sample Kolmogorov-Smirnov test on the two tensors' values, whatever their size, with
  p >= P_MIN. The test needs no knowledge of the law (normal, uniform, truncated; its bounds
  and scale): a stem drawn with fan in instead of fan out (4.6x the std over 9 408 values) has
  p < 1e-300. P_MIN is per tensor: under equal laws p is uniform on [0, 1], so over the ~1 500
  tensors compared the chance of one false alarm is 1 500 * P_MIN = 0.15 % for any draw of
  the seeds, on any machine.
Prints one JSON object: per architecture the tensors compared, those that differ (name, what,
p) and the smallest p seen with its tensor. Exit 0 (the Rust test reads the JSON).
"""
import json
import pathlib
import sys

import numpy as np
import torch
import torchvision
from safetensors.numpy import load_file
from scipy.stats import ks_2samp

P_MIN = 1e-6


def torchvision_model(arch: str, size: int, classes: int) -> torch.nn.Module:
    kwargs = {"num_classes": classes}
    if arch.startswith("vit_"):
        kwargs["image_size"] = size
    return torchvision.models.get_model(arch, **kwargs)


def compare(arch: str, tchrun: dict, size: int, classes: int) -> dict:
    torch.manual_seed(0)
    # Not drawn: batch norm's step counter, and Swin's relative position index (a fixed
    # table of indices; tchrun computes it and adds it to the state_dict it writes).
    ref = {k: v.detach().double().numpy().ravel() for k, v in
           torchvision_model(arch, size, classes).state_dict().items()
           if not k.endswith(("num_batches_tracked", "relative_position_index"))}
    out = {"compared": 0, "differ": [], "missing": [], "extra": [], "min_p": [None, 1.0]}
    out["missing"] = sorted(set(ref) - set(tchrun))
    out["extra"] = sorted(k for k in set(tchrun) - set(ref) if not k.endswith("num_batches_tracked"))
    for name, want in ref.items():
        if name not in tchrun:
            continue
        got = tchrun[name].astype(np.float64).ravel()
        out["compared"] += 1
        if got.size != want.size:
            out["differ"].append([name, f"{got.size} values, torchvision {want.size}", 0.0])
            continue
        if np.all(want == want[0]):
            if not np.all(got == want[0]):
                out["differ"].append(
                    [name, f"torchvision's is the constant {want[0]}, tchrun's ranges "
                           f"{got.min()}..{got.max()}", 0.0])
            continue
        p = float(ks_2samp(got, want).pvalue)
        if p < out["min_p"][1]:
            out["min_p"] = [name, p]
        if p < P_MIN:
            out["differ"].append(
                [name, f"std {got.std():.6g} (torchvision {want.std():.6g}), max |x| "
                       f"{np.abs(got).max():.6g} (torchvision {np.abs(want).max():.6g})", p])
    return out


def main() -> None:
    size, classes, folder = int(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3])
    torch.set_num_threads(1)
    result = {}
    for f in sorted(folder.glob("*.safetensors")):
        result[f.stem] = compare(f.stem, load_file(str(f)), size, classes)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
