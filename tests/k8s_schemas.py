"""Kubernetes manifests checked as a strict API server would: CRD schemas turned into JSON Schema,
core kinds through kubernetes-validate.

    from k8s_schemas import crd_validator, validation_errors, core_errors
    errors = validation_errors(manifest)          # [] when the manifest is valid

The CRDs come from a folder of YAML files (default: tests/k8s-crds, the upstream CRDs kept in this
repository, or the folder in $K8S_SCHEMA_DIR). Any file there holding a CustomResourceDefinition (or a List of
them) is used, so the live schema of a cluster works too:

    kubectl get crd pytorchjobs.kubeflow.org trainjobs.trainer.kubeflow.org -o yaml > DIR/crds.yaml
    K8S_SCHEMA_DIR=DIR python -m pytest tests/test_kubeflow.py

A CRD's openAPIV3Schema is a structural schema; to JSON Schema it becomes:
  - every object that lists `properties` and is not `x-kubernetes-preserve-unknown-fields` gets
    `additionalProperties: false` (an unknown field is an error, as with `kubectl apply
    --validate=strict` or fieldValidation=Strict),
  - `x-kubernetes-int-or-string` becomes integer-or-string,
  - `nullable: true` admits null.
CEL rules (`x-kubernetes-validations`) are not evaluated.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SCHEMA_DIR = REPO / "tests" / "k8s-crds"  # upstream CRDs kept in the repository (see its README)
# Core kinds (pod templates) are checked against this Kubernetes version's schemas.
K8S_VERSION = "1.33"


def schema_dir() -> Path:
    folder = Path(os.environ.get("K8S_SCHEMA_DIR") or DEFAULT_SCHEMA_DIR)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"CRD schema folder {folder} does not exist: set K8S_SCHEMA_DIR to a folder of CRD YAML, e.g. "
            "`kubectl get crd pytorchjobs.kubeflow.org trainjobs.trainer.kubeflow.org -o yaml > DIR/crds.yaml`"
        )
    return folder


def _load_yaml(path: Path):
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are large; libyaml is 10x faster
    with open(path) as f:
        return [doc for doc in yaml.load_all(f, Loader=loader) if doc]


@functools.cache
def _crds(folder: str) -> dict[tuple[str, str, str], dict]:
    """(group, version, kind) -> openAPIV3Schema of every CRD found in the folder."""
    found = {}
    for path in sorted(Path(folder).glob("*.y*ml")):
        for doc in _load_yaml(path):
            items = doc.get("items", []) if doc.get("kind") == "List" else [doc]
            for crd in items:
                if crd.get("kind") != "CustomResourceDefinition":
                    continue
                spec = crd["spec"]
                for version in spec["versions"]:
                    schema = version.get("schema", {}).get("openAPIV3Schema")
                    if schema:
                        found[(spec["group"], version["name"], spec["names"]["kind"])] = schema
    return found


def to_json_schema(node):
    """A copy of a structural OpenAPI v3 schema as a strict JSON Schema (see the module docstring)."""
    node = copy.deepcopy(node)
    _convert(node)
    return node


def _convert(node) -> None:
    if isinstance(node, list):
        for item in node:
            _convert(item)
        return
    if not isinstance(node, dict):
        return
    if node.pop("x-kubernetes-int-or-string", False):
        node.pop("type", None)
        node.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.pop("nullable", False) and "type" in node:
        node["type"] = [node["type"], "null"]
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        node.setdefault("additionalProperties", False)
    for key in ("properties", "patternProperties", "definitions"):
        for child in node.get(key, {}).values():
            _convert(child)
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), (dict, list)):
            _convert(node[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            _convert(node[key])


@functools.cache
def _validator(folder: str, group: str, version: str, kind: str) -> jsonschema.Draft7Validator:
    crds = _crds(folder)
    if (group, version, kind) not in crds:
        known = ", ".join(f"{k}.{g}/{v}" for g, v, k in sorted(crds)) or "none"
        raise LookupError(
            f"no CRD for {kind} {group}/{version} in {folder} (found: {known}); add it with "
            f"`kubectl get crd <plural>.{group} -o yaml > {folder}/<name>.yaml`"
        )
    schema = to_json_schema(crds[(group, version, kind)])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    group, _, version = api_version.rpartition("/")
    return _validator(str(schema_dir()), group, version, kind)


def _where(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<root>"


def validation_errors(manifest: dict) -> list[str]:
    """'path: message' for every way the manifest breaks its CRD schema; [] when it is valid."""
    validator = crd_validator(manifest["apiVersion"], manifest["kind"])
    return sorted(f"{_where(e)}: {e.message}" for e in validator.iter_errors(manifest))


def core_errors(resource: dict, version: str = K8S_VERSION) -> list[str]:
    """Errors of a core-kind resource (Pod, PodTemplate, ...) in strict mode; [] when valid.
    kubernetes-validate passes kinds it has no schema for, so only core kinds belong here."""
    try:
        import kubernetes_validate
    except ImportError as exc:
        raise ImportError("kubernetes-validate is missing: pip install kubernetes-validate") from exc
    try:
        kubernetes_validate.validate(resource, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{_where(e)}: {e.message}"]
    return []


def pod_template(name: str, template: dict) -> dict:
    """A PodTemplateSpec (metadata + spec) wrapped as a core v1 PodTemplate object."""
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}
