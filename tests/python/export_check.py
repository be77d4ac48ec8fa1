"""`tchrun export`'s outputs read by the serving stacks' own libraries (tests/export.rs).

  export_check.py weights DIR CLASSES ARCH ...
        seeded torchvision ARCH (CLASSES classes, 32 px; batch-norm statistics, zero-initialised
        tensors and the head perturbed so that the classes differ) as DIR/ARCH.safetensors.
  export_check.py images SRC DST N
        the first N images of SRC (sorted, recursively) copied into DST, flat.
  export_check.py check REPO IMAGES NAME=SCORES ... [--batches 1,7]
        each REPO/NAME is a Triton model folder of `tchrun export`: its config.pbtxt parsed as
        protobuf text format against Triton's ModelConfig (model_config_pb.py: the messages
        of Triton's model_config.proto that tchrun writes); model.onnx through onnx.checker and
        ONNX Runtime, or model.pt through torch.jit.load, on the images of IMAGES (at the
        model's resize size: resizing them is the identity, so a client's preprocessing here is
        the center crop, then for a float32 graph the scaling and normalization as
        preprocess.json states; a uint8 graph (--with-preprocess) gets the crop's pixels) at
        each batch size; every image's top-1 and top-5 probabilities equal SCORES (tchrun
        score's CSV for the same files, 6 decimals) within 1e-4 plus the CSV's rounding.
        Prints one line per model.
"""
import csv
import json
import os
import sys

import numpy as np

TOL = 1e-4 + 5e-7  # the 1e-4 plus the CSV's 6-decimal rounding


def weights(out, classes, archs):
    import torch
    import torchvision
    from safetensors.torch import save_file

    for arch in archs:
        torch.manual_seed(0)
        kw = {"num_classes": classes}
        if arch.startswith("vit_"):
            kw["image_size"] = 32
        m = getattr(torchvision.models, arch)(**kw).eval()
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, t in m.state_dict().items():
                if not t.is_floating_point():
                    continue
                if name.endswith("running_var"):
                    t.copy_(0.5 + torch.rand(t.shape, generator=g))
                elif name.endswith("running_mean"):
                    t.copy_(0.1 * torch.randn(t.shape, generator=g))
                elif t.abs().max() == 0 or name.endswith(("head.weight", "fc.weight", "classifier.weight")):
                    # zero-initialised biases, class tokens and heads: classes that differ
                    t.copy_(0.05 * torch.randn(t.shape, generator=g))
            for name, t in m.named_parameters():
                if "head" in name or name.startswith(("fc.", "classifier")):
                    t.mul_(20.0 if t.dim() > 1 else 1.0)
        sd = {k: v.contiguous() for k, v in m.state_dict().items()}
        save_file(sd, os.path.join(out, arch + ".safetensors"))


def images(src, dst, n):
    import shutil

    files = []
    for root, _, names in os.walk(src):
        files += [os.path.join(root, f) for f in names if f.lower().endswith(".png")]
    os.makedirs(dst, exist_ok=True)
    for i, f in enumerate(sorted(files)[:n]):
        shutil.copy(f, os.path.join(dst, "img%03d.png" % i))


def parse_config(path):
    """config.pbtxt as Triton's ModelConfig: protobuf's own text-format parser against the
    message definitions of Triton's model_config.proto that tchrun writes."""
    from google.protobuf import text_format

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import model_config_pb as pb

    cfg = pb.ModelConfig()
    with open(path) as f:
        text_format.Parse(f.read(), cfg)
    return cfg, pb


def read_scores(path):
    rows = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            classes = r["top5_classes"].split(";")
            probs = [float(p) for p in r["top5_probabilities"].split(";")]
            rows[r["file"]] = (r["predicted_class"], list(zip(classes, probs)))
    return rows


