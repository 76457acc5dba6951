"""Turn a CustomResourceDefinition's OpenAPI v3 schema into the JSON Schema vendored here.

    python tests/unit/k8s_schemas/crd_to_jsonschema.py CRD.yaml VERSION OUT.json "SOURCE"

The schema of `VERSION` (`spec.versions[].schema.openAPIV3Schema`) is kept as it is, with two
changes that make it check what the API server checks (README.md):

- `additionalProperties: false` on every object schema that lists `properties` and neither allows
  other keys (`additionalProperties`) nor keeps unknown fields (`x-kubernetes-preserve-unknown-
  fields`): the API server prunes unknown fields, and `kubectl apply` rejects them (strict field
  validation), so a misspelt key is an error here too;
- `apiVersion` and `kind` pinned to the CRD's group/version and kind.

Run without network access; it reads a local file only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml


def strict(node: Any) -> Any:
    if isinstance(node, dict):
        out = {key: strict(value) for key, value in node.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [strict(item) for item in node]
    return node


def convert(crd: dict[str, Any], version: str, source: str) -> dict[str, Any]:
    spec = crd["spec"]
    (served,) = [v for v in spec["versions"] if v["name"] == version]
    schema: dict[str, Any] = strict(served["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"]["enum"] = [f"{spec['group']}/{version}"]
    schema["properties"]["kind"]["enum"] = [spec["names"]["kind"]]
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$comment": f"{spec['names']['kind']} {spec['group']}/{version} from {source}; "
        "made by tests/unit/k8s_schemas/crd_to_jsonschema.py",
        **schema,
    }


def main(argv: list[str]) -> None:
    crd_path, version, out_path, source = argv
    crd = yaml.safe_load(Path(crd_path).read_text(encoding="utf-8"))
    text = json.dumps(convert(crd, version, source), indent=1, sort_keys=True) + "\n"
    Path(out_path).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
