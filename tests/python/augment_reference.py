"""torchvision's values for tchrun's augmentation parity tests, as JSON on stdout.

`mix`: torchvision's v2.MixUp and v2.CutMix on given batches (MixUp at a given lambda; CutMix
with its own draw, whose lambda and box centre are given too, and its box and adjusted lambda),
and F.cross_entropy of logits against the mixed probability labels with label_smoothing
(worker/src/train/mix.rs).
`erase`: torchvision's F.erase (RandomErasing's kernel, value 0) of given images at given
boxes (tests/augment.rs).
`resize`: torchvision's v2 `resized_crop` of PIL images (its classification reference's default
backend; RandomResizedCrop's kernel) at given integer boxes and sizes, nearest, bilinear and
bicubic, antialiased, and of its eval transform (Resize of the shorter side + CenterCrop), on a
generated 61 x 45 image with edges and noise (tests/augment.rs).
`samples N`: N draws each, with fixed seeds, of v2.MixUp's lambda (alpha 0.2 and 1), of
v2.CutMix's box and adjusted lambda (alpha 1 on 24 x 32 images), of v2.RandomChoice([MixUp,
CutMix])'s choice, and of RandomErasing(p=0.5)'s box on 3 x 32 x 32 images (tests/augment.rs).
"""
import json
import sys

import torch
import torch.nn.functional as F
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF


class FixedMixUp(v2.MixUp):
    def __init__(self, lam, **kw):
        super().__init__(**kw)
        self.lam = lam

    def make_params(self, flat_inputs):
        return dict(lam=self.lam)


def flat(t):
    return t.flatten().tolist()


def mix():
    cases = []
    g = torch.Generator().manual_seed(0)
    for seed, (n, h, w, classes, alpha) in enumerate(
        [(4, 8, 8, 10, 0.2), (5, 12, 7, 3, 1.0), (1, 6, 6, 2, 1.0), (3, 16, 16, 5, 0.5)]
    ):
        x = torch.randn((n, 3, h, w), generator=g)
        y = torch.randint(classes, (n,), generator=g)
        logits = torch.randn((n, classes), generator=g)
        lam = float(torch.rand((), generator=g))
        mx, my = FixedMixUp(lam, alpha=alpha, num_classes=classes)(x, y)
        # CutMix's own draw: its lambda and centre are read from the same generator state.
        torch.manual_seed(100 + seed)
        cutmix = v2.CutMix(alpha=alpha, num_classes=classes)
        draw_lam = float(cutmix._dist.sample(()))
        r_x, r_y = int(torch.randint(w, size=(1,))), int(torch.randint(h, size=(1,)))
        torch.manual_seed(100 + seed)
        params = cutmix.make_params([x])
        torch.manual_seed(100 + seed)
        cx, cy = cutmix(x, y)
        losses = []
        for eps in [0.0, 0.1, 0.3]:
            losses.append({
                "eps": eps,
                "mixup": float(F.cross_entropy(logits, my, label_smoothing=eps)),
                "cutmix": float(F.cross_entropy(logits, cy, label_smoothing=eps)),
            })
        cases.append({
            "shape": [n, 3, h, w], "classes": classes, "images": flat(x), "labels": y.tolist(),
            "logits": flat(logits), "lam": lam, "mixup_images": flat(mx), "mixup_labels": flat(my),
            "cutmix_draw": {"lam": draw_lam, "r_x": r_x, "r_y": r_y},
            "cutmix_box": list(params["box"]), "cutmix_lam": params["lam_adjusted"],
            "cutmix_images": flat(cx), "cutmix_labels": flat(cy), "losses": losses,
        })
    return {"cases": cases}


def erase():
    g = torch.Generator().manual_seed(1)
    cases = []
    for size, box in [(8, (0, 0, 3, 5)), (16, (5, 2, 11, 1)), (12, (11, 11, 1, 1)), (10, (0, 0, 9, 9))]:
        x = torch.randn((3, size, size), generator=g)
        i, j, h, w = box
        out = TF.erase(x, i, j, h, w, torch.tensor([0.0])[:, None, None])
        cases.append({"size": size, "box": list(box), "image": flat(x), "erased": flat(out)})
    return {"cases": cases}


