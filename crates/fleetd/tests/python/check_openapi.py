"""Checks fleetd's OpenAPI document and what its API answered against it. Reads on stdin
{"document": ..., "samples": [{"method", "path", "status", "request"?, "body"?, "event"?}]}:
the document must be valid OpenAPI 3.1 (openapi-spec-validator); each sample's status must be
one its operation documents, its JSON body must match that response's schema, a request body
taken (200) must match the operation's request schema, an event must match the feed's event schema; and
every documented operation must have been seen answering 200. Prints what is wrong and exits
1, or prints "ok"."""

import json
import sys

from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

given = json.load(sys.stdin)
document = given["document"]
validate(document)
components = document["components"]
problems = []


def check(schema, value, what):
    rooted = dict(schema, components=components)
    for error in Draft202012Validator(rooted).iter_errors(value):
        problems.append(f"{what}: {error.message} at {list(error.absolute_path)}")


answered = set()
for sample in given["samples"]:
    method, path, status = sample["method"], sample["path"], str(sample["status"])
    what = f"{method.upper()} {path} -> {status}"
    operation = document["paths"].get(path, {}).get(method)
    if operation is None:
        problems.append(f"{what}: not in the document")
        continue
    response = operation["responses"].get(status)
    if response is None:
        problems.append(f"{what}: status not documented ({sorted(operation['responses'])})")
        continue
    if status == "200":
        answered.add((method, path))
    content = response.get("content", {})
    if "body" in sample:
        check(content["application/json"]["schema"], sample["body"], what)
    if "event" in sample:
        check(content["text/event-stream"]["x-event-data"], sample["event"], what + " event")
    if "request" in sample and status == "200":
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        check(schema, sample["request"], what + " request")

for path, operations in document["paths"].items():
    for method in operations:
        if (method, path) not in answered:
            problems.append(f"{method.upper()} {path}: documented, never seen answering 200")

if problems:
    print("\n".join(problems))
    sys.exit(1)
print("ok")
