"""tchrun export's ONNX step, run by `tchrun export` with the environment's Python (its
torch is the libtorch tchrun runs on). The TorchScript module tchrun traced (model.pt) is
written as ONNX by torch's TorchScript-based exporter (torch.onnx.export(dynamo=False): it
takes a ScriptModule as it is); tchrun's preprocessing goes into metadata_props; the graph
passes onnx.checker; ONNX Runtime runs it on the check batch (check.npz) against tchrun's own
probabilities. Prints one JSON line: the differences, or what is missing."""
import json
import sys
import warnings

# Run as `python -c`: the working directory (sys.path's '') must not shadow onnx or torch.
sys.path = [p for p in sys.path if p not in ("", ".")]


def difference(batch, got, want, tolerance, np):
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    if got.shape != want.shape:
        raise SystemExit("shape %s at batch %d, tchrun's %s" % (got.shape, batch, want.shape))
    at = int(np.argmax(diff))
    image, klass = divmod(at, want.shape[1])
    top = np.sort(want, axis=1)
    margin = top[:, -1] - top[:, -2] if want.shape[1] > 1 else np.ones(want.shape[0])
    differ = (np.argmax(got, axis=1) != np.argmax(want, axis=1)) & (margin > 2 * tolerance)
    worst = float(diff.max()) if not np.isnan(diff).any() else float("nan")
    return {"batch": batch, "max_abs_diff": worst, "image": image, "class": klass,
            "top1_disagree": int(differ.sum())}


def main():
    a = json.loads(sys.argv[1])
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
        import torch
    except ImportError as e:
        print(json.dumps({"missing": e.name}))
        return 0
    warnings.simplefilter("ignore")
    torch.set_num_threads(a["threads"])
    module = torch.jit.load(a["pt"], map_location="cpu")
    data = np.load(a["npz"])
    runs = a["runs"]
    example = torch.from_numpy(data["x%d" % (runs - 1)])
    axes = None
    if a["dynamic"]:
        axes = {a["input"]: {0: "batch"}, a["output"]: {0: "batch"}}
    torch.onnx.export(module, (example,), a["onnx"], input_names=[a["input"]],
                      output_names=[a["output"]], opset_version=a["opset"], dynamo=False,
                      dynamic_axes=axes)
    model = onnx.load(a["onnx"])
    for key, value in a["metadata"]:
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, a["onnx"])
    options = ort.SessionOptions()
    options.intra_op_num_threads = a["threads"]
    session = ort.InferenceSession(a["onnx"], options, providers=["CPUExecutionProvider"])
    out = []
    for i in range(runs):
        x, want = data["x%d" % i], data["p%d" % i]
        got = session.run(None, {a["input"]: x})[0]
        out.append(difference(int(x.shape[0]), got, want, a["tolerance"], np))
    print(json.dumps({"runs": out, "opset": model.opset_import[0].version}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
