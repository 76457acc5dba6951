"""The ingest API's manifests (infra/k8s/base/deployment-api.yaml) and the shared-nothing rule.

The API runs as a plain Deployment of several replicas whose state is in Kafka and the bucket:
no volume outlives a pod, and nothing under infra/k8s relies on a node's disk. Its probes name
endpoints the app really serves, its address is reachable from outside the pod, and its Service,
PodDisruptionBudget and ServiceMonitor select its pods.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import yaml

from docstream.settings import ApiSettings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
API_FILE = K8S / "base" / "deployment-api.yaml"
APP = ROOT / "docstream" / "api" / "app.py"
SERVER = ROOT / "docstream" / "api" / "server.py"
# Volumes whose content dies with the pod or comes from the API server: nothing of a node's disk.
POD_LIFETIME_VOLUMES = {"emptyDir", "secret", "configMap", "projected", "downwardAPI"}
NOT_APPLIED = {K8S / "hpa" / "prometheus-adapter-values.yaml"}


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def api_objects() -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in load(API_FILE)}


def api_container() -> dict[str, Any]:
    (c,) = api_objects()["Deployment"]["spec"]["template"]["spec"]["containers"]
    container: dict[str, Any] = c
    return container


def configmap() -> dict[str, str]:
    (cm,) = load(K8S / "base" / "configmap.yaml")
    data: dict[str, str] = cm["data"]
    return data


def app_get_routes() -> set[str]:
    """The paths of `@app.get("...")` in docstream/api/app.py (the app needs a running service to
    build; its source says which routes it has)."""
    routes = set()
    for node in ast.walk(ast.parse(APP.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for d in node.decorator_list:
                if (
                    isinstance(d, ast.Call)
                    and isinstance(d.func, ast.Attribute)
                    and d.func.attr == "get"
                    and d.args
                    and isinstance(d.args[0], ast.Constant)
                ):
                    routes.add(str(d.args[0].value))
    return routes


def uvicorn_graceful_shutdown_s() -> float:
    for node in ast.walk(ast.parse(SERVER.read_text(encoding="utf-8"))):
        if isinstance(node, ast.keyword) and node.arg == "timeout_graceful_shutdown":
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, int | float)
            return float(node.value.value)
    raise AssertionError("docstream/api/server.py sets no timeout_graceful_shutdown")


def test_the_api_is_a_deployment_of_several_replicas_running_api_serve() -> None:
    deploy = api_objects()["Deployment"]
    assert deploy["spec"]["replicas"] >= 2
    assert api_container()["command"] == ["docstream", "api", "serve"]
    assert api_container()["image"] == "docstream"
    listed = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text(encoding="utf-8"))["resources"]
    assert API_FILE.name in listed


def test_the_api_listens_on_every_address_and_its_service_reaches_it() -> None:
    env = {e["name"]: e.get("value") for e in api_container()["env"]}
    assert env["DOCSTREAM_API__HOST"] == "0.0.0.0"
    port = int(env["DOCSTREAM_API__PORT"])
    assert port == ApiSettings().port  # the default, written out
    (container_port,) = api_container()["ports"]
    assert container_port == {"name": "http", "containerPort": port, "protocol": "TCP"}
    objects = api_objects()
    service = objects["Service"]
    assert service["spec"]["type"] == "ClusterIP"
    pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}
    ]
    monitors = {o["metadata"]["name"]: o for o in load(K8S / "monitoring" / "servicemonitor.yaml")}
    monitor = monitors["docstream-api"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["endpoints"][0]["port"] == "http"
    assert monitor["endpoints"][0]["path"] == "/metrics"


def test_the_probes_name_endpoints_the_app_serves() -> None:
    """Readiness is /health (503 when the API cannot accept); liveness and startup are /metrics,
    which answers whatever the dependencies do."""
    c = api_container()
    routes = app_get_routes()
    assert {"/health", "/metrics"} <= routes
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    for probe in ("livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"] == {"path": "/metrics", "port": "http"}, probe
        assert c[probe]["httpGet"]["path"] in routes


def test_the_disruption_budget_keeps_one_replica() -> None:
    objects = api_objects()
    pdb = objects["PodDisruptionBudget"]["spec"]
    assert pdb["minAvailable"] == 1 < objects["Deployment"]["spec"]["replicas"]
    assert pdb["selector"] == objects["Deployment"]["spec"]["selector"]


def test_termination_grace_covers_the_prestop_and_the_graceful_shutdown() -> None:
    spec = api_objects()["Deployment"]["spec"]["template"]["spec"]
    pre_stop = api_container()["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # the preStop sleep, uvicorn's drain, then closing the service (poller, producer: 5 s each, + relay)
    assert spec["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + uvicorn_graceful_shutdown_s() + 15


def test_the_api_pod_is_hardened_like_the_others() -> None:
    spec = api_objects()["Deployment"]["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001}
    for c in [*spec["initContainers"], *spec["containers"]]:
        assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), c["name"]
    assert {"cpu", "memory"} <= set(api_container()["resources"]["limits"])


def test_the_api_home_is_an_empty_dir_at_docstream_home() -> None:
    spec = api_objects()["Deployment"]["spec"]["template"]["spec"]
    (mount,) = [m for m in api_container()["volumeMounts"] if m["name"] == "home"]  # and the Kafka CA
    assert mount["mountPath"] == configmap()["DOCSTREAM_HOME"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume == {"name": mount["name"], "emptyDir": {}}


def test_the_api_reaches_kafka_s3_and_the_warehouse() -> None:
    c = api_container()
    refs = [e.get("configMapRef", e.get("secretRef")) for e in c["envFrom"]]
    assert {"name": "docstream-config"} in refs
    assert {"name": "docstream-blobs", "optional": True} in refs
    env = {e["name"]: e for e in c["env"]}
    assert env["DOCSTREAM_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "docstream-kafka-api",
        "key": "password",
    }
    ref = env["DOCSTREAM_WAREHOUSE__URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "docstream-warehouse", "key": "url"}


def test_nothing_relies_on_a_node_disk() -> None:
    """Shared nothing: no StatefulSet, no PersistentVolumeClaim, and every pod volume lives and dies
    with its pod (emptyDir) or comes from the API server (Secret, ConfigMap)."""
    found = []
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name == "kustomization.yaml" or path in NOT_APPLIED:
            continue
        for obj in load(path):
            where = f"{path.relative_to(ROOT)}: {obj['kind']}/{obj['metadata']['name']}"
            if obj["kind"] in {"StatefulSet", "PersistentVolumeClaim", "PersistentVolume"}:
                found.append(f"{where}: a {obj['kind']}")
            spec = obj.get("spec", {}).get("template", {}).get("spec", {})
            for volume in spec.get("volumes", []):
                kinds = set(volume) - {"name"}
                if not kinds <= POD_LIFETIME_VOLUMES:
                    found.append(f"{where}: volume {volume['name']} is {sorted(kinds)}")
    assert not found, "\n".join(found)
