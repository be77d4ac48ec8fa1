"""torch's values for tchrun's recipe parity tests, as JSON on stdout.

`clip`: gradients, torch.nn.utils.clip_grad_norm_'s total norm and clipped gradients, and
F.cross_entropy with label_smoothing (worker/src/train/clip.rs).
`lr CONFIG_JSON`: the LR of every epoch from torch.optim.lr_scheduler, built as torchvision's
references/classification/train.py builds it (tests/lr_schedulers.rs).
"""
import json
import sys

import torch
import torch.nn.functional as F


def clip():
    g = torch.Generator().manual_seed(0)
    cases = []
    for max_norm, scale in [(1.0, 1.0), (0.5, 3.0), (100.0, 1.0), (2.0, 0.01)]:
        grads = [torch.randn(s, generator=g) * scale for s in [(7,), (3, 4), (5,)]]
        params = [torch.zeros_like(x, requires_grad=True) for x in grads]
        for p, x in zip(params, grads):
            p.grad = x.clone()
        total = torch.nn.utils.clip_grad_norm_(params, max_norm)
        cases.append({
            "max_norm": max_norm,
            "grads": [x.flatten().tolist() for x in grads],
            "total_norm": float(total),
            "clipped": [p.grad.flatten().tolist() for p in params],
        })
    smoothing = []
    for eps in [0.0, 0.1, 0.5, 1.0]:
        logits = torch.randn(6, 5, generator=g) * 3
        labels = torch.randint(0, 5, (6,), generator=g)
        loss = F.cross_entropy(logits, labels, label_smoothing=eps)
        smoothing.append({"eps": eps, "classes": 5, "logits": logits.flatten().tolist(),
                          "labels": labels.tolist(), "loss": float(loss)})
    return {"clip": cases, "smoothing": smoothing}


def lr(cfg):
    from torch.optim import lr_scheduler as S
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=cfg["lr"])
    epochs, warmup = cfg["epochs"], cfg["warmup_epochs"]
    name = cfg["scheduler"]
    if name == "steplr":
        main = S.StepLR(opt, step_size=cfg["step_size"], gamma=cfg["gamma"])
    elif name == "cosineannealinglr":
        main = S.CosineAnnealingLR(opt, T_max=epochs - warmup, eta_min=cfg["lr_min"])
    elif name == "exponentiallr":
        main = S.ExponentialLR(opt, gamma=cfg["gamma"])
    else:
        raise SystemExit(f"unknown scheduler {name}")
    if warmup > 0:
        if cfg["warmup_method"] == "linear":
            w = S.LinearLR(opt, start_factor=cfg["decay"], total_iters=warmup)
        else:
            w = S.ConstantLR(opt, factor=cfg["decay"], total_iters=warmup)
        sched = S.SequentialLR(opt, schedulers=[w, main], milestones=[warmup])
    else:
        sched = main
    out = []
    for _ in range(epochs):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return {"lrs": out}


if __name__ == "__main__":
    import warnings
    warnings.simplefilter("ignore")
    if sys.argv[1] == "clip":
        print(json.dumps(clip()))
    else:
        print(json.dumps([lr(c) for c in json.loads(sys.argv[2])]))
