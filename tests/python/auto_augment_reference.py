"""torchvision 0.26's values for tchrun's `--auto-augment` parity tests (tests/auto_augment.rs),
as JSON on stdout. Images are uint8 tensors 3 x H x W, written as hex strings of their H x W x 3
(row-major, interleaved) bytes, the layout of tchrun's loader.

`tables`: each policy's magnitude table per op (`_AUGMENTATION_SPACE[op][0](bins, h, w)`).
`ops`: each op of `_apply_image_or_video_transform` at given magnitudes on given images, with
nearest and bilinear interpolation for the geometric ops; for bilinear, `ties`: which samples'
unrounded values lie at a half level (where a few ulps decide the rounding).
`augmix`: `v2.AugMix` at fixed draws: its Dirichlet weights fixed (`_sample_dirichlet`
overridden), its chain depth fixed, the ops and magnitudes it drew recorded, and its output.
`samples N`: N forwards of each policy with the ops recorded (not applied): what each draws.
`all N`: all four as one object (one interpreter start for the tests).
"""
import json
import sys

import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import InterpolationMode

NEAREST, BILINEAR = InterpolationMode.NEAREST, InterpolationMode.BILINEAR
POLICIES = {
    "ta_wide": lambda: v2.TrivialAugmentWide(),
    "ra": lambda: v2.RandAugment(),
    "imagenet": lambda: v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET),
    "augmix": lambda: v2.AugMix(),
}
BINS = {"ta_wide": 31, "ra": 31, "imagenet": 10, "augmix": 10}


def hexed(img):
    return img.permute(1, 2, 0).contiguous().numpy().tobytes().hex()


def images():
    g = torch.Generator().manual_seed(5)
    out = [
        torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8, generator=g),
        torch.randint(0, 256, (3, 13, 18), dtype=torch.uint8, generator=g),
    ]
    # Low contrast, one flat channel: autocontrast's and equalize's edge cases.
    low = torch.randint(90, 110, (3, 12, 12), dtype=torch.uint8, generator=g)
    low[2] = 77
    out.append(low)
    return out


def tables():
    out = []
    for name, make in POLICIES.items():
        t = make()
        for h, w in [(16, 16), (13, 18), (224, 224), (176, 176)]:
            for op, (fn, signed) in t._AUGMENTATION_SPACE.items():
                m = fn(BINS[name], h, w)
                out.append({"policy": name, "op": op, "h": h, "w": w, "signed": signed,
                            "values": None if m is None else [float(v) for v in m]})
    return out


# How close to a half level a sample's unrounded value must be for another summation order to
# round it the other way: torch's float32 results differ by a few ulps between kernels (fused or
# separate multiply-adds, AVX2 or AVX-512), at most 255 x 2**-23 x a few, far below this.
TIE = 2.0 ** -12


def ties(t, img, op, v):
    """1 where the bilinear op's unrounded value (the same op on the float image: the same
    kernels, without the final rounding) lies within TIE of a half level, else 0."""
    fl = t._apply_image_or_video_transform(img.float(), op, v, interpolation=BILINEAR, fill=t._fill)
    return ((fl - fl.floor() - 0.5).abs() < TIE).to(torch.uint8)


