"""torch's values for tchrun's recipe parity tests, as JSON on stdout.

`clip`: gradients, torch.nn.utils.clip_grad_norm_'s total norm and clipped gradients, and
F.cross_entropy with label_smoothing and class weights (worker/src/train/clip.rs).
`lr CONFIG_JSON`: the LR of every epoch from torch.optim.lr_scheduler, built as torchvision's
references/classification/train.py builds it (tests/lr_schedulers.rs).
`optim`: torch.optim's SGD (plain and Nesterov), RMSprop and AdamW as torchvision's train.py
builds them, stepped on given gradients with per-parameter groups (LR multiplier, weight
decay) and a changing LR: the parameters after each step (worker/src/train/optim.rs).
`decay NORM BIAS`: the weight decay of each parameter of resnet18, densenet121, convnext_tiny, efficientnet_b0, vit_b_32 and swin_t as
torchvision's set_weight_decay groups them (tests/lr_schedulers.rs).
`ema`: torchvision's ExponentialMovingAverage (references/classification/utils.py, v0.26) of
a given sequence of weights, updated as its train.py does (the decay adjusted for world size
x batch size x steps / epochs, every --model-ema-steps steps of an epoch, reset during the
warmup): the sequence and the average after each step (worker/src/train/ema.rs).
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
    # --class-weights: F.cross_entropy(weight=...), class labels and probabilities (MixUp's).
    for eps in [0.0, 0.1, 0.5]:
        logits = torch.randn(6, 5, generator=g) * 3
        labels = torch.randint(0, 5, (6,), generator=g)
        weight = torch.rand(5, generator=g) * 3 + 0.1
        soft = torch.softmax(torch.randn(6, 5, generator=g) * 2, 1)
        loss = F.cross_entropy(logits, labels, weight=weight, label_smoothing=eps)
        soft_loss = F.cross_entropy(logits, soft, weight=weight, label_smoothing=eps)
        smoothing.append({"eps": eps, "classes": 5, "logits": logits.flatten().tolist(),
                          "labels": labels.tolist(), "loss": float(loss),
                          "weight": weight.tolist(), "soft": soft.flatten().tolist(),
                          "soft_loss": float(soft_loss)})
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


OPTIM_PARAMS = [  # name, shape, LR multiplier, group ("other", "norm", "bias", "norm bias")
    ("layer1.0.conv1.weight", (3, 4), 0.1, "other"),
    ("layer1.0.bn1.weight", (5,), 0.1, "norm"),
    ("layer1.0.bn1.bias", (5,), 0.1, "norm bias"),
    ("fc.weight", (2, 3), 1.0, "other"),
    ("fc.bias", (2,), 1.0, "bias"),
]
OPTIM_LRS = [0.1, 0.05, 0.2, 0.1, 0.01]


def optim():
    g = torch.Generator().manual_seed(1)
    cases = []
    for opt, momentum, wd, norm_wd, bias_wd in [
        ("sgd", 0.9, 0.05, 0.0, 0.01),
        ("sgd_nesterov", 0.9, 0.05, 0.0, 0.01),
        ("sgd_nesterov", 0.5, 0.0, None, None),
        ("rmsprop", 0.9, 0.05, 0.0, 0.01),
        ("rmsprop", 0.0, 1e-4, None, 0.0),
        ("rmsprop", 0.9, 0.05, 0.0, None),
        ("adamw", 0.9, 0.05, 0.0, 0.01),
        ("adamw", 0.9, 0.0, None, None),
    ]:
        params, groups = [], []
        for name, shape, scale, group in OPTIM_PARAMS:
            p = torch.nn.Parameter(torch.randn(shape, generator=g))
            decay = {"other": wd,
                     "norm": wd if norm_wd is None else norm_wd,
                     "bias": wd if bias_wd is None else bias_wd,
                     "norm bias": bias_wd if bias_wd is not None else
                     (wd if norm_wd is None else norm_wd)}[group]
            params.append(p)
            groups.append({"params": [p], "lr": OPTIM_LRS[0] * scale, "weight_decay": decay})
        init = [p.detach().clone() for p in params]
        if opt.startswith("sgd"):
            o = torch.optim.SGD(groups, lr=OPTIM_LRS[0], momentum=momentum, weight_decay=wd,
                                nesterov="nesterov" in opt)
        elif opt == "rmsprop":
            o = torch.optim.RMSprop(groups, lr=OPTIM_LRS[0], momentum=momentum, weight_decay=wd,
                                    eps=0.0316, alpha=0.9)
        else:
            o = torch.optim.AdamW(groups, lr=OPTIM_LRS[0], weight_decay=wd)
        grads, after = [], []
        for lr in OPTIM_LRS:
            for grp, (_, _, scale, _) in zip(o.param_groups, OPTIM_PARAMS):
                grp["lr"] = lr * scale
            gs = [torch.randn(p.shape, generator=g) for p in params]
            for p, x in zip(params, gs):
                p.grad = x.clone()
            o.step()
            grads.append([x.flatten().tolist() for x in gs])
            after.append([p.detach().flatten().tolist() for p in params])
        cases.append({
            "opt": opt, "momentum": momentum, "weight_decay": wd,
            "norm_weight_decay": norm_wd, "bias_weight_decay": bias_wd,
            "decays": [grp["weight_decay"] for grp in o.param_groups],
            "init": [x.flatten().tolist() for x in init], "grads": grads, "after": after,
        })
    return {"params": [[n, list(s), sc] for n, s, sc, _ in OPTIM_PARAMS], "lrs": OPTIM_LRS,
            "cases": cases}


def weight_decay_groups(model, weight_decay, norm_weight_decay, bias_weight_decay):
    """The weight decay of each trainable parameter as torchvision's train.py groups them
    (references/classification/utils.py's set_weight_decay with custom key "bias"): a
    parameter named "bias" takes bias_weight_decay when given, else one of a normalisation
    module (by class, not by name) takes norm_weight_decay when given, else weight_decay."""
    norm_classes = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm,
                    torch.nn.GroupNorm, torch.nn.modules.instancenorm._InstanceNorm,
                    torch.nn.LocalResponseNorm)
    out = {}
    for module_name, module in model.named_modules():
        for leaf, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            full = f"{module_name}.{leaf}" if module_name else leaf
            if bias_weight_decay is not None and leaf == "bias":
                out[full] = bias_weight_decay
            elif norm_weight_decay is not None and isinstance(module, norm_classes):
                out[full] = norm_weight_decay
            else:
                out[full] = weight_decay
    return out


def decay(norm_wd, bias_wd):
    import torchvision
    out = {}
    for arch in ["resnet18", "densenet121", "convnext_tiny", "efficientnet_b0", "vit_b_32",
                 "swin_t"]:
        m = getattr(torchvision.models, arch)(num_classes=3)
        out[arch] = weight_decay_groups(m, 1e-4, norm_wd, bias_wd)
    return out


class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):
    """torchvision's references/classification/utils.py, verbatim."""

    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, device, ema_avg, use_buffers=True)


