#!/usr/bin/env python3
"""PyTorch reference for `tchrun-worker bench-step`: training steps alone on synthetic tensors.

    python benches/reference/bench_step.py --arch resnet18 --size 112 --batch-size 16 \
        [--classes 1000] [--steps 20] [--warmup 3] [--device cpu|cuda] [--amp off|bf16|fp16] \
        [--channels-last] [--threads N] [--memory-efficient]

The same loop as tchrun: torchvision.models.<arch>(num_classes), SGD(momentum 0.9, weight decay
1e-4, lr 0.01), zero_grad (set to None), forward under autocast (CUDA), cross-entropy, backward,
step; cudnn.benchmark on CUDA. PyTorch's default layout is NCHW; --channels-last converts the
model and the input as the PyTorch performance guide recommends. --memory-efficient: a DenseNet
built with torchvision's memory_efficient=True. Prints `RESULT {json}` (with the peak RSS).
"""
import argparse
import json
import resource
import time

import torch
import torch.nn.functional as F
import torchvision


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--amp", default="off", choices=["off", "bf16", "fp16"])
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--memory-efficient", action="store_true")
    ap.add_argument("--opt", default="sgd", choices=["sgd", "adamw"],
                    help="torch.optim.SGD(momentum=0.9, weight_decay=1e-4) or "
                         "AdamW(weight_decay=0.05), torch's defaults otherwise")
    a = ap.parse_args()
    if a.memory_efficient and not a.arch.startswith("densenet"):
        ap.error("--memory-efficient: DenseNet only")
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    kwargs = {"memory_efficient": True} if a.memory_efficient else {}
    if a.arch.startswith("vit_"):
        kwargs["image_size"] = a.size  # a ViT is built for its input size, as tchrun's
    model = getattr(torchvision.models, a.arch)(num_classes=a.classes, **kwargs).to(dev)
    x = torch.randn(a.batch_size, 3, a.size, a.size, device=dev)
    y = torch.randint(a.classes, (a.batch_size,), device=dev)
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    if a.opt == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    amp = cuda and a.amp != "off"
    dtype = torch.bfloat16 if a.amp == "bf16" else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=amp and a.amp == "fp16")
    model.train()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    start = time.perf_counter()
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            sync()
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=dtype, enabled=amp):
            loss = F.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    sync()
    secs = (time.perf_counter() - start) / max(a.steps, 1)
    out = {"tool": "torch", "arch": a.arch, "size": a.size, "batch_size": a.batch_size,
           "steps": a.steps, "device": a.device, "amp": a.amp if amp else "off",
           "channels_last": a.channels_last, "threads": torch.get_num_threads(),
           "memory_efficient": a.memory_efficient, "opt": a.opt,
           "ms_per_step": secs * 1e3, "images_per_sec": a.batch_size / secs,
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if cuda:
        out["max_memory_allocated_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
