"""Parity of tchrun's architectures with torchvision (tests/parity.rs).

  parity.py write ARCH DIR [SIZE ...]
                             seeded torchvision ARCH (10 classes, batch-norm parameters and
                             statistics perturbed so that a swapped tensor shows) as DIR/w.pth
                             (torch.save of the state_dict) and DIR/w.safetensors; fixed input
                             batches DIR/x.safetensors at the sizes given (default 32, 64, 224,
                             256 and 299 px); and
                             torchvision's inference-mode logits DIR/ref.safetensors. For
                             ConvNeXt, EfficientNet and MobileNetV3 also LayerNorm parameters,
                             layer scales and biases perturbed, and one training step
                             (stochastic_depth_prob=0, EfficientNet's and MobileNetV3's
                             dropout=0, a batch of 4 at 32 px, DIR/train.safetensors): its
                             cross-entropy loss and gradients DIR/train_ref.safetensors.
  parity.py config ARCH ...  prints, as JSON, each EfficientNet's or MobileNetV3's batch-norm
                             eps and momentum (every BatchNorm2d alike), its dropout and its
                             blocks' stochastic depth probabilities, built on the meta device.
  parity.py check ARCH DIR   compares tchrun's logits (DIR/logits.safetensors) with the
                             reference; the model directories made from the .pth (DIR/model-pth)
                             and from the safetensors file (DIR/model-st) hold equal tensors; and
                             tchrun's state_dict (DIR/sd.safetensors) loads into torchvision with
                             strict=True and equals the weights given; for ConvNeXt,
                             EfficientNet and MobileNetV3, tchrun's loss and gradients
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
}


def stepped(arch: str) -> bool:
    return arch.startswith(tuple(STEPPED))


def perturb(m: torch.nn.Module, g: torch.Generator) -> None:
    """LayerNorm weights and biases, layer scales (from 1e-6 to 0.1-0.3, so that every block
    shows in the logits and gradients) and the zero-initialised biases (ConvNeXt's, and
    EfficientNet's and MobileNetV3's squeeze-and-excitation and Linears) made distinct."""
    for name, p in m.named_parameters():
        if name.endswith("layer_scale"):
            p.copy_(0.1 + 0.2 * torch.rand(p.shape, generator=g))
        elif p.dim() == 1 and name.endswith(".weight"):
            p.copy_(0.8 + 0.4 * torch.rand(p.shape, generator=g))
        elif name.endswith(".bias"):
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


def write(arch: str, d: str, *sizes: str) -> None:
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


def train_step(arch: str, d: str, g: torch.Generator) -> None:
    off = next(kw for family, kw in STEPPED.items() if arch.startswith(family))
    m = model(arch, **off).train()
    batch = {"x": torch.randn(4, 3, 32, 32, generator=g), "y": torch.tensor([0, 3, 7, 9])}
    save_file(batch, f"{d}/train.safetensors")
    loss = torch.nn.functional.cross_entropy(m(batch["x"]), batch["y"])
    loss.backward()
    ref = {"loss": loss.detach()}
    ref.update({k: p.grad.contiguous() for k, p in m.named_parameters()})
    save_file(ref, f"{d}/train_ref.safetensors")


def check(arch: str, d: str, *_: str) -> None:
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
    with torch.device("meta"):
        m = getattr(torchvision.models, arch)(num_classes=10)
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
        with torch.device("meta"):
            m = getattr(torchvision.models, arch)()
        bns = {(b.eps, b.momentum) for b in m.modules() if isinstance(b, torch.nn.BatchNorm2d)}
        assert len(bns) == 1, bns
        eps, momentum = bns.pop()
        sd = [b.stochastic_depth.p for b in m.modules() if hasattr(b, "stochastic_depth")]
        dropout = [d.p for d in m.modules() if isinstance(d, torch.nn.Dropout)]
        assert len(dropout) == 1, dropout
        out[arch] = {"eps": eps, "momentum": momentum, "dropout": dropout[0], "sd": sd}
    print(json.dumps(out))


if __name__ == "__main__":
    {"write": write, "check": check, "config": config}[sys.argv[1]](*sys.argv[2:])
