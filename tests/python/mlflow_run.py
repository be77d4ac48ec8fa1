"""Reads a tchrun training run back from an MLflow tracking server with MLflow's own Python
client (tests/mlflow.rs).

usage: mlflow_run.py TRACKING_URI EXPERIMENT
Prints one JSON object: the experiment's runs (newest first), each with its id, status, tags,
params, every metric's history as [step, value] pairs and its artifacts' paths (recursive)."""
import json
import sys

from mlflow.tracking import MlflowClient

uri, experiment = sys.argv[1], sys.argv[2]
client = MlflowClient(tracking_uri=uri)
exp = client.get_experiment_by_name(experiment)
if exp is None:
    print(json.dumps({"runs": []}))
    sys.exit(0)


def artifacts(run_id, path=None):
    out = []
    for f in client.list_artifacts(run_id, path):
        out.extend(artifacts(run_id, f.path) if f.is_dir else [f.path])
    return out


runs = []
for r in client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"]):
    rid = r.info.run_id
    runs.append({
        "run_id": rid,
        "status": r.info.status,
        "tags": {k: v for k, v in r.data.tags.items() if not k.startswith("mlflow.log")},
        "params": r.data.params,
        "metrics": {
            k: sorted([m.step, m.value] for m in client.get_metric_history(rid, k))
            for k in r.data.metrics
        },
        "artifacts": sorted(artifacts(rid)),
    })
print(json.dumps({"experiment_id": exp.experiment_id, "runs": runs}))
