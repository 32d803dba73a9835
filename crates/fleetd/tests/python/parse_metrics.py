"""Parses fleetd's /metrics text (read on stdin) with the Prometheus Python client's OpenMetrics
parser, which refuses what breaks the format, and prints every sample as JSON:
[{"family", "type", "name", "labels", "value"}, ...]."""

import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families

samples = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for sample in family.samples:
        samples.append(
            {
                "family": family.name,
                "type": family.type,
                "name": sample.name,
                "labels": sample.labels,
                "value": sample.value,
            }
        )
json.dump(samples, sys.stdout)
