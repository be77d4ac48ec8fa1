"""torchvision 0.26's values for tchrun's designer-transform parity tests (tests/transforms.rs),
as JSON on stdout, from one interpreter start. Images are uint8 tensors 3 x H x W, written as hex
strings of their H x W x 3 (row-major, interleaved) bytes, the layout of tchrun's loader.

`ops`: each transform's own `transform(image, params)` at given parameters (what its
`make_params` would have drawn): RandomVerticalFlip, RandomRotation, RandomAffine,
RandomPerspective (with the coefficients torchvision solves from the end points), ColorJitter
(an order and factors), the hue alone, RandomGrayscale, Pad in every mode and RandomCrop's pad and
crop; nearest and bilinear for the geometric ones.
`samples`: N draws of each transform's `make_params` (and the coin of the random-apply ones) on
a 3 x 24 x 32 image: what each draws.
`folder` (with a folder argument): a small labeled folder of PNGs written there (`in/`), and
what `tchrun data transform` must write from it (`want/`, PNG): Pad(3, "edge") +
RandomVerticalFlip(1) + RandomGrayscale(1) for training, Pad(3, "edge") + RandomGrayscale(1)
for inference (the random ones left out).
"""
import json
import sys

import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.functional import _get_perspective_coeffs

NEAREST, BILINEAR = InterpolationMode.NEAREST, InterpolationMode.BILINEAR


def hexed(img):
    return img.permute(1, 2, 0).contiguous().numpy().tobytes().hex()


def images():
    g = torch.Generator().manual_seed(11)
    return [
        torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8, generator=g),
        torch.randint(0, 256, (3, 13, 18), dtype=torch.uint8, generator=g),
    ]


def case(kind, img, out, **kw):
    return dict(kind=kind, h=img.shape[-2], w=img.shape[-1], image=hexed(img), out=hexed(out), **kw)


def corners(h, w):
    return [[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]]


def ops():
    cases = []
    for img in images():
        h, w = img.shape[-2:]
        cases.append(case("vflip", img, v2.RandomVerticalFlip(1.0).transform(img, {})))
        cases.append(case("grayscale", img, v2.RandomGrayscale(1.0).transform(img, {"num_input_channels": 3})))
        for mode in [NEAREST, BILINEAR]:
            for angle in [-30.5, 12.25, 45.0, 90.0, 180.0, -90.0, 170.3, 0.0]:
                t = v2.RandomRotation(30, interpolation=mode)
                out = t.transform(img, {"angle": angle})
                cases.append(case("rotation", img, out, interpolation=mode.value, angle=angle))
            for angle, tx, ty, scale, shear in [(0.0, 2, -1, 1.0, 0.0), (10.5, 0, 0, 1.0, 0.0),
                                                (-7.25, 1, 2, 0.85, 0.0), (0.0, 0, 0, 1.2, 4.5),
                                                (20.0, -3, 1, 0.9, -6.0), (3.0, 0, 0, 1.1, 12.0)]:
                t = v2.RandomAffine(0, interpolation=mode)
                out = t.transform(img, dict(angle=angle, translate=(tx, ty), scale=scale, shear=(shear, 0.0)))
                cases.append(case("affine", img, out, interpolation=mode.value, angle=angle,
                                  translate=[tx, ty], scale=scale, shear=shear))
            for end in [[[1, 2], [w - 2, 0], [w - 1, h - 3], [2, h - 1]],
                        [[3, 3], [w - 4, 2], [w - 2, h - 2], [0, h - 4]],
                        [[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]],
                        [[4, 1], [w - 1, 4], [w - 5, h - 1], [1, h - 5]]]:
                coeffs = _get_perspective_coeffs(corners(h, w), end)
                t = v2.RandomPerspective(interpolation=mode)
                out = t.transform(img, {"coefficients": coeffs})
                cases.append(case("perspective", img, out, interpolation=mode.value, end=end,
                                  coefficients=coeffs))
        for order, factors in [([0, 1, 2, 3], [1.3, 0.7, 1.4, 0.05]), ([3, 2, 1, 0], [0.6, 1.5, 0.2, -0.1]),
                               ([2, 0, 3, 1], [1.0, 1.0, 0.0, 0.5]), ([1, 3, 0, 2], [None, 0.8, None, -0.45]),
                               ([0, 2, 1, 3], [0.9, None, 1.2, None])]:
            t = v2.ColorJitter(brightness=0.5, contrast=0.5, saturation=0.5, hue=0.5)
            b, c, s, hu = factors
            out = t.transform(img, dict(fn_idx=torch.tensor(order), brightness_factor=b, contrast_factor=c,
                                        saturation_factor=s, hue_factor=hu))
            cases.append(case("jitter", img, out, order=order, factors=factors))
        for hue in [-0.5, -0.31, -0.02, 0.0, 0.07, 0.25, 0.5]:
            out = v2.functional.adjust_hue(img, hue)
            cases.append(case("hue", img, out, hue=hue))
        for mode in ["constant", "edge", "reflect", "symmetric"]:
            for n in [1, 5]:
                out = v2.Pad(n, padding_mode=mode)(img)
                cases.append(case("pad", img, out, mode=mode, pixels=n, oh=out.shape[-2], ow=out.shape[-1]))
            for n, size in [(0, 12), (2, 16), (3, 20)]:
                t = v2.RandomCrop(size, padding=n or None, pad_if_needed=True, padding_mode=mode)
                p = t.make_params([img])
                out = t.transform(img, p)
                cases.append(case("crop", img, out, mode=mode, pixels=n, size=size, padding=p["padding"],
                                  top=p["top"], left=p["left"]))
    return cases