def ema():
    g = torch.Generator().manual_seed(0)
    cases = []
    for cfg in [
        dict(world_size=2, batch_size=8, steps=2, epochs=3, decay=0.999, warmup_epochs=1,
             steps_per_epoch=5),
        dict(world_size=1, batch_size=4, steps=1, epochs=2, decay=0.99998, warmup_epochs=0,
             steps_per_epoch=4),
        dict(world_size=4, batch_size=32, steps=3, epochs=1, decay=0.5, warmup_epochs=0,
             steps_per_epoch=7),
    ]:
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
            torch.nn.Linear(4, 2))
        # train.py's adjustment, verbatim.
        adjust = cfg["world_size"] * cfg["batch_size"] * cfg["steps"] / cfg["epochs"]
        alpha = 1.0 - cfg["decay"]
        alpha = min(1.0, alpha * adjust)
        model_ema = ExponentialMovingAverage(model, device="cpu", decay=1.0 - alpha)
        names = list(model.state_dict().keys())
        weights, averages = [], []
        step = 0
        for epoch in range(cfg["epochs"]):
            for i in range(cfg["steps_per_epoch"]):
                # "The optimizer step": new weights and statistics.
                with torch.no_grad():
                    for name, t in model.state_dict().items():
                        if name.endswith("num_batches_tracked"):
                            t.fill_(step * 1000 + 7)
                        else:
                            t.copy_(torch.randn(t.shape, generator=g))
                weights.append({n: t.flatten().tolist() for n, t in model.state_dict().items()})
                # train_one_epoch's update, verbatim.
                if i % cfg["steps"] == 0:
                    model_ema.update_parameters(model)
                    if epoch < cfg["warmup_epochs"]:
                        model_ema.n_averaged.fill_(0)
                a = {n: t.flatten().tolist() for n, t in model_ema.module.state_dict().items()}
                a["n_averaged"] = int(model_ema.n_averaged)
                averages.append(a)
                step += 1
        cases.append({"config": cfg, "adjusted_decay": 1.0 - alpha, "names": names,
                      "weights": weights, "ema": averages})
    return {"cases": cases}


if __name__ == "__main__":
    import warnings
    warnings.simplefilter("ignore")
    if sys.argv[1] == "clip":
        print(json.dumps(clip()))
    elif sys.argv[1] == "ema":
        print(json.dumps(ema()))
    elif sys.argv[1] == "optim":
        print(json.dumps(optim()))
    elif sys.argv[1] == "decay":
        num = lambda s: None if s == "none" else float(s)
        print(json.dumps(decay(num(sys.argv[2]), num(sys.argv[3]))))
    else:
        print(json.dumps([lr(c) for c in json.loads(sys.argv[2])]))