def load_images(folder, pixels, pre):
    from PIL import Image

    crop, resize = pre["crop"], pre["resize"]
    # torchvision's CenterCrop corner: int(round((side - crop) / 2)), half to even
    top = int(round((resize - crop) / 2.0))
    files = sorted(f for f in os.listdir(folder) if f.endswith(".png"))
    arrs = []
    for f in files:
        a = np.asarray(Image.open(os.path.join(folder, f)).convert("RGB"), dtype=np.uint8)
        assert a.shape == (resize, resize, 3), (f, a.shape, "images at the resize size")
        arrs.append(a[top : top + crop, top : top + crop])
    x = np.stack(arrs)
    if pixels:
        return files, x
    m = np.asarray(pre["mean"], dtype=np.float32).reshape(1, 1, 1, 3)
    s = np.asarray(pre["std"], dtype=np.float32).reshape(1, 1, 1, 3)
    f = ((x.astype(np.float32) / np.float32(255.0) - m) / s).transpose(0, 3, 1, 2)
    return files, np.ascontiguousarray(f)


def check(repo, name, scores, folder, batches):
    model_dir = os.path.join(repo, name)
    cfg, pb = parse_config(os.path.join(model_dir, "config.pbtxt"))
    pre = json.load(open(os.path.join(model_dir, "preprocess.json")))
    labels = open(os.path.join(model_dir, cfg.output[0].label_filename)).read().split("\n")[:-1]
    assert labels == pre["class_names"], (labels, pre["class_names"])
    crop = pre["crop"]
    pixels = pre["input"].startswith("uint8")
    inp, out = cfg.input[0], cfg.output[0]
    want_type = pb.DataType.Value("TYPE_UINT8" if pixels else "TYPE_FP32")
    assert inp.data_type == want_type, inp
    dims = [crop, crop, 3] if pixels else [3, crop, crop]
    assert list(inp.dims) == dims and list(out.dims) == [len(labels)], (inp, out)
    assert cfg.max_batch_size == 64, cfg.max_batch_size
    files, x = load_images(folder, pixels, pre)
    found = []
    if cfg.platform == "onnxruntime_onnx":
        import onnx
        import onnxruntime as ort

        path = os.path.join(model_dir, "1", "model.onnx")
        m = onnx.load(path)
        onnx.checker.check_model(m)
        meta = {p.key: p.value for p in m.metadata_props}
        assert json.loads(meta["tchrun.class_names"]) == labels, meta
        assert int(meta["tchrun.crop"]) == crop, meta
        names = [i.name for i in m.graph.input]
        assert names == [inp.name], (names, inp.name)
        assert [o.name for o in m.graph.output] == [out.name]
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        run = lambda b: sess.run(None, {inp.name: b})[0]
        found.append("onnx.checker ok, opset %d" % m.opset_import[0].version)
    else:
        assert cfg.platform == "pytorch_libtorch", cfg.platform
        import torch

        mod = torch.jit.load(os.path.join(model_dir, "1", "model.pt"))
        run = lambda b: mod(torch.from_numpy(b)).numpy()
        found.append("torch.jit.load ok")
    ref = read_scores(scores)
    worst = 0.0
    for bs in batches:
        probs = np.concatenate([run(x[i : i + bs]) for i in range(0, len(x), bs)])
        assert probs.shape == (len(files), len(labels)), probs.shape
        for f, p in zip(files, probs):
            pred, top = ref[f]
            assert labels[int(np.argmax(p))] == pred, (f, bs, pred, p)
            for c, want in top:
                d = abs(float(p[labels.index(c)]) - want)
                worst = max(worst, d)
                assert d <= TOL, (f, bs, c, float(p[labels.index(c)]), want)
    found.append("%d images at batch %s: top-1 equal, max |p - score| %.2e" % (len(files), batches, worst))
    print(name + ": " + "; ".join(found))


def main():
    cmd = sys.argv[1]
    if cmd == "weights":
        weights(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    elif cmd == "images":
        images(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "check":
        repo, folder = sys.argv[2:4]
        rest = sys.argv[4:]
        batches = [1, 7]
        if "--batches" in rest:
            i = rest.index("--batches")
            batches = [int(b) for b in rest[i + 1].split(",")]
            rest = rest[:i] + rest[i + 2 :]
        for pair in rest:
            name, scores = pair.split("=", 1)
            check(repo, name, scores, folder, batches)
    else:
        sys.exit("unknown step " + cmd)


if __name__ == "__main__":
    main()