def ops():
    t = v2.TrivialAugmentWide()
    wide = t._AUGMENTATION_SPACE
    cases = []
    for n, img in enumerate(images()):
        h, w = img.shape[-2:]
        for op, (fn, signed) in wide.items():
            if n == 2 and op not in ("AutoContrast", "Equalize", "Contrast", "Color", "Solarize"):
                continue
            m = fn(31, h, w)
            values = [0.0] if m is None else [float(v) for v in m]
            if op in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"):
                values = values[::3]  # every third bin, both signs, both modes
            if signed:
                values += [-v for v in values]
            if op in ("ShearX", "ShearY", "Rotate"):
                values += [0.3 * k / 9 for k in range(-9, 10, 3)]  # RandAugment's and AugMix's
            if op == "Rotate":
                values += [90.0, -90.0, 180.0, 270.0, 360.0, -180.0, 45.0]
            if op in ("TranslateX", "TranslateY"):
                values += [150.0 / 331.0 * w * k / 30 for k in (7, 9, 13)] + [-4.9, 4.9]
            modes = [NEAREST, BILINEAR] if op in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate") else [NEAREST]
            for mode in modes:
                for v in values:
                    out = t._apply_image_or_video_transform(img, op, v, interpolation=mode, fill=t._fill)
                    case = {"op": op, "magnitude": v, "interpolation": mode.value,
                            "h": h, "w": w, "image": hexed(img), "out": hexed(out)}
                    if mode == BILINEAR:
                        case["ties"] = hexed(ties(t, img, op, v))
                    cases.append(case)
        for op in ["Invert"]:
            out = t._apply_image_or_video_transform(img, op, 0.0, interpolation=NEAREST, fill=t._fill)
            cases.append({"op": op, "magnitude": 0.0, "interpolation": "nearest", "h": h, "w": w,
                          "image": hexed(img), "out": hexed(out)})
    return cases


class FixedAugMix(v2.AugMix):
    """AugMix with given Dirichlet draws, recording the ops it applies."""

    def __init__(self, weights, **kw):
        super().__init__(**kw)
        self.weights = list(weights)
        self.applied = []

    def _sample_dirichlet(self, params):
        return self.weights.pop(0)

    def _apply_image_or_video_transform(self, image, transform_id, magnitude, interpolation, fill):
        self.applied.append([transform_id, magnitude])
        return super()._apply_image_or_video_transform(image, transform_id, magnitude, interpolation, fill)


def augmix():
    torch.manual_seed(9)
    cases = []
    for k, img in enumerate(images()[:2]):
        for depth, severity, mode in [(1, 3, BILINEAR), (2, 10, NEAREST), (3, 5, BILINEAR), (2, 1, BILINEAR)]:
            m = torch._sample_dirichlet(torch.tensor([[1.0, 1.0]]))
            d = torch._sample_dirichlet(torch.tensor([[1.0, 1.0, 1.0]]))
            a = FixedAugMix([m, d], severity=severity, chain_depth=depth, interpolation=mode)
            out = a(img)
            chains = [a.applied[i * depth:(i + 1) * depth] for i in range(3)]
            cases.append({"h": img.shape[-2], "w": img.shape[-1], "image": hexed(img),
                          "interpolation": mode.value, "m": m[0].tolist(), "d": d[0].tolist(),
                          "chains": chains, "out": hexed(out)})
    return cases


class Recording:
    """Mixed into a policy: each op's (name, magnitude) recorded, the image returned as is."""

    def _apply_image_or_video_transform(self, image, transform_id, magnitude, interpolation, fill):
        self.applied.append([transform_id, magnitude])
        return image

    def _sample_dirichlet(self, params):
        w = torch._sample_dirichlet(params)
        self.weights.append(w[0].tolist())
        return w


def samples(n):
    torch.manual_seed(3)
    img = torch.zeros((3, 32, 24), dtype=torch.uint8)
    out = {}
    for name, make in POLICIES.items():
        base = type(make())
        policy = type("Rec" + base.__name__, (Recording, base), {})
        if name == "imagenet":
            t = policy(v2.AutoAugmentPolicy.IMAGENET)
        else:
            t = policy()
        draws, weights = [], []
        for _ in range(n):
            t.applied, t.weights = [], []
            t(img)
            draws.append(t.applied)
            weights.append(t.weights)
        out[name] = {"draws": draws, "weights": weights}
    return out


if __name__ == "__main__":
    import warnings
    warnings.simplefilter("ignore")
    mode = sys.argv[1]
    if mode == "all":
        print(json.dumps({"tables": tables(), "ops": ops(), "augmix": augmix(),
                          "samples": samples(int(sys.argv[2]))}))
    elif mode == "tables":
        print(json.dumps(tables()))
    elif mode == "ops":
        print(json.dumps(ops()))
    elif mode == "augmix":
        print(json.dumps(augmix()))
    else:
        print(json.dumps(samples(int(sys.argv[2]))))
