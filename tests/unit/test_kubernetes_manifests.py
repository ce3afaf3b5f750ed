"""deploy/kubernetes/ (issue 48, item 4), checked offline.

Every YAML document there is validated against Kubernetes' own JSON schemas (the
``kubernetes-validate`` package ships them, strict: an unknown or misspelt field fails),
and the Deployment against Ferry itself: its arguments and variables are settings Ferry
reads, the probes ask the paths that mean live and ready on the port the inference API
binds and need no key, the grace period covers Ferry's drain, the security context is the
hardened one, and every place the server writes is a writable volume.
tests/integration/test_kubernetes_probes.py runs a real server with these probes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging.version import Version

from ferry.cli.main import build_parser
from ferry.cli.serve import flags_from_args
from ferry.config.settings import ServerSettings
from ferry.config.sources import OPTIONS, load_settings
from ferry.http.auth import OPEN_PATHS
from ferry.server import CLOSE_SECONDS, LISTENER_STOP_SECONDS
from tests.fixtures.k8s_manifests import (
    Document,
    deployment,
    documents,
    ferry_container,
    of_kind,
    pod_specs,
)

ROOT = Path(__file__).resolve().parents[2]
KSERVE_RUNTIME = ROOT / "deploy" / "kserve" / "cluster-serving-runtime.yaml"
KUBERNETES_VERSIONS = sorted(set(kubernetes_validate.utils.all_versions()), key=Version)
"""Every release whose schemas kubernetes-validate ships (1.25 to 1.37 in its 1.37.0)."""
LIVE, READY = "/v2/health/live", "/v2/health/ready"
SECRET_VALUE = "key-from-the-secret"
"""What a variable read from a Secret holds here."""


def _port(name_or_number: str | int) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    ports = {port["name"]: port["containerPort"] for port in ferry_container()["ports"]}
    return int(ports[name_or_number])


def _environment(container: Document) -> dict[str, str]:
    """The container's variables; one read from a Secret holds ``SECRET_VALUE``."""
    return {entry["name"]: entry.get("value", SECRET_VALUE) for entry in container.get("env", [])}


def server_settings() -> ServerSettings:
    """The settings ``ferry serve`` starts with in the container, read by Ferry's own
    parser and sources."""
    container = ferry_container()
    assert container["command"] == ["ferry"]
    args = build_parser().parse_args(container["args"])
    return load_settings(flags_from_args(args), _environment(container), None)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_document_is_valid_for_kubernetes(version: str) -> None:
    invalid = []
    for path, doc in documents():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(part) for part in error.path)
            invalid.append(f"{path.name}: {doc['kind']} {where}: {error.message}")
    assert invalid == []
    kinds = sorted(doc["kind"] for _, doc in documents())
    assert kinds == ["Deployment", "PersistentVolumeClaim", "Pod", "Service"]


def test_a_misspelt_field_fails_validation() -> None:
    """The check is strict: what Kubernetes would reject, or ignore, fails here."""
    broken = deployment()
    context = broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    context["readOnlyRootFileSystem"] = context.pop("readOnlyRootFilesystem")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_every_variable_and_argument_is_a_setting_ferry_reads() -> None:
    known = {f"FERRY_{option.key.upper()}" for option in OPTIONS}
    ferry_variables = {name for name in _environment(ferry_container()) if name.startswith("FERRY")}
    assert ferry_variables - known == set()
    settings = server_settings()
    assert settings.model_store == Path("/mnt/models/model-store")
    assert settings.models == ("all",)
    assert not settings.disable_token_authorization  # the API keys stay on
    assert settings.inference_key == settings.management_key == SECRET_VALUE


def test_the_service_reaches_the_apis_the_server_binds() -> None:
    settings = server_settings()
    bound = {
        "http": settings.inference_address,
        "grpc": settings.grpc_inference_endpoint,
        "metrics": settings.metrics_address,
    }
    for name, address in bound.items():
        assert address.host == "0.0.0.0", name  # reachable from the pod's network
        assert address.port == _port(name), name
    (service,) = of_kind("Service")
    assert service["spec"]["selector"] == deployment()["spec"]["selector"]["matchLabels"]
    assert {port["targetPort"] for port in service["spec"]["ports"]} == set(bound)
    assert settings.management_address.is_loopback  # reached by kubectl port-forward only