def resize():
    from PIL import Image
    g = torch.Generator().manual_seed(0)
    h, w = 45, 61
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    base = torch.stack([(xx * 4 + yy * 2) % 256, torch.sin(xx / 5.0) * 100 + 128, (yy * 23) % 256], -1)
    img = (base + torch.randn(h, w, 3, generator=g) * 20).clamp(0, 255).to(torch.uint8)
    pil = Image.fromarray(img.numpy())
    cases = []
    # (left, top, width, height, size): down in both axes, the whole image, up in both, down in
    # one and up in the other, a small crop far up.
    boxes = [(3, 5, 40, 30, 32), (0, 0, 61, 45, 32), (10, 7, 20, 13, 32), (5, 2, 50, 20, 24),
             (30, 20, 9, 11, 16), (1, 1, 3, 4, 17)]
    for interp in ["nearest", "bilinear", "bicubic"]:
        mode = getattr(v2.InterpolationMode, interp.upper())
        for (left, top, cw, ch, size) in boxes:
            out = TF.resized_crop(pil, top, left, ch, cw, [size, size], interpolation=mode, antialias=True)
            cases.append(dict(interpolation=interp, box=[left, top, cw, ch], size=size,
                              out=flat(TF.pil_to_tensor(out).permute(1, 2, 0))))
    # The eval transform: Resize(resize) of the shorter side + CenterCrop(size).
    evals = []
    for interp in ["nearest", "bilinear", "bicubic"]:
        mode = getattr(v2.InterpolationMode, interp.upper())
        for (resize, size) in [(36, 32), (20, 16), (56, 48), (45, 45)]:
            out = TF.center_crop(TF.resize(pil, resize, interpolation=mode, antialias=True), size)
            evals.append(dict(interpolation=interp, resize=resize, size=size,
                              out=flat(TF.pil_to_tensor(out).permute(1, 2, 0))))
    return dict(width=w, height=h, image=flat(img), cases=cases, evals=evals)


def samples(n):
    torch.manual_seed(2)
    lam = {}
    for alpha in [0.2, 1.0]:
        m = v2.MixUp(alpha=alpha, num_classes=2)
        lam[str(alpha)] = [float(m.make_params([])["lam"]) for _ in range(n)]
    img = torch.zeros((2, 3, 24, 32))
    c = v2.CutMix(alpha=1.0, num_classes=2)
    boxes, adjusted = [], []
    for _ in range(n):
        p = c.make_params([img])
        boxes.append(list(p["box"]))
        adjusted.append(p["lam_adjusted"])
    choice = v2.RandomChoice([lambda *a: 0, lambda *a: 1])
    choices = [choice(img) for _ in range(n)]
    erase = v2.RandomErasing(p=0.5)
    ones = torch.ones((3, 32, 32))
    erased = []
    for _ in range(n):
        out = erase(ones)
        zero = (out[0] == 0).nonzero()
        if len(zero) == 0:
            erased.append(None)
        else:
            i, j = int(zero[:, 0].min()), int(zero[:, 1].min())
            h, w = int(zero[:, 0].max()) - i + 1, int(zero[:, 1].max()) - j + 1
            erased.append([i, j, h, w])
    return {"lam": lam, "cutmix_boxes": boxes, "cutmix_lam": adjusted, "choices": choices,
            "erase": erased}


if __name__ == "__main__":
    import warnings
    warnings.simplefilter("ignore")
    if sys.argv[1] == "mix":
        print(json.dumps(mix()))
    elif sys.argv[1] == "resize":
        print(json.dumps(resize()))
    elif sys.argv[1] == "erase":
        print(json.dumps(erase()))
    else:
        print(json.dumps(samples(int(sys.argv[2]))))
