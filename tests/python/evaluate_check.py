"""Recomputes `tchrun evaluate`'s figures from its scores.csv with scikit-learn and compares
them with metrics.json and confusion_matrix.csv (tests/evaluate.rs).

usage: evaluate_check.py EVAL_DIR CLASS [CLASS ...]   (the model's classes, in its order)
Prints one line per check; exits 1 on the first difference."""
import csv
import json
import sys

import numpy as np
from sklearn.metrics import confusion_matrix, log_loss, precision_recall_fscore_support

out, classes = sys.argv[1], sys.argv[2:]
index = {c: i for i, c in enumerate(classes)}
with open(f"{out}/scores.csv", newline="") as f:
    rows = list(csv.DictReader(f))
y_true = np.array([index[r["true_class"]] for r in rows])
y_pred = np.array([index[r["predicted_class"]] for r in rows])
# The column is the shortest decimal that rounds back to the f32 tchrun computed: read it as that
# f32 (a float64 parse of the decimal is up to half an f32 ulp off, which -log p keeps when p is
# small), then widen it, as tchrun's log loss does.
p_true = np.array([np.float32(r["true_class_probability"]) for r in rows]).astype(np.float64)
top5 = [[index[c] for c in r["top5_classes"].split(";")] for r in rows]
with open(f"{out}/metrics.json") as f:
    m = json.load(f)


def same(name, ours, theirs, tol=1e-12):
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    if ours.shape != theirs.shape or not np.allclose(ours, theirs, rtol=0, atol=tol):
        print(f"MISMATCH {name}: ours {ours.tolist()} scikit-learn {theirs.tolist()}")
        sys.exit(1)
    print(f"ok {name}")


k = len(classes)
cm = confusion_matrix(y_true, y_pred, labels=list(range(k)))
with open(f"{out}/confusion_matrix.csv", newline="") as f:
    table = list(csv.reader(f))
assert table[0][1:] == classes, table[0]
assert [r[0] for r in table[1:]] == classes
same("confusion_matrix.csv", [[int(v) for v in r[1:]] for r in table[1:]], cm, tol=0)

same("images", m["images"], len(rows), tol=0)
same("top1", m["top1"], float(np.mean(y_true == y_pred)))
same("top5", m["top5"], float(np.mean([t in t5 for t, t5 in zip(y_true, top5)])))

p, r, f1, s = precision_recall_fscore_support(
    y_true, y_pred, labels=list(range(k)), zero_division=0
)
pc = m["per_class"]
assert [c["class"] for c in pc] == classes
same("precision", [c["precision"] for c in pc], p)
same("recall", [c["recall"] for c in pc], r)
same("f1", [c["f1"] for c in pc], f1)
same("support", [c["support"] for c in pc], s, tol=0)
for avg in ("macro", "weighted"):
    ap, ar, af, _ = precision_recall_fscore_support(y_true, y_pred, average=avg, zero_division=0)
    same(f"{avg} precision", m[f"{avg}_avg"]["precision"], ap)
    same(f"{avg} recall", m[f"{avg}_avg"]["recall"], ar)
    same(f"{avg} f1", m[f"{avg}_avg"]["f1"], af)

# log_loss needs a probability row per image; only the true class's entry matters to it, so
# the rest of each row is spread evenly (rows sum to 1, as scikit-learn expects).
rest = (1.0 - p_true) / (k - 1)
y_prob = np.repeat(rest[:, None], k, axis=1)
y_prob[np.arange(len(rows)), y_true] = p_true
same("log_loss", m["log_loss"], log_loss(y_true, y_prob, labels=list(range(k))), tol=1e-9)
print("all figures equal scikit-learn's")
