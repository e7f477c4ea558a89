"""Render a kustomization the way `kustomize build` does, for the subset deploy/ uses.

No kustomize binary installs from PyPI, so the tests render base and overlays themselves.
Anything outside the subset raises instead of being skipped, so a manifest can never use
a feature these tests silently ignore:

- `resources`: files of documents, and directories holding a kustomization (bases);
- `configMapGenerator` (`files`, `literals`, `behavior` create/merge/replace,
  `options.labels`), only with `generatorOptions.disableNameSuffixHash: true`, so names
  stay as written and no reference needs rewriting;
- `patches`: strategic merge patches from a file, one document each, with an optional
  `target` (kind, and name as an anchored regex); with a target the patch's own name is
  ignored, as in kustomize;
- `namespace`, `images` (newName, newTag, digest), `replicas`.

Strategic merge as Kubernetes defines it for the fields used: maps merge, null deletes a
key, lists of containers, env, volumes, volume mounts and ports merge by their merge key,
other lists are replaced, and every list of a custom resource (which has no merge keys)
is replaced.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]

KUSTOMIZATION_KEYS = frozenset(
    {
        "apiVersion",
        "kind",
        "resources",
        "namespace",
        "images",
        "replicas",
        "configMapGenerator",
        "generatorOptions",
        "patches",
    }
)
GENERATOR_KEYS = frozenset({"name", "files", "literals", "behavior", "options"})
# patchMergeKey of the list fields a patch may touch (k8s.io/api struct tags)
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"})
WORKLOADS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job"})


class Unsupported(Exception):
    """The kustomization uses something this renderer does not implement."""


def is_custom(doc: Doc) -> bool:
    """A custom resource: its API group has a dot and is not one of Kubernetes' own."""
    group = doc["apiVersion"].rpartition("/")[0]
    return "." in group and not group.endswith(".k8s.io")


def pod_spec(doc: Doc) -> Doc | None:
    if doc["kind"] in WORKLOADS:
        spec: Doc = doc["spec"]["template"]["spec"]
        return spec
    return None