def test_the_probes_ask_whether_the_server_is_live_and_ready_without_a_key() -> None:
    container = ferry_container()
    probes = {
        kind: container[f"{kind}Probe"]["httpGet"] for kind in ("startup", "liveness", "readiness")
    }
    assert probes["startup"]["path"] == probes["liveness"]["path"] == LIVE
    assert probes["readiness"]["path"] == READY
    inference_port = server_settings().inference_address.port
    for probe in probes.values():
        assert probe["path"] in OPEN_PATHS  # token authorization is on: probes carry no key
        assert _port(probe["port"]) == inference_port
        assert probe.get("scheme", "HTTP") == "HTTP"


def _pre_stop_seconds(container: Document) -> float:
    pre_stop = container.get("lifecycle", {}).get("preStop")
    if pre_stop is None:
        return 0
    assert set(pre_stop) == {"sleep"}, "a preStop hook other than a sleep: time it here"
    return float(pre_stop["sleep"]["seconds"])


def test_the_grace_period_covers_the_drain() -> None:
    """SIGTERM: readiness 503 for ``drain_delay`` (long enough for the readiness probe to
    fail), then the listeners and the workers stop, each within its bound."""
    settings = server_settings()
    readiness = ferry_container()["readinessProbe"]
    assert settings.drain_delay >= readiness["periodSeconds"] * readiness["failureThreshold"]
    drain = settings.drain_delay + LISTENER_STOP_SECONDS + CLOSE_SECONDS
    grace = deployment()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= _pre_stop_seconds(ferry_container()) + drain


def _effective(pod: Document, container: Document, key: str) -> Any:
    """A security setting as the container gets it: its own, else the pod's."""
    own = container.get("securityContext", {})
    return own[key] if key in own else pod.get("securityContext", {}).get(key)


@pytest.mark.parametrize("pod", pod_specs(), ids=lambda pod: pod["containers"][0]["name"])
def test_every_container_runs_hardened(pod: Document) -> None:
    for container in pod["containers"]:
        assert _effective(pod, container, "runAsUser") == 1000
        assert _effective(pod, container, "runAsNonRoot") is True
        assert _effective(pod, container, "allowPrivilegeEscalation") is False
        assert _effective(pod, container, "readOnlyRootFilesystem") is True
        assert _effective(pod, container, "privileged") in (None, False)
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["resources"]["requests"] and container["resources"]["limits"]
    assert pod["automountServiceAccountToken"] is False


def _mounts(pod: Document, container: Document) -> dict[Path, bool]:
    """Mount path -> writable, for the container's volumes."""
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        read_only = mount.get("readOnly", False) or volume.get("persistentVolumeClaim", {}).get(
            "readOnly", False
        )
        mounts[Path(mount["mountPath"])] = not read_only
    return mounts


def _writable(path: Path, mounts: dict[Path, bool]) -> bool:
    """Whether ``path`` lies on a writable volume (the root filesystem is read-only)."""
    holding = [mount for mount in mounts if path.is_relative_to(mount)]
    return bool(holding) and mounts[max(holding, key=lambda mount: len(mount.parts))]


def test_the_server_writes_only_to_writable_volumes() -> None:
    """What the server logs at start-up as the places it writes: TMPDIR (unpacked archives,
    per-model packages, compile caches), the key file, ``log_location`` when set."""
    pod, container = deployment()["spec"]["template"]["spec"], ferry_container()
    mounts = _mounts(pod, container)
    settings = server_settings()
    assert _writable(Path(_environment(container)["TMPDIR"]), mounts)
    assert _writable(settings.key_file.parent, mounts)
    assert settings.log_location is None or _writable(settings.log_location, mounts)
    assert settings.model_store is not None
    assert not _writable(settings.model_store, mounts)  # the store is only read


def test_the_image_is_the_one_kserve_runtime_names() -> None:
    runtime = yaml.safe_load(KSERVE_RUNTIME.read_text())
    (kserve_container,) = runtime["spec"]["containers"]
    images = {c["image"] for pod in pod_specs() for c in pod["containers"]}
    assert images == {kserve_container["image"]}
