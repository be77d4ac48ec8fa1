"""Parses a `--prometheus-textfile` file with prometheus_client's own parser of the text
exposition format (tests/prometheus.rs).

usage: prometheus_parse.py FILE
Prints one JSON object: each metric family's name, with its type, help and samples (each
sample: its name, labels and value). A file the parser refuses exits non-zero."""
import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families

with open(sys.argv[1], encoding="utf-8") as f:
    text = f.read()
out = {}
for family in text_string_to_metric_families(text):
    out[family.name] = {
        "type": family.type,
        "help": family.documentation,
        "samples": [
            {
                "name": s.name,
                "labels": s.labels,
                "value": None if math.isnan(s.value) else s.value,
            }
            for s in family.samples
        ],
    }
print(json.dumps(out))
