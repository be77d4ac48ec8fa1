#!/usr/bin/env python3
"""PyTorch reference for `tchrun train`: the same work with torchrun + DDP + torchvision.

    torchrun --standalone --nproc-per-node N benches/reference/train_ddp.py \
        --arch resnet18 --size 224 --train T --valid V --output O --epochs E --batch-size B \
        [--lr 0.001] [--warmup-epochs 0] [--lr-power 1] [--seed 1] [--patience 3] \
        [--min-crop-scale 0.08] [--no-hflip] [--loader-threads N] [--print-freq 10] \
        [--device cpu|cuda] [--amp off|bf16] [--channels-last]
        [torchvision's recipe flags, below]

Semantics matched to tchrun (worker/src/train/, crates/data/src/, src/schedule.rs):
* model torchvision.models.<arch>(num_classes=C), seeded; DDP over Gloo on CPU; the loader's
  random draws seeded per rank (--seed x 1000 + rank), so the ranks' augmentations differ;
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

torchvision's recipe flags (references/classification/train.py's names and meanings, tchrun's
defaults; none given = the behaviour above): --lr-scheduler poly|cosineannealinglr|steplr|
exponentiallr (+ --lr-step-size, --lr-gamma, --lr-min; torch's schedulers in torchvision's
SequentialLR([LinearLR|ConstantLR, main]) stepped per epoch), --lr-warmup-epochs (alias of
--warmup-epochs), --lr-warmup-method linear|constant, --lr-warmup-decay, --lr-reference-batch
(effective LR = lr x world x batch / reference batch, tchrun's src/schedule.rs; default the
batch: lr x world), --label-smoothing, --mixup-alpha/--cutmix-alpha (v2.MixUp/v2.CutMix in
v2.RandomChoice on each loader batch, as train.py's collate_fn), --auto-augment ta_wide|ra|
augmix|imagenet (+ --ra-magnitude, --augmix-severity; transforms.v2 after the crop and flip),
--random-erase P (v2.RandomErasing after Normalize), --norm-weight-decay/--bias-weight-decay
(torchvision's set_weight_decay), --model-ema (+ --model-ema-steps, --model-ema-decay;
torchvision's ExponentialMovingAverage with train.py's adjustment, validated every epoch),
--ra-sampler --ra-reps N (torchvision's RASampler), --train-crop-size, --val-resize-size,
--val-crop-size, --interpolation.

Rank 0 prints `FIRST_STEP <unix time>` right after the first optimizer step and, at the end,
one line `RESULT {json}` (images/s per epoch, time to first step, peak RSS, the final and the
best epoch's top-1, and the EMA's with --model-ema, ...).
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
from torch.optim.swa_utils import AveragedModel  # noqa: E402
from torch.utils.data.dataloader import default_collate  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Subset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402
from torchvision import transforms as T  # noqa: E402
from torchvision.transforms import v2  # noqa: E402
from torchvision.transforms.functional import InterpolationMode  # noqa: E402

# The ablation of the one documented difference in the running statistics: tchrun's are the
# mean over all ranks' micro-batches after each step (docs/training.md), DDP's rank 0's.
AVERAGE_BN = os.environ.get("TCHRUN_REF_AVERAGE_BN") == "1"

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


def lr_at_law(step, peak, warmup_steps, total_steps, power, law):
    """tchrun's poly schedule with --lr-warmup-method/--lr-warmup-decay (`law`: (method, d)),
    per optimizer step: linear d + (1 - d) s / W, constant d, then the poly decay."""
    if law is not None and step < warmup_steps:
        method, d = law
        return peak * (d + (1.0 - d) * step / warmup_steps if method == "linear" else d)
    return lr_at(step, peak, warmup_steps, total_steps, power)


class RASampler(torch.utils.data.Sampler):
    """torchvision's references/classification/sampler.py RASampler (repeated augmentation):
    each index `repetitions` times in a row in the epoch's shuffle, every num_replicas-th
    position for this rank, the epoch cut to len(dataset) // 256 * 256 positions over the ranks."""

    def __init__(self, dataset, num_replicas, rank, shuffle=True, seed=0, repetitions=3):
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.num_samples = int(math.ceil(len(self.dataset) * float(repetitions) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        self.num_selected_samples = int(math.floor(len(self.dataset) // 256 * 256 / self.num_replicas))
        self.shuffle = shuffle
        self.seed = seed
        self.repetitions = repetitions

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(len(self.dataset), generator=g).tolist()
        else:
            indices = list(range(len(self.dataset)))
        indices = [ele for ele in indices for i in range(self.repetitions)]
        indices += indices[: (self.total_size - len(indices))]
        assert len(indices) == self.total_size
        indices = indices[self.rank: self.total_size: self.num_replicas]
        assert len(indices) == self.num_samples
        return iter(indices[: self.num_selected_samples])

    def __len__(self):
        return self.num_selected_samples

    def set_epoch(self, epoch):
        self.epoch = epoch


class ExponentialMovingAverage(AveragedModel):
    """torchvision's references/classification/utils.py ExponentialMovingAverage: the weights
    and the buffers (batch-norm statistics), avg = decay * avg + (1 - decay) * p."""

    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, device, ema_avg, use_buffers=True)


def set_weight_decay(model, weight_decay, norm_weight_decay=None, norm_classes=None,
                     custom_keys_weight_decay=None):
    """torchvision's references/classification/utils.py set_weight_decay: parameter groups."""
    if not norm_classes:
        norm_classes = [
            torch.nn.modules.batchnorm._BatchNorm,
            torch.nn.LayerNorm,
            torch.nn.GroupNorm,
            torch.nn.modules.instancenorm._InstanceNorm,
            torch.nn.LocalResponseNorm,
        ]
    norm_classes = tuple(norm_classes)
    params = {"other": [], "norm": []}
    params_weight_decay = {"other": weight_decay, "norm": norm_weight_decay}
    custom_keys = []
    if custom_keys_weight_decay is not None:
        for key, wd in custom_keys_weight_decay:
            params[key] = []
            params_weight_decay[key] = wd
            custom_keys.append(key)

    def _add_params(module, prefix=""):
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            is_custom_key = False
            for key in custom_keys:
                target_name = f"{prefix}.{name}" if prefix != "" and "." in key else name
                if key == target_name:
                    params[key].append(p)
                    is_custom_key = True
                    break
            if not is_custom_key:
                if norm_weight_decay is not None and isinstance(module, norm_classes):
                    params["norm"].append(p)
                else:
                    params["other"].append(p)
        for child_name, child_module in module.named_children():
            child_prefix = f"{prefix}.{child_name}" if prefix != "" else child_name
            _add_params(child_module, prefix=child_prefix)

    _add_params(model)
    return [{"params": params[k], "weight_decay": params_weight_decay[k]}
            for k in params if len(params[k]) > 0]


def epoch_scheduler(args, opt):
    """torchvision's train.py scheduler (stepped once per epoch), or None for tchrun's poly."""
    if args.lr_scheduler == "poly":
        return None
    lr_sched = torch.optim.lr_scheduler
    if args.lr_scheduler == "steplr":
        main = lr_sched.StepLR(opt, step_size=args.lr_step_size, gamma=args.lr_gamma)
    elif args.lr_scheduler == "cosineannealinglr":
        main = lr_sched.CosineAnnealingLR(opt, T_max=args.epochs - args.warmup_epochs,
                                          eta_min=args.lr_min)
    else:
        main = lr_sched.ExponentialLR(opt, gamma=args.lr_gamma)
    if args.warmup_epochs == 0:
        return main
    decay = 0.01 if args.lr_warmup_decay is None else args.lr_warmup_decay
    if args.lr_warmup_method == "linear":
        warm = lr_sched.LinearLR(opt, start_factor=decay, total_iters=args.warmup_epochs)
    else:
        warm = lr_sched.ConstantLR(opt, factor=decay, total_iters=args.warmup_epochs)
    return lr_sched.SequentialLR(opt, schedulers=[warm, main], milestones=[args.warmup_epochs])


def auto_augment(args, interpolation):
    """torchvision's ClassificationPresetTrain's --auto-augment policy (transforms.v2)."""
    p = args.auto_augment
    if p == "ra":
        return v2.RandAugment(interpolation=interpolation, magnitude=args.ra_magnitude)
    if p == "ta_wide":
        return v2.TrivialAugmentWide(interpolation=interpolation)
    if p == "augmix":
        return v2.AugMix(interpolation=interpolation, severity=args.augmix_severity)
    return v2.AutoAugment(v2.AutoAugmentPolicy(p), interpolation=interpolation)


def mixup_cutmix(args, classes):
    """torchvision's get_mixup_cutmix (use_v2): one of v2.MixUp/v2.CutMix per batch, or None."""
    choices = []
    if args.mixup_alpha > 0:
        choices.append(v2.MixUp(alpha=args.mixup_alpha, num_classes=classes))
    if args.cutmix_alpha > 0:
        choices.append(v2.CutMix(alpha=args.cutmix_alpha, num_classes=classes))
    return v2.RandomChoice(choices) if choices else None


class MixCollate:
    """train.py's collate_fn with MixUp/CutMix: the transform on each default-collated batch
    (a class, not a lambda, so DataLoader workers can be spawned too)."""

    def __init__(self, mix):
        self.mix = mix

    def __call__(self, batch):
        return self.mix(*default_collate(batch))


def add_recipe_flags(ap):
    """torchvision's recipe flags (train.py's names; tchrun's defaults)."""
    ap.add_argument("--lr-scheduler", default="poly",
                    choices=["poly", "cosineannealinglr", "steplr", "exponentiallr"])
    ap.add_argument("--lr-step-size", type=int, default=30)
    ap.add_argument("--lr-gamma", type=float, default=0.1)
    ap.add_argument("--lr-min", type=float, default=0.0)
    ap.add_argument("--lr-warmup-method", default="linear", choices=["linear", "constant"])
    ap.add_argument("--lr-warmup-decay", type=float, default=None)
    ap.add_argument("--lr-reference-batch", type=int, default=None)
    ap.add_argument("--label-smoothing", type=float, default=0.0)
    ap.add_argument("--mixup-alpha", type=float, default=0.0)
    ap.add_argument("--cutmix-alpha", type=float, default=0.0)
    ap.add_argument("--auto-augment", default=None, choices=["ta_wide", "ra", "augmix", "imagenet"])
    ap.add_argument("--ra-magnitude", type=int, default=9)
    ap.add_argument("--augmix-severity", type=int, default=3)
    ap.add_argument("--random-erase", type=float, default=0.0)
    ap.add_argument("--norm-weight-decay", type=float, default=None)
    ap.add_argument("--bias-weight-decay", type=float, default=None)
    ap.add_argument("--model-ema", action="store_true")
    ap.add_argument("--model-ema-steps", type=int, default=32)
    ap.add_argument("--model-ema-decay", type=float, default=0.99998)
    ap.add_argument("--ra-sampler", action="store_true")
    ap.add_argument("--ra-reps", type=int, default=3)
    ap.add_argument("--train-crop-size", type=int, default=None)
    ap.add_argument("--val-resize-size", type=int, default=None)
    ap.add_argument("--val-crop-size", type=int, default=None)
    ap.add_argument("--interpolation", default="bilinear", choices=["nearest", "bilinear", "bicubic"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--train", required=True)
    ap.add_argument("--valid", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--warmup-epochs", "--lr-warmup-epochs", dest="warmup_epochs", type=int, default=0)
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
    add_recipe_flags(ap)
    args = ap.parse_args()
    return train(args)


def transforms(args, cuda):
    """The training and validation transforms: tchrun's (and train.py's ClassificationPreset*)."""
    interp = InterpolationMode(args.interpolation)
    train_crop = args.train_crop_size or args.size
    val_crop = args.val_crop_size or args.size
    val_resize = args.val_resize_size or round(val_crop * 256 / 224)
    train_tf = [T.RandomResizedCrop(train_crop, scale=(args.min_crop_scale, 1.0), interpolation=interp)]
    if not args.no_hflip:
        train_tf.append(T.RandomHorizontalFlip())
    if args.auto_augment:
        train_tf.append(auto_augment(args, interp))
    train_tf += [T.ToTensor(), T.Normalize(MEAN, STD)]
    if args.random_erase > 0:
        train_tf.append(v2.RandomErasing(p=args.random_erase))
    valid_tf = T.Compose([
        T.Resize(val_resize, interpolation=interp),
        T.CenterCrop(val_crop),
        T.ToTensor(),
        T.Normalize(MEAN, STD),
    ])
    return T.Compose(train_tf), valid_tf


def evaluate(net, valid_dl, classes, dev, cuda, amp, memory_format):
    """Validation loss, top-1 and top-5 over every rank's shard: all-reduced (sum, hits, n)."""
    net.eval()
    totals = torch.zeros(4, dtype=torch.float64, device=dev)
    k = min(5, classes)
    with torch.no_grad():
        for x, y in valid_dl:
            if cuda:
                x = x.to(dev, non_blocking=True).contiguous(memory_format=memory_format)
                y = y.to(dev, non_blocking=True)
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp):
                logits = net(x).float()
            top = logits.topk(k, -1, True, True)[1]
            hits = top.eq(y.unsqueeze(1))
            totals += torch.stack([
                F.cross_entropy(logits, y, reduction="sum").double(),
                hits[:, :1].sum().double(), hits.any(1).sum().double(),
                torch.tensor(float(x.shape[0]), dtype=torch.float64, device=dev)])
    dist.all_reduce(totals)
    n = max(totals[3].item(), 1.0)
    return totals[0].item() / n, totals[1].item() / n, totals[2].item() / n


def train(args) -> int:
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

    train_tf, valid_tf = transforms(args, cuda)
    train_ds = torchvision.datasets.ImageFolder(args.train, train_tf)
    valid_ds = torchvision.datasets.ImageFolder(args.valid, valid_tf)
    if train_ds.classes != valid_ds.classes:
        raise SystemExit("train and valid class sets differ")
    classes = len(train_ds.classes)

    torch.manual_seed(args.seed)
    model = getattr(torchvision.models, args.arch)(num_classes=classes)
    if args.norm_weight_decay is None and args.bias_weight_decay is None:
        params = model.parameters()
    else:
        custom = [("bias", args.bias_weight_decay)] if args.bias_weight_decay is not None else None
        params = set_weight_decay(model, args.weight_decay, norm_weight_decay=args.norm_weight_decay,
                                  custom_keys_weight_decay=custom)
    if cuda:
        model = DDP(model.to(dev, memory_format=memory_format), device_ids=[local_rank])
    else:
        # broadcasts parameters and buffers from rank 0; TCHRUN_REF_AVERAGE_BN=1: tchrun's
        # running statistics instead (the mean of every rank's after each step; an ablation)
        model = DDP(model, broadcast_buffers=not AVERAGE_BN)
    # tchrun's --lr-reference-batch (src/schedule.rs): lr x images per step / reference batch;
    # without it the reference is --batch-size, so lr x world size.
    peak = args.lr * world
    if args.lr_reference_batch:
        peak = args.lr * world * args.batch_size / args.lr_reference_batch
    opt = torch.optim.SGD(params, lr=peak, momentum=args.momentum, weight_decay=args.weight_decay)
    scheduler = epoch_scheduler(args, opt)
    poly_law = None
    if args.lr_warmup_decay is not None or args.lr_warmup_method == "constant":
        poly_law = (args.lr_warmup_method,
                    0.01 if args.lr_warmup_decay is None else args.lr_warmup_decay)
    model_ema = None
    if args.model_ema:
        # train.py's adjustment: alpha = min(1, (1 - decay) x world x batch x ema steps / epochs).
        adjust = world * args.batch_size * args.model_ema_steps / args.epochs
        alpha = min(1.0, (1.0 - args.model_ema_decay) * adjust)
        model_ema = ExponentialMovingAverage(model.module, device=dev, decay=1.0 - alpha)

    if args.ra_sampler:
        sampler = RASampler(train_ds, num_replicas=world, rank=rank, shuffle=True, seed=args.seed,
                            repetitions=args.ra_reps)
    else:
        sampler = DistributedSampler(train_ds, num_replicas=world, rank=rank, shuffle=True,
                                     seed=args.seed, drop_last=False)
    mix = mixup_cutmix(args, classes)
    collate = MixCollate(mix) if mix else default_collate
    # The initial weights are the same on every rank (torch.manual_seed above; DDP broadcasts
    # rank 0's too), the augmentation draws must not be: the DataLoader seeds its workers from
    # `generator`, and from the one --seed every rank drew the same crops, flips, erase boxes and
    # MixUp/CutMix pairs, and with RASampler (which gives every rank the same images) trained on
    # identical batches, DDP averaging two copies of one gradient. torchvision's train.py seeds
    # nothing, so its ranks' draws differ; tchrun's differ by the sample's global position.
    loader_rng = torch.Generator()
    loader_rng.manual_seed(args.seed * 1000 + rank)
    train_dl = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler,
                          num_workers=loader_threads, drop_last=False, pin_memory=cuda,
                          collate_fn=collate, generator=loader_rng)
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
        lr = opt.param_groups[0]["lr"] if scheduler else lr_at_law(
            step, peak, warmup_steps, total_steps, args.lr_power, poly_law)
        for it, (x, y) in enumerate(train_dl):
            if cuda:
                x = x.to(dev, non_blocking=True).contiguous(memory_format=memory_format)
                y = y.to(dev, non_blocking=True)
            opt.zero_grad()
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(model(x).float(), y, label_smoothing=args.label_smoothing)
            loss.backward()
            if scheduler is None:
                lr = lr_at_law(step, peak, warmup_steps, total_steps, args.lr_power, poly_law)
                for g in opt.param_groups:
                    g["lr"] = lr
            opt.step()
            if AVERAGE_BN:
                for mod in model.module.modules():
                    if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
                        for buf in (mod.running_mean, mod.running_var):
                            dist.all_reduce(buf)
                            buf /= world
            if model_ema is not None and it % args.model_ema_steps == 0:
                model_ema.update_parameters(model.module)
                if epoch < args.warmup_epochs:
                    # train.py: reset the average to keep copying the weights during warmup
                    model_ema.n_averaged.fill_(0)
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
        if scheduler is not None:
            scheduler.step()

        val_loss, top1, top5 = evaluate(model, valid_dl, classes, dev, cuda, amp, memory_format)
        m = {"epoch": epoch + 1, "train_loss": loss_sum / max(seen, 1),
             "train_images_per_sec": seen / max(train_time, 1e-9),
             "val_loss": val_loss, "top1": top1, "top5": top5, "lr": lr}
        line = (f"epoch {epoch + 1}/{args.epochs}: train loss {m['train_loss']:.4f}, "
                f"{m['train_images_per_sec']:.1f} images/s; valid loss {val_loss:.4f}, "
                f"top-1 {100 * top1:.2f}%, top-5 {100 * top5:.2f}%")
        if model_ema is not None:
            m["ema_val_loss"], m["ema_top1"], m["ema_top5"] = evaluate(
                model_ema.module, valid_dl, classes, dev, cuda, amp, memory_format)
            line += (f"; EMA valid loss {m['ema_val_loss']:.4f}, top-1 {100 * m['ema_top1']:.2f}%, "
                     f"top-5 {100 * m['ema_top5']:.2f}%")
        m["epoch_time_s"] = time.time() - t_epoch
        history.append(m)
        say(line)
        if best is None or m["val_loss"] < best[0]:
            state = {k2: v.detach().clone() for k2, v in model.module.state_dict().items()}
            best, since_best = (m["val_loss"], state, m), 0
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
        "final_top1": history[-1]["top1"], "best_epoch": best[2]["epoch"],
        "best_top1": best[2]["top1"],
        "epochs": history,
    }
    if model_ema is not None:
        result["final_ema_top1"] = history[-1]["ema_top1"]
        result["best_ema_top1"] = best[2]["ema_top1"]
    say("RESULT " + json.dumps(result))
    dist.barrier()
    # destroy_process_group() can hang in Gloo after a peer has left (seen with torch 2.11 on
    # this machine); everything is written, so leave without it.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
