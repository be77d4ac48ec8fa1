#!/usr/bin/env python3
"""PyTorch reference for `tchrun train`: the same work with torchrun + DDP + torchvision.

    torchrun --standalone --nproc-per-node N benches/reference/train_ddp.py \
        --arch resnet18 --size 224 --train T --valid V --output O --epochs E --batch-size B \
        [--lr 0.001] [--warmup-epochs 0] [--lr-power 1] [--seed 1] [--patience 3] \
        [--min-crop-scale 0.08] [--no-hflip] [--loader-threads N] [--print-freq 10] \
        [--device cpu|cuda] [--amp off|bf16] [--channels-last]

Semantics matched to tchrun (worker/src/train.rs, src/data.rs, src/schedule.rs):
* model torchvision.models.<arch>(num_classes=C), seeded; DDP over Gloo on CPU;
* SGD(momentum 0.9, weight_decay 1e-4), effective LR = lr x world size, set per optimizer step:
  linear warmup over warmup_epochs x steps_per_epoch steps, then peak x (1 - t)^power;
* DistributedSampler(shuffle=True, seed) with set_epoch; per-rank batch size B; drop_last False;
* train: RandomResizedCrop(size, scale=(min_crop_scale, 1)) + RandomHorizontalFlip + ToTensor +
  Normalize(ImageNet); valid: Resize(round(size*256/224)) + CenterCrop(size), every epoch on
  each rank's unpadded shard, loss/top-1/top-5 all-reduced;
* torch.set_num_threads(cores // local ranks); DataLoader num_workers = tchrun's loader
  threads (default cores // local ranks);
* train images/s per epoch = global samples / (epoch start .. last step), like tchrun;
* --device cuda (the GPU mode): NCCL, one GPU per local rank, pinned memory, cudnn benchmark,
  --amp bf16 autocast and --channels-last as the PyTorch performance guide recommends.

Rank 0 prints `FIRST_STEP <unix time>` right after the first optimizer step and, at the end,
one line `RESULT {json}` (images/s per epoch, time to first step, peak RSS, ...).
"""
import time

