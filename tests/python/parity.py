"""Parity of tchrun's architectures with torchvision (tests/parity.rs).

  parity.py write ARCH DIR [SIZE ...]
                             seeded torchvision ARCH (10 classes, batch-norm parameters and
                             statistics perturbed so that a swapped tensor shows) as DIR/w.pth
                             (torch.save of the state_dict) and DIR/w.safetensors; fixed input
                             batches DIR/x.safetensors at the sizes given (default 32, 64, 224,
                             256 and 299 px); and
                             torchvision's inference-mode logits DIR/ref.safetensors. For
                             ConvNeXt, EfficientNet, MobileNetV3, RegNet and Swin also
                             LayerNorm parameters, layer scales and biases perturbed, and one
                             training step (stochastic_depth_prob=0, EfficientNet's and
                             MobileNetV3's
                             dropout=0, a batch of 4 at 32 px, DIR/train.safetensors): its
                             cross-entropy loss and gradients DIR/train_ref.safetensors.
  parity.py write vit_* DIR SIZE ...
                             the same for a Vision Transformer built for the last SIZE (the
                             checkpoint: class token, head weight, LayerNorms and biases perturbed
                             too), and for every SIZE: DIR/x{SIZE}.safetensors, torchvision's
                             VisionTransformer(image_size=SIZE) with the checkpoint through
                             interpolate_embeddings, its logits DIR/ref{SIZE}.safetensors and its
                             positional embedding DIR/pos{SIZE}.safetensors; one training step at
                             the checkpoint's size (a batch of 4).
  parity.py interpolate DIR   random positional embeddings (hidden 8) for several patch grids and
                             torchvision's interpolate_embeddings of each to several others,
                             DIR/interp.safetensors (`g{FROM}` and `g{FROM}to{TO}`).
  parity.py check vit_* DIR SIZE ...
                             per SIZE: tchrun's logits (DIR/logits{SIZE}.safetensors) and
                             model directory (DIR/model-{SIZE}: the positional embedding within
                             1e-6 of torchvision's interpolation, every other tensor equal) and
                             state_dict (DIR/sd{SIZE}.safetensors, strict load); the loss and
                             gradients at the checkpoint's size.
  parity.py config ARCH ...  prints, as JSON, each EfficientNet's, MobileNetV3's or RegNet's
                             batch-norm eps and momentum (every BatchNorm2d alike), its dropout
                             (null without one) and its blocks' stochastic depth probabilities,
                             built on the meta device (`meta`); for a Swin its LayerNorms' eps, its dropouts' and attention
                             dropouts' probabilities (every one alike), window and shift sizes
                             per block, and its blocks' stochastic depth probabilities.
  parity.py check ARCH DIR   compares tchrun's logits (DIR/logits.safetensors) with the
                             reference; the model directories made from the .pth (DIR/model-pth)
                             and from the safetensors file (DIR/model-st) hold equal tensors; and
                             tchrun's state_dict (DIR/sd.safetensors) loads into torchvision with
                             strict=True and equals the weights given; for ConvNeXt,
                             EfficientNet, MobileNetV3 and RegNet, tchrun's loss and gradients
                             (DIR/grads.safetensors) equal torchvision's within GRAD_RTOL.
"""
import sys

import torch
import torchvision
from safetensors.torch import load_file, save_file

SIZES = (32, 64, 224, 256, 299)
RTOL = 1e-4  # max |tchrun - torchvision| / max |torchvision| per batch
GRAD_RTOL = 1e-4  # the same per gradient tensor, and for the loss


# Families whose zero-initialised biases are perturbed and whose training step is compared too,
# with what switches their random layers off for it.
STEPPED = {
    "convnext": {"stochastic_depth_prob": 0.0},
    "efficientnet": {"stochastic_depth_prob": 0.0, "dropout": 0.0},
    "mobilenet": {"dropout": 0.0},
    "regnet": {},  # neither dropout nor stochastic depth
    "vit": {},  # no stochastic depth; dropout 0 by default
    # swin_t/s/b pass stochastic_depth_prob themselves: set to 0 on the built model in
    # train_step; dropout and attention dropout 0 by default.
    "swin": {},
}


