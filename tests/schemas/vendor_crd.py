"""Extract one version's schema from a CustomResourceDefinition, for
tests/unit/project/test_k8s_schemas.py.

    git show <tag>:<path-to-crd.yaml> | python tests/schemas/vendor_crd.py <version> > <kind>.json

Descriptions are dropped (they are most of the size); nothing else is changed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml


def without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: without_descriptions(value)
            for key, value in node.items()
            # "description" is a property name too (a field called description).
            if key != "description" or not isinstance(value, str)
        }
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node


def main() -> None:
    version = sys.argv[1]
    crd = yaml.safe_load(sys.stdin)
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = without_descriptions(served["schema"]["openAPIV3Schema"])
    json.dump(
        {
            "apiVersion": f"{crd['spec']['group']}/{version}",
            "kind": crd["spec"]["names"]["kind"],
            "schema": schema,
        },
        sys.stdout,
        sort_keys=True,
        separators=(",", ":"),
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