def _load_documents(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _identity(doc: Doc) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


# --- strategic merge -----------------------------------------------------------------------


def strategic_merge(base: Any, patch: Any, *, custom: bool) -> Any:
    if not (isinstance(base, dict) and isinstance(patch, dict)):
        return copy.deepcopy(patch)
    if any(key.startswith("$") for key in patch):
        raise Unsupported(f"patch directive in {sorted(patch)}")
    merged = dict(base)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif key not in merged:
            merged[key] = copy.deepcopy(value)
        elif isinstance(value, list) and isinstance(merged[key], list):
            merged[key] = _merge_list(key, merged[key], value, custom=custom)
        else:
            merged[key] = strategic_merge(merged[key], value, custom=custom)
    return merged


def _merge_list(field: str, base: list[Any], patch: list[Any], *, custom: bool) -> list[Any]:
    key = MERGE_KEYS.get(field)
    if custom or key is None:
        return copy.deepcopy(patch)
    if not all(isinstance(item, dict) and key in item for item in [*base, *patch]):
        raise Unsupported(f"list {field!r} whose items lack their merge key {key!r}")
    merged = list(base)
    for item in patch:
        index = next((i for i, old in enumerate(merged) if old[key] == item[key]), None)
        if index is None:
            merged.append(copy.deepcopy(item))
        else:
            merged[index] = strategic_merge(merged[index], item, custom=custom)
    return merged


# --- generators and transformers -------------------------------------------------------------


def _generate(spec: Doc, root: Path) -> Doc:
    if set(spec) - GENERATOR_KEYS or set(spec.get("options", {})) - {"labels"}:
        raise Unsupported(f"configMapGenerator fields {sorted(spec)}")
    data: dict[str, str] = {}
    for entry in spec.get("files", []):
        key, _, path = entry.rpartition("=")
        data[key or Path(path).name] = (root / path).read_text()
    for literal in spec.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    metadata: Doc = {"name": spec["name"]}
    if labels := spec.get("options", {}).get("labels"):
        metadata["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def _apply_generator(docs: list[Doc], spec: Doc, root: Path) -> None:
    generated = _generate(spec, root)
    behavior = spec.get("behavior", "create")
    existing = [d for d in docs if _identity(d) == _identity(generated)]
    if behavior == "create":
        if existing:
            raise Unsupported(f"ConfigMap {spec['name']} generated twice")
        docs.append(generated)
        return
    if len(existing) != 1 or behavior not in ("merge", "replace"):
        raise Unsupported(f"{behavior} of ConfigMap {spec['name']}: {len(existing)} found")
    target = existing[0]
    if behavior == "replace":
        target["data"] = generated["data"]
    else:
        target["data"] = {**target.get("data", {}), **generated["data"]}
    target["metadata"].setdefault("labels", {}).update(generated["metadata"].get("labels", {}))


def _apply_patch(docs: list[Doc], entry: Doc, root: Path) -> None:
    if set(entry) - {"path", "target"}:
        raise Unsupported(f"patch fields {sorted(entry)}")
    (patch,) = _load_documents(root / entry["path"])  # one document per patch file
    target = entry.get("target")
    if target is None:
        matches = [d for d in docs if _identity(d) == _identity(patch)]
    else:
        if set(target) - {"kind", "name"}:
            raise Unsupported(f"patch target fields {sorted(target)}")
        matches = [
            d
            for d in docs
            if d["kind"] == target.get("kind", d["kind"])
            and re.fullmatch(target.get("name", ".*"), d["metadata"]["name"])
        ]
    if not matches:
        raise Unsupported(f"patch {entry['path']} matches no resource")
    for doc in matches:
        body = {k: v for k, v in patch.items() if k not in ("apiVersion", "kind", "metadata")}
        merged = strategic_merge(doc, body, custom=is_custom(doc))
        if target is None and "metadata" in patch:
            merged["metadata"] = strategic_merge(
                doc["metadata"], patch["metadata"], custom=is_custom(doc)
            )
        doc.clear()
        doc.update(merged)


def _set_image(image: str, rules: list[Doc]) -> str:
    name = re.split(r"[@]|:(?=[^/]*$)", image)[0]
    for rule in rules:
        if rule["name"] == name:
            new = rule.get("newName", name)
            if "digest" in rule:
                return f"{new}@{rule['digest']}"
            tag = rule.get("newTag", image[len(name) + 1 :] if image != name else "")
            return f"{new}:{tag}" if tag else str(new)
    return image


def render(directory: Path) -> list[Doc]:
    """Every document `kustomize build directory` would print (in no particular order)."""
    kustomization: Doc = yaml.safe_load((directory / "kustomization.yaml").read_text())
    if unknown := set(kustomization) - KUSTOMIZATION_KEYS:
        raise Unsupported(f"{directory}: kustomization fields {sorted(unknown)}")
    docs: list[Doc] = []
    for resource in kustomization.get("resources", []):
        path = directory / resource
        docs.extend(render(path) if path.is_dir() else _load_documents(path))
    if generators := kustomization.get("configMapGenerator"):
        options = kustomization.get("generatorOptions", {})
        if options != {"disableNameSuffixHash": True}:
            raise Unsupported(f"{directory}: generatorOptions {options} (hash suffixes)")
        for spec in generators:
            _apply_generator(docs, spec, directory)
    for entry in kustomization.get("patches", []):
        _apply_patch(docs, entry, directory)
    if namespace := kustomization.get("namespace"):
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = namespace
    for doc in docs:
        spec = pod_spec(doc)
        for container in [] if spec is None else spec["containers"]:
            container["image"] = _set_image(container["image"], kustomization.get("images", []))
    for rule in kustomization.get("replicas", []):
        found = [
            d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == rule["name"]
        ]
        if len(found) != 1:
            raise Unsupported(f"replicas for {rule['name']}: {len(found)} Deployments")
        found[0]["spec"]["replicas"] = rule["count"]
    return docs