T_IMPORT = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Subset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402
from torchvision import transforms as T  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def process_start_time() -> float:
    """Unix time this process started (from /proc), so imports count too."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            btime = next(int(l.split()[1]) for l in f if l.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except Exception:
        return T_IMPORT


def lr_at(step, peak, warmup_steps, total_steps, power):
    """tchrun's LrSchedule::lr."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    decay = total_steps - warmup_steps
    if decay == 0:
        return peak
    t = min(step - warmup_steps, decay) / decay
    return peak * (1.0 - t) ** power


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--train", required=True)
    ap.add_argument("--valid", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--warmup-epochs", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--lr-power", type=float, default=1.0)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--patience", type=int, default=3)
    ap.add_argument("--print-freq", type=int, default=10)
    ap.add_argument("--min-crop-scale", type=float, default=0.08)
    ap.add_argument("--no-hflip", action="store_true")
    ap.add_argument("--loader-threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--amp", default="off", choices=["off", "bf16"])
    ap.add_argument("--channels-last", action="store_true")
    args = ap.parse_args()

    t_proc = process_start_time()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cores = len(os.sched_getaffinity(0))
    threads = max(cores // max(local_world, 1), 1)
    torch.set_num_threads(threads)
    loader_threads = args.loader_threads or threads
    cuda = args.device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = True
    amp = cuda and args.amp == "bf16"
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)

    def say(msg):
        if rank == 0:
            print(msg, flush=True)

    train_tf = [T.RandomResizedCrop(args.size, scale=(args.min_crop_scale, 1.0))]
    if not args.no_hflip:
        train_tf.append(T.RandomHorizontalFlip())
    train_tf += [T.ToTensor(), T.Normalize(MEAN, STD)]
    valid_tf = T.Compose([
        T.Resize(round(args.size * 256 / 224)),
        T.CenterCrop(args.size),
        T.ToTensor(),
        T.Normalize(MEAN, STD),
    ])
    train_ds = torchvision.datasets.ImageFolder(args.train, T.Compose(train_tf))
    valid_ds = torchvision.datasets.ImageFolder(args.valid, valid_tf)
    if train_ds.classes != valid_ds.classes:
        raise SystemExit("train and valid class sets differ")
    classes = len(train_ds.classes)

    torch.manual_seed(args.seed)
    model = getattr(torchvision.models, args.arch)(num_classes=classes)
    if cuda:
        model = DDP(model.to(dev, memory_format=memory_format), device_ids=[local_rank])
    else:
        model = DDP(model)  # broadcasts parameters and buffers from rank 0
    peak = args.lr * world
    opt = torch.optim.SGD(model.parameters(), lr=peak, momentum=args.momentum,
                          weight_decay=args.weight_decay)

    sampler = DistributedSampler(train_ds, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=False)
    train_dl = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler,
                          num_workers=loader_threads, drop_last=False, pin_memory=cuda)
    valid_dl = DataLoader(Subset(valid_ds, range(rank, len(valid_ds), world)),
                          batch_size=args.batch_size, shuffle=False, num_workers=loader_threads,
                          pin_memory=cuda)
    steps_per_epoch = math.ceil(len(sampler) / args.batch_size)
    warmup_steps = min(args.warmup_epochs * steps_per_epoch, args.epochs * steps_per_epoch)
    total_steps = max(args.epochs * steps_per_epoch, 1)
    say(f"training {args.arch} on {len(train_ds)} train / {len(valid_ds)} valid images, {classes} "
        f"classes, {world} rank(s) on {args.device}: {steps_per_epoch} steps/epoch, effective LR {peak:e}, "
        f"{threads} threads, {loader_threads} loader workers")

    step, first_step_unix = 0, None
    best, since_best, history = None, 0, []
    for epoch in range(args.epochs):
        t_epoch = time.time()
        model.train()
        sampler.set_epoch(epoch)
        loss_sum, seen = 0.0, 0
        lr = lr_at(step, peak, warmup_steps, total_steps, args.lr_power)
        for it, (x, y) in enumerate(train_dl):
            if cuda:
                x = x.to(dev, non_blocking=True).contiguous(memory_format=memory_format)
                y = y.to(dev, non_blocking=True)
            opt.zero_grad()
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(model(x).float(), y)
            loss.backward()
            lr = lr_at(step, peak, warmup_steps, total_steps, args.lr_power)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
            if step == 0:
                first_step_unix = time.time()
                say(f"FIRST_STEP {first_step_unix:.6f}")
            step += 1
            n = x.shape[0] * world  # every rank has the same padded shard
            value = loss.item()
            if not math.isfinite(value):
                raise SystemExit(f"training diverged: loss {value}")
            loss_sum += value * n
            seen += n
            if (it + 1) % args.print_freq == 0 or it + 1 == steps_per_epoch:
                say(f"epoch {epoch + 1}/{args.epochs} iter {it + 1}/{steps_per_epoch} loss {value:.4f} lr {lr:.3e}")
        train_time = time.time() - t_epoch

        model.eval()
        totals = torch.zeros(4, dtype=torch.float64, device=dev)
        k = min(5, classes)
        with torch.no_grad():
            for x, y in valid_dl:
                if cuda:
                    x = x.to(dev, non_blocking=True).contiguous(memory_format=memory_format)
                    y = y.to(dev, non_blocking=True)
                with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp):
                    logits = model(x).float()
                top = logits.topk(k, -1, True, True)[1]
                hits = top.eq(y.unsqueeze(1))
                totals += torch.stack([
                    F.cross_entropy(logits, y, reduction="sum").double(),
                    hits[:, :1].sum().double(), hits.any(1).sum().double(),
                    torch.tensor(float(x.shape[0]), dtype=torch.float64, device=dev)])
        dist.all_reduce(totals)
        n = max(totals[3].item(), 1.0)
        m = {"epoch": epoch + 1, "train_loss": loss_sum / max(seen, 1),
             "train_images_per_sec": seen / max(train_time, 1e-9),
             "val_loss": totals[0].item() / n, "top1": totals[1].item() / n,
             "top5": totals[2].item() / n, "lr": lr, "epoch_time_s": time.time() - t_epoch}
        history.append(m)
        say(f"epoch {epoch + 1}/{args.epochs}: train loss {m['train_loss']:.4f}, "
            f"{m['train_images_per_sec']:.1f} images/s; valid loss {m['val_loss']:.4f}, "
            f"top-1 {100 * m['top1']:.2f}%, top-5 {100 * m['top5']:.2f}%")
        if best is None or m["val_loss"] < best[0]:
            state = {k2: v.detach().clone() for k2, v in model.module.state_dict().items()}
            best, since_best = (m["val_loss"], state), 0
        else:
            since_best += 1
            if since_best >= args.patience:
                say(f"early stopping after epoch {epoch + 1}")
                break

    if rank == 0:
        os.makedirs(args.output, exist_ok=True)
        torch.save(best[1], os.path.join(args.output, "model.pt"))
        with open(os.path.join(args.output, "metrics.jsonl"), "w") as f:
            for m in history:
                f.write(json.dumps(m) + "\n")
    dist.barrier()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rss = torch.tensor([float(peak_rss)], dtype=torch.float64, device=dev)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    result = {
        "tool": "torchrun+ddp", "world_size": world, "threads": threads,
        "loader_workers": loader_threads, "steps": step,
        "train_images_per_sec": [m["train_images_per_sec"] for m in history],
        "first_step_unix": first_step_unix,
        "first_step_since_process_start_s": (first_step_unix - t_proc) if first_step_unix else None,
        "peak_rss_bytes_max_rank": int(rss.item()),
        "epochs": history,
    }
    say("RESULT " + json.dumps(result))
    dist.barrier()
    # destroy_process_group() can hang in Gloo after a peer has left (seen with torch 2.11 on
    # this machine); everything is written, so leave without it.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
