"""Recomputes a two-model `tchrun evaluate --model A --model B`'s comparison from its a/scores.csv
and b/scores.csv with statsmodels' `mcnemar(exact=True)` and scikit-learn, and compares them with
comparison.json and disagreements.csv (tests/evaluate.rs; each model's own figures are checked
by evaluate_check.py on a/ and b/).

usage: compare_check.py EVAL_DIR CLASS [CLASS ...]   (the models' classes, in their order)
Prints one line per check and the table statsmodels was given; exits 1 on the first difference."""
import csv
import json
import sys

import numpy as np
from sklearn.metrics import accuracy_score, confusion_matrix
from statsmodels.stats.contingency_tables import mcnemar

out, classes = sys.argv[1], sys.argv[2:]
index = {c: i for i, c in enumerate(classes)}


def scores(name):
    with open(f"{out}/{name}/scores.csv", newline="") as f:
        return list(csv.DictReader(f))


def fail(what):
    print(f"MISMATCH {what}")
    sys.exit(1)


a, b = scores("a"), scores("b")
if [r["file"] for r in a] != [r["file"] for r in b] or not a:
    fail("a/scores.csv and b/scores.csv list different images")
y_true = np.array([index[r["true_class"]] for r in a])
pred = [np.array([index[r["predicted_class"]] for r in rows]) for rows in (a, b)]
right = [p == y_true for p in pred]
table = np.array(
    [
        [np.sum(right[0] & right[1]), np.sum(right[0] & ~right[1])],
        [np.sum(~right[0] & right[1]), np.sum(~right[0] & ~right[1])],
    ]
)
res = mcnemar(table, exact=True)
print(f"statsmodels table {table.tolist()} statistic {res.statistic} p-value {res.pvalue!r}")

with open(f"{out}/comparison.json") as f:
    c = json.load(f)
m = c["mcnemar"]
ours = [[m["both_correct"], m["only_a_correct"]], [m["only_b_correct"], m["both_wrong"]]]
if ours != table.tolist():
    fail(f"table: ours {ours} statsmodels {table.tolist()}")
if m["statistic"] != int(res.statistic):
    fail(f"statistic: ours {m['statistic']} statsmodels {res.statistic}")
if not np.isclose(m["p_value"], float(res.pvalue), rtol=1e-12, atol=0):
    fail(f"p-value: ours {m['p_value']!r} statsmodels {float(res.pvalue)!r}")
print("ok mcnemar")

if c["images"] != len(a) or c["classes"] != classes:
    fail(f"images {c['images']} / classes {c['classes']}")
for i, name in enumerate(("a", "b")):
    model = c["models"][i]
    with open(f"{out}/{name}/metrics.json") as f:
        if model["name"] != name or model["metrics"] != json.load(f):
            fail(f"comparison.json's {name} differs from {name}/metrics.json")
    cm = confusion_matrix(y_true, pred[i], labels=list(range(len(classes))))
    if model["confusion_matrix"] != cm.tolist():
        fail(f"{name} confusion matrix")
    if model["metrics"]["top1"] != accuracy_score(y_true, pred[i]):
        fail(f"{name} top-1")
diff = accuracy_score(y_true, pred[1]) - accuracy_score(y_true, pred[0])
if not np.isclose(c["top1_difference"], diff, rtol=0, atol=1e-15):
    fail(f"top1_difference: ours {c['top1_difference']} scikit-learn {diff}")
print("ok metrics and confusion matrices")

with open(f"{out}/disagreements.csv", newline="") as f:
    rows = list(csv.DictReader(f))
want = [
    {
        "file": ra["file"],
        "true_class": ra["true_class"],
        "a_predicted": ra["predicted_class"],
        "a_probability": ra["probability"],
        "b_predicted": rb["predicted_class"],
        "b_probability": rb["probability"],
        "a_correct": str(ra["predicted_class"] == ra["true_class"]).lower(),
        "b_correct": str(rb["predicted_class"] == rb["true_class"]).lower(),
    }
    for ra, rb in zip(a, b)
    if ra["predicted_class"] != rb["predicted_class"]
]
if rows != want or c["disagreements"] != len(want):
    fail(f"disagreements.csv: {len(rows)} rows, {len(want)} expected, json {c['disagreements']}")
print(f"ok disagreements ({len(want)})")
print("the comparison equals statsmodels' and scikit-learn's")
