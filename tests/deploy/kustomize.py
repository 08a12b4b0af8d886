"""A kustomization rendered the way ``kubectl kustomize`` renders the subset this project
uses: ``resources`` (YAML files, or directories holding a kustomization, recursively)
and ``configMapGenerator`` with ``files`` (``KEY=PATH`` or ``PATH``) under
``generatorOptions`` ``disableNameSuffixHash: true`` plus its ``labels``. Any other key is
an error, so a kustomization that grows past this subset fails the tests instead of being
rendered wrongly. (The output was compared with kubectl's kustomize v5.5 when written.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions"}


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize DIRECTORY`` would print, in resource order."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - SUPPORTED
    if unknown:
        raise ValueError(f"{directory}: kustomization keys {sorted(unknown)} not rendered here")
    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        if path.is_dir():
            objects += render(path)
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    options = spec.get("generatorOptions", {})
    for gen in spec.get("configMapGenerator", []):
        if not options.get("disableNameSuffixHash"):
            raise ValueError(f"{directory}: generated names need disableNameSuffixHash here")
        data = {}
        for item in gen["files"]:
            key, _, path = item.rpartition("=")
            data[key or Path(path).name] = (directory / path).read_text()
        meta: dict[str, Any] = {"name": gen["name"]}
        if options.get("labels"):
            meta["labels"] = dict(options["labels"])
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    return objects
