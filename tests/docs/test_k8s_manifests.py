"""The Kubernetes manifests under infra/k8s validate, strictly (no unknown field), against the
API schemas bundled with `kubernetes-validate` — the dry run that needs no cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")

MANIFESTS = sorted((Path(__file__).parents[2] / "infra" / "k8s").glob("*.yaml"))
KUBERNETES_VERSION = "1.37.0"


def _resources(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_for_the_kubernetes_api(manifest: Path) -> None:
    resources = _resources(manifest)
    assert resources, f"{manifest.name} holds no resource"
    for resource in resources:
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_a_misspelled_field_is_caught() -> None:
    """The check is not vacuous: strict validation rejects an unknown field."""
    deployment = next(
        r for r in _resources(MANIFESTS[0].parent / "dask.yaml") if r["kind"] == "Deployment"
    )
    deployment["spec"]["replica"] = deployment["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_every_service_selects_pods_of_a_workload_in_the_same_files() -> None:
    resources = [r for path in MANIFESTS for r in _resources(path)]
    pod_labels = [
        r["spec"]["template"]["metadata"]["labels"]
        for r in resources
        if r["kind"] in ("Deployment", "StatefulSet")
    ]
    for service in (r for r in resources if r["kind"] == "Service"):
        selector = service["spec"]["selector"]
        assert any(selector.items() <= labels.items() for labels in pod_labels), service