class Recorder:
    """Mixed into a transform: its params recorded, the image returned as is."""

    def transform(self, inpt, params):
        self.seen.append(params)
        return inpt


def recorded(base, *args, **kw):
    t = type("Rec" + base.__name__, (Recorder, base), {})(*args, **kw)
    t.seen = []
    return t


def samples(n):
    torch.manual_seed(4)
    img = torch.zeros((3, 24, 32), dtype=torch.uint8)
    out = {}
    t = recorded(v2.RandomRotation, 30)
    for _ in range(n):
        t(img)
    out["rotation"] = [p["angle"] for p in t.seen]
    t = recorded(v2.RandomAffine, 10, translate=(0.1, 0.1), scale=(0.9, 1.1), shear=5)
    for _ in range(n):
        t(img)
    out["affine"] = [[p["angle"], p["translate"][0], p["translate"][1], p["scale"], p["shear"][0]] for p in t.seen]
    t = recorded(v2.RandomPerspective, 0.5, p=0.5)
    for _ in range(n):
        t(img)
    out["perspective"] = [p["coefficients"] for p in t.seen]
    t = recorded(v2.ColorJitter, 0.4, 0.3, 0.2, 0.1)
    for _ in range(n):
        t(img)
    out["jitter"] = [[p["fn_idx"].tolist(), p["brightness_factor"], p["contrast_factor"],
                      p["saturation_factor"], p["hue_factor"]] for p in t.seen]
    for name, cls, p in [("vflip", v2.RandomVerticalFlip, 0.3), ("grayscale", v2.RandomGrayscale, 0.2)]:
        t = recorded(cls, p)
        for _ in range(n):
            t(img)
        out[name] = len(t.seen)
    t = recorded(v2.RandomCrop, 16, padding=2, pad_if_needed=True)
    small = torch.zeros((3, 13, 18), dtype=torch.uint8)
    for _ in range(n):
        t(small)
    out["crop"] = [[p["top"], p["left"]] for p in t.seen]
    return out


def folder(root):
    import os
    from PIL import Image
    g = torch.Generator().manual_seed(13)
    pipelines = {
        "train": v2.Compose([v2.Pad(3, padding_mode="edge"), v2.RandomVerticalFlip(1.0), v2.RandomGrayscale(1.0)]),
        "inference": v2.Compose([v2.Pad(3, padding_mode="edge"), v2.RandomGrayscale(1.0)]),
    }
    for k, (cls, name, h, w) in enumerate([("a", "x1.png", 12, 17), ("a", "x2.png", 9, 9), ("b", "y1.png", 16, 11),
                                           ("b/nested", "z.png", 10, 14)]):
        img = torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)
        for side, t in [("in", None)] + list(pipelines.items()):
            out = img if t is None else t(img)
            d = os.path.join(root, side if t is None else "want-" + side, cls)
            os.makedirs(d, exist_ok=True)
            Image.fromarray(out.permute(1, 2, 0).contiguous().numpy()).save(os.path.join(d, name))


if __name__ == "__main__":
    import warnings
    warnings.simplefilter("ignore")
    if len(sys.argv) > 2:
        folder(sys.argv[2])
    print(json.dumps({"ops": ops(), "samples": samples(int(sys.argv[1]))}))