def stepped(arch: str) -> bool:
    return arch.startswith(tuple(STEPPED))


def perturb(m: torch.nn.Module, g: torch.Generator) -> None:
    """LayerNorm weights and biases, layer scales (from 1e-6 to 0.1-0.3, so that every block
    shows in the logits and gradients) and the zero-initialised biases (ConvNeXt's, and
    EfficientNet's, MobileNetV3's and RegNet's squeeze-and-excitation and Linears) made
    distinct."""
    for name, p in m.named_parameters():
        if name.endswith("layer_scale"):
            p.copy_(0.1 + 0.2 * torch.rand(p.shape, generator=g))
        elif p.dim() == 1 and name.endswith(".weight"):
            p.copy_(0.8 + 0.4 * torch.rand(p.shape, generator=g))
        elif name.endswith(".bias") or name in ("class_token", "heads.head.weight"):
            p.copy_(0.02 * torch.randn(p.shape, generator=g))


def model(arch: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    m = getattr(torchvision.models, arch)(num_classes=10, **kwargs)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        if stepped(arch):
            perturb(m, g)
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                c = mod.num_features
                mod.weight.copy_(0.8 + 0.4 * torch.rand(c, generator=g))
                mod.bias.copy_(0.1 * torch.randn(c, generator=g))
                mod.running_mean.copy_(0.1 * torch.randn(c, generator=g))
                mod.running_var.copy_(0.8 + 0.4 * torch.rand(c, generator=g))
    return m.eval()


def meta(arch: str, **kwargs) -> torch.nn.Module:
    """torchvision's `arch` built on the meta device. RegNet's builder computes its widths with
    tensors it reads back (`BlockParams.from_init_params`), which the meta device cannot: there
    that runs on the CPU and only `RegNet.__init__` on the meta device."""
    if not arch.startswith("regnet"):
        with torch.device("meta"):
            return getattr(torchvision.models, arch)(**kwargs)
    from torchvision.models import regnet

    init = regnet.RegNet.__init__

    def on_meta(self, *args, **kw):
        with torch.device("meta"):
            init(self, *args, **kw)

    regnet.RegNet.__init__ = on_meta
    try:
        return getattr(torchvision.models, arch)(**kwargs)
    finally:
        regnet.RegNet.__init__ = init


def vit_at(arch: str, size: int, sd: dict) -> torch.nn.Module:
    """torchvision's ViT built for `size` px with the checkpoint `sd` resampled for it."""
    from torchvision.models.vision_transformer import interpolate_embeddings

    m = getattr(torchvision.models, arch)(num_classes=10, image_size=size)
    m.load_state_dict(interpolate_embeddings(size, m.patch_size, dict(sd)), strict=True)
    return m.eval()


def write_vit(arch: str, d: str, *sizes: str) -> None:
    sizes = [int(s) for s in sizes]
    base = sizes[-1]
    sd = model(arch, image_size=base).state_dict()
    torch.save(sd, f"{d}/w.pth")
    save_file({k: v.contiguous() for k, v in sd.items()}, f"{d}/w.safetensors")
    g = torch.Generator().manual_seed(2)
    for s in sizes:
        m = vit_at(arch, s, sd)
        x = torch.randn(1, 3, s, s, generator=g)
        save_file({f"x{s}": x}, f"{d}/x{s}.safetensors")
        with torch.no_grad():
            save_file({f"x{s}": m(x).contiguous()}, f"{d}/ref{s}.safetensors")
        save_file({"pos": m.encoder.pos_embedding.detach().contiguous()}, f"{d}/pos{s}.safetensors")
    train_step(arch, d, g, base)


def interpolate(d: str) -> None:
    from torchvision.models.vision_transformer import interpolate_embeddings

    g = torch.Generator().manual_seed(3)
    out = {}
    for a in (1, 2, 3, 7, 14):
        pos = torch.randn(1, a * a + 1, 8, generator=g)
        out[f"g{a}"] = pos
        for b in (1, 2, 3, 4, 5, 7, 14, 24):
            r = interpolate_embeddings(b * 16, 16, {"encoder.pos_embedding": pos.clone()})
            out[f"g{a}to{b}"] = r["encoder.pos_embedding"].contiguous()
    save_file(out, f"{d}/interp.safetensors")


def check_vit(arch: str, d: str, *sizes: str) -> None:
    given = load_file(f"{d}/w.safetensors")
    base = int(sizes[-1])
    for s in map(int, sizes):
        ref, mine = load_file(f"{d}/ref{s}.safetensors"), load_file(f"{d}/logits{s}.safetensors")
        r = ref[f"x{s}"]
        rel = ((mine[f"x{s}"] - r).abs().max() / r.abs().max()).item()
        assert rel <= RTOL, f"{arch} {s} px: relative difference {rel:.2e} > {RTOL}"
        tv_pos = load_file(f"{d}/pos{s}.safetensors")["pos"]
        dirs = ["model-pth", "model-st"] if s == base else [f"model-{s}"]
        for md in dirs:
            w = load_file(f"{d}/{md}/model.safetensors")
            assert w.keys() == given.keys(), md
            pos_err = (w["encoder.pos_embedding"] - tv_pos).abs().max().item()
            assert pos_err <= 1e-6, f"{arch} {md}: pos_embedding off by {pos_err:.1e}"
            for k, v in given.items():
                assert k == "encoder.pos_embedding" or torch.equal(w[k], v), f"{md}: {k} differs"
        sd = load_file(f"{d}/sd{s}.safetensors")
        with torch.device("meta"):
            m = getattr(torchvision.models, arch)(num_classes=10, image_size=s)
        m.load_state_dict(sd, strict=True, assign=True)
        w = load_file(f"{d}/{dirs[0]}/model.safetensors")
        for k, v in w.items():
            assert torch.equal(sd[k], v), f"{arch}: state_dict tensor {k} differs"
        print(f"{arch} at {s} px (checkpoint {base} px): logits within {rel:.1e} of torchvision, "
              f"pos_embedding within {pos_err:.1e} of interpolate_embeddings; strict load ok")
    check_grads(arch, d)


def write(arch: str, d: str, *sizes: str) -> None:
    if arch.startswith("vit"):
        return write_vit(arch, d, *sizes)
    m = model(arch)
    sd = m.state_dict()
    torch.save(sd, f"{d}/w.pth")
    save_file({k: v.contiguous() for k, v in sd.items()}, f"{d}/w.safetensors")
    g = torch.Generator().manual_seed(2)
    xs = {f"x{s}": torch.randn(1, 3, s, s, generator=g) for s in map(int, sizes or SIZES)}
    save_file(xs, f"{d}/x.safetensors")
    with torch.no_grad():
        save_file({k: m(x).contiguous() for k, x in xs.items()}, f"{d}/ref.safetensors")
    if stepped(arch):
        train_step(arch, d, g)


def train_step(arch: str, d: str, g: torch.Generator, size: int = 32) -> None:
    off = dict(next(kw for family, kw in STEPPED.items() if arch.startswith(family)))
    if arch.startswith("vit"):
        off["image_size"] = size
    m = model(arch, **off).train()
    if arch.startswith("swin"):
        for b in m.modules():
            if hasattr(b, "stochastic_depth"):
                b.stochastic_depth.p = 0.0
    batch = {"x": torch.randn(4, 3, size, size, generator=g), "y": torch.tensor([0, 3, 7, 9])}
    save_file(batch, f"{d}/train.safetensors")
    loss = torch.nn.functional.cross_entropy(m(batch["x"]), batch["y"])
    loss.backward()
    ref = {"loss": loss.detach()}
    ref.update({k: p.grad.contiguous() for k, p in m.named_parameters()})
    save_file(ref, f"{d}/train_ref.safetensors")


def check(arch: str, d: str, *sizes: str) -> None:
    if arch.startswith("vit"):
        return check_vit(arch, d, *sizes)
    ref, mine = load_file(f"{d}/ref.safetensors"), load_file(f"{d}/logits.safetensors")
    worst = 0.0
    for k, r in ref.items():
        rel = ((mine[k] - r).abs().max() / r.abs().max().clamp_min(1e-12)).item()
        assert rel <= RTOL, f"{arch} {k}: relative difference {rel:.2e} > {RTOL}"
        worst = max(worst, rel)
    given = load_file(f"{d}/w.safetensors")
    from_pth = load_file(f"{d}/model-pth/model.safetensors")
    from_st = load_file(f"{d}/model-st/model.safetensors")
    assert from_pth.keys() == from_st.keys() == given.keys()
    for k, v in given.items():
        assert torch.equal(from_pth[k], v) and torch.equal(from_st[k], v), f"{arch}: {k} differs"
    sd = load_file(f"{d}/sd.safetensors")
    m = meta(arch, num_classes=10)
    m.load_state_dict(sd, strict=True, assign=True)
    for k, v in given.items():
        if not k.endswith("num_batches_tracked"):
            assert torch.equal(sd[k], v), f"{arch}: state_dict tensor {k} differs"
    px = ", ".join(k[1:] for k in ref)
    print(f"{arch}: logits within {worst:.1e} of torchvision at {px} px; strict load ok")
    if stepped(arch):
        check_grads(arch, d)


def check_grads(arch: str, d: str) -> None:
    ref, mine = load_file(f"{d}/train_ref.safetensors"), load_file(f"{d}/grads.safetensors")
    assert mine.keys() == ref.keys(), f"{arch}: {sorted(mine.keys() ^ ref.keys())[:5]}"
    worst, where = 0.0, ""
    for k, r in ref.items():
        rel = ((mine[k] - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
        assert rel <= GRAD_RTOL, f"{arch} {k}: relative difference {rel:.2e} > {GRAD_RTOL}"
        if rel > worst:
            worst, where = rel, k
    print(f"{arch}: training step (loss {ref['loss'].item():.4f}) and {len(ref) - 1} gradients "
          f"within {worst:.1e} of torchvision (worst {where or 'none: all equal'})")


def config(*archs: str) -> None:
    import json

    out = {}
    for arch in archs:
        m = meta(arch)
        assert all(t.is_meta for t in m.state_dict().values()), arch
        if arch.startswith("swin"):
            out[arch] = swin_config(m)
            continue
        bns = {(b.eps, b.momentum) for b in m.modules() if isinstance(b, torch.nn.BatchNorm2d)}
        assert len(bns) == 1, bns
        eps, momentum = bns.pop()
        sd = [b.stochastic_depth.p for b in m.modules() if hasattr(b, "stochastic_depth")]
        dropout = [d.p for d in m.modules() if isinstance(d, torch.nn.Dropout)]
        assert len(dropout) <= 1, dropout
        out[arch] = {"eps": eps, "momentum": momentum, "dropout": dropout[0] if dropout else None,
                     "sd": sd}
    print(json.dumps(out))


def swin_config(m: torch.nn.Module) -> dict:
    from torchvision.models.swin_transformer import ShiftedWindowAttention

    lns = {n.eps for n in m.modules() if isinstance(n, torch.nn.LayerNorm)}
    attn = [a for a in m.modules() if isinstance(a, ShiftedWindowAttention)]
    drops = {d.p for d in m.modules() if isinstance(d, torch.nn.Dropout)}
    drops |= {a.dropout for a in attn} | {a.attention_dropout for a in attn}
    assert len(lns) == 1 and len(drops) == 1, (lns, drops)
    sd = [b.stochastic_depth.p for b in m.modules() if hasattr(b, "stochastic_depth")]
    assert all(b.stochastic_depth.mode == "row" for b in m.modules() if hasattr(b, "stochastic_depth"))
    return {"eps": lns.pop(), "dropout": drops.pop(), "sd": sd,
            "window": [a.window_size for a in attn], "shift": [a.shift_size for a in attn]}


if __name__ == "__main__":
    steps = {"write": write, "check": check, "config": config, "interpolate": interpolate}
    steps[sys.argv[1]](*sys.argv[2:])
