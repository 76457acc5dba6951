"""The Kubernetes manifests (infra/k8s/): structure, consistency with the code, metric names,
schemas.

No cluster: the YAML is parsed and checked against what the code declares (the groups, the
settings, the exporter's metric families). `kubectl kustomize` builds the overlays when kubectl
is on the PATH. Every object, as written and as the overlays render it, is validated offline
against the Kubernetes schemas that kubernetes-validate bundles and the CRD schemas vendored in
tests/unit/k8s_schemas/ (KEDA, Prometheus Operator; their sources in its README.md).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from jsonschema import validators
from mode import Service

from consumers.groups import WORKER_GROUPS
from consumers.ops.exporter import METRIC_NAMES
from docstream.settings import RuntimeSettings, ScalingSettings, Settings
from docstream.topology import GROUPS, group_id
from infra.topics import Replication

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
DASHBOARD = K8S / "monitoring" / "docstream-dashboard.json"
DOCS = ROOT / "docs" / "kubernetes.md"
NAMESPACE = "docstream"
SIGNAL = "docstream_consumer_group_hpa_signal"
KAFKA_TRIGGER_EXAMPLE = K8S / "keda" / "kafka-trigger.example.yaml"  # documents the alternative
ADAPTER_VALUES = K8S / "hpa" / "prometheus-adapter-values.yaml"  # Helm values, not an object
NOT_APPLIED = {KAFKA_TRIGGER_EXAMPLE, ADAPTER_VALUES}
KUSTOMIZATIONS = ("base", "monitoring", "keda", "hpa", "gpu", "three-brokers")
OVERLAYS = ("keda", "hpa", "three-brokers")
THREE_BROKERS = K8S / "three-brokers"
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

GROUP_NAMES = [g.name for g in GROUPS]
COMMANDS = {
    **{name: ["docstream", "worker", name] for name in WORKER_GROUPS},
    "analytics": ["python", "-m", "consumers.analytics", "worker", "-l", "info"],
    "warehouse": ["docstream", "warehouse", "sink"],
}
# What a pod's shutdown may take before the kubelet's SIGKILL (the derivation is in the manifests):
# the runtime's drain, or the faust services' stop timeout in mode.
SHUTDOWN_S = {
    **{name: RuntimeSettings().shutdown_timeout_s for name in (*WORKER_GROUPS, "warehouse")},
    "analytics": Service.shutdown_timeout,
}
BEHAVIOR = {
    "scaleUp": {
        "stabilizationWindowSeconds": 30,
        "selectPolicy": "Max",
        "policies": [
            {"type": "Percent", "value": 100, "periodSeconds": 15},
            {"type": "Pods", "value": 4, "periodSeconds": 15},
        ],
    },
    "scaleDown": {
        "stabilizationWindowSeconds": 600,
        "selectPolicy": "Max",
        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 120}],
    },
}
METRIC_NAME = re.compile(r"\bdocstream_[a-z0-9_]*[a-z0-9]\b")
# PromQL, as far as the metric names go: the words that are not metric names, and what to cut out
# before looking for names (strings, label matchers, ranges, label lists of by/without/on/...).
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
PROMQL_KEYWORDS |= {"group_left", "group_right", "inf", "nan", "start", "end"}
PROMQL_CUTS = (
    (re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`"""), '""'),
    (re.compile(r"\$(?:\{[^}]*\}|\w+)"), "0"),  # Grafana's variables: $group, ${group:regex}
    (re.compile(r"\{[^}]*\}"), " "),
    (re.compile(r"\[[^\]]*\]"), " "),
    (re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"), " "),
)
PROMQL_WORD = re.compile(r"(?<![\w.:])[A-Za-z_:][\w:]*")
NAME_MATCHER = re.compile(r'\b__name__\s*=\s*"([^"]+)"')
# Targets that read no series, by design.
NO_SERIES = {"vector($objective_s)"}


# -- loading ---------------------------------------------------------------------------------------


def yaml_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*") if p.suffix in {".yaml", ".yml"})


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def objects(*dirs: str) -> list[dict[str, Any]]:
    """The Kubernetes objects of the YAML files directly in `dirs` (kustomizations and the files
    that are not applied left out)."""
    out = []
    for d in dirs:
        for path in sorted((K8S / d).glob("*.yaml")):
            if path.name != "kustomization.yaml" and path not in NOT_APPLIED:
                out.extend(load_docs(path))
    return out


def by_kind(kind: str, *dirs: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects(*dirs) if o["kind"] == kind}


def deployment(name: str) -> dict[str, Any]:
    return by_kind("Deployment", "base")[f"docstream-{name}"]


def container(deploy: dict[str, Any]) -> dict[str, Any]:
    containers = deploy["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, deploy["metadata"]["name"]
    result: dict[str, Any] = containers[0]
    return result


def env_values(deploy: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container(deploy).get("env", [])}


def configmap() -> dict[str, str]:
    data: dict[str, str] = by_kind("ConfigMap", "base")["docstream-config"]["data"]
    return data


def partitions() -> int:
    return int(configmap()["DOCSTREAM_TOPIC_PARTITIONS"])


def policy_bounds() -> tuple[int, int]:
    env = env_values(deployment("exporter"))
    return int(env["DOCSTREAM_SCALING__MIN_REPLICAS"]), int(env["DOCSTREAM_SCALING__MAX_REPLICAS"])


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize directory` renders."""
    assert KUBECTL is not None
    built = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert built.returncode == 0, built.stderr
    return [d for d in yaml.safe_load_all(built.stdout) if d]


def dashboard() -> dict[str, Any]:
    result: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return result


def panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in d["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in panels(dashboard()) for t in p.get("targets", [])]


def dashboard_queries() -> list[tuple[str, str]]:
    """Every PromQL query of the dashboard, with where it is: each panel's targets, and the series
    selectors of the template variables (`label_values(metric, label)`, `query_result(expr)`)."""
    d = dashboard()
    out = [(f"panel {p['title']!r}", t["expr"]) for p in panels(d) for t in p.get("targets", [])]
    for variable in d["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        inner = re.fullmatch(r"\s*(label_values|query_result)\((.*)\)\s*", text, re.DOTALL)
        assert inner, f"variable {variable['name']}: {text!r} is not label_values(...) or query_result(...)"
        function, args = inner.groups()
        selector = args if function == "query_result" else args.rpartition(",")[0] if "," in args else ""
        out.append((f"variable ${variable['name']}", selector))
    return out


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: every word that is not a function or an
    aggregation (followed by `(`), a keyword, a label, a string, a duration or a variable."""
    names = set(NAME_MATCHER.findall(expr))
    for pattern, replacement in PROMQL_CUTS:
        expr = pattern.sub(replacement, expr)
    for match in PROMQL_WORD.finditer(expr):
        word = match.group()
        if word.lower() in PROMQL_KEYWORDS or expr[match.end() :].lstrip().startswith("("):
            continue
        names.add(word)
    return names


# -- every file ------------------------------------------------------------------------------------


def test_every_yaml_file_parses_and_every_object_is_named_and_namespaced() -> None:
    files = yaml_files()
    assert len(files) > 10
    for path in files:
        docs = load_docs(path)
        assert docs, path
        if path.name == "kustomization.yaml" or path == ADAPTER_VALUES:
            continue
        for doc in docs:
            assert {"apiVersion", "kind", "metadata"} <= set(doc), path
            assert doc["metadata"].get("name"), path
            expected = None if doc["kind"] == "Namespace" else NAMESPACE
            assert doc["metadata"].get("namespace") == expected, (path, doc["metadata"]["name"])


# -- the Deployments -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GROUP_NAMES)
def test_each_group_has_a_deployment_running_its_command(name: str) -> None:
    deploy = deployment(name)
    c = container(deploy)
    assert c["command"] == COMMANDS[name]
    assert c["image"] == "docstream"
    assert {"configMapRef": {"name": "docstream-config"}} in c["envFrom"]
    assert "replicas" not in deploy["spec"], "the autoscaler owns the count; apply would reset it"


@pytest.mark.parametrize("name", GROUP_NAMES)
def test_each_group_waits_for_the_declared_topics(name: str) -> None:
    spec = deployment(name)["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    assert init["image"] == "docstream"
    assert init["command"][:2] == ["sh", "-c"]
    # as the pod's own principal: every topic of its grant visible (docstream acls check exits 0)
    assert "until docstream acls check;" in init["command"][2]
    assert init["envFrom"] == [
        e
        for e in container(deployment(name))["envFrom"]
        if e.get("secretRef", {}).get("name") != "docstream-blobs"
    ]
    sasl = [e for e in container(deployment(name))["env"] if e["name"].startswith("DOCSTREAM_SASL_")]
    assert init["env"] == sasl and len(sasl) == 2


@pytest.mark.parametrize("name", GROUP_NAMES)
def test_labels_selectors_and_the_disruption_budget_match(name: str) -> None:
    deploy = deployment(name)
    selector = deploy["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "docstream", "docstream.io/group": name}
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    pdb = by_kind("PodDisruptionBudget", "base")[f"docstream-{name}"]
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert pdb["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("name", GROUP_NAMES)
def test_resources_are_requested_and_limited(name: str) -> None:
    resources = container(deployment(name))["resources"]
    for key in ("cpu", "memory"):
        assert key in resources["requests"], key
        assert key in resources["limits"], key


@pytest.mark.parametrize("name", GROUP_NAMES)
def test_no_probes_and_the_reason_is_on_the_pod(name: str) -> None:
    """The workers serve no HTTP: no probes, an annotation says so, and rollouts are paced."""
    deploy = deployment(name)
    c = container(deploy)
    assert not {"livenessProbe", "readinessProbe", "startupProbe"} & set(c)
    assert "ports" not in c
    assert deploy["spec"]["template"]["metadata"]["annotations"]["docstream.io/probes"].startswith("none")
    assert deploy["spec"]["minReadySeconds"] > 0
    assert deploy["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}


@pytest.mark.parametrize("name", GROUP_NAMES)
def test_termination_grace_covers_the_graceful_shutdown(name: str) -> None:
    grace = deployment(name)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # the drain, then 15 s for the commit, the leave and the exit
    assert grace == SHUTDOWN_S[name] + 15


def test_the_exporter_is_reachable_and_carries_the_policy_bounds() -> None:
    deploy = deployment("exporter")
    c = container(deploy)
    command = c["command"]
    assert command[:2] == ["docstream", "exporter"]
    assert command[command.index("--host") + 1] == "0.0.0.0"
    port = int(command[command.index("--port") + 1])
    assert c["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"]["type"] == "Recreate"
    assert c["readinessProbe"]["httpGet"]["path"] == "/metrics"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    service = by_kind("Service", "base")["docstream-exporter"]
    assert service["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["port"] == port
    monitor = by_kind("ServiceMonitor", "monitoring")["docstream-exporter"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    low, high = policy_bounds()
    assert 0 < low <= high == partitions()


def test_the_warehouse_url_is_required_where_the_warehouse_is_used() -> None:
    """Without it the sink would write an embedded chDB into its emptyDir."""
    job = by_kind("Job", "base")["docstream-setup"]
    for spec in (deployment("warehouse")["spec"]["template"]["spec"], job["spec"]["template"]["spec"]):
        env = {e["name"]: e for e in spec["containers"][0]["env"]}
        ref = env["DOCSTREAM_WAREHOUSE__URL"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "docstream-warehouse", "key": "url"}


def test_the_setup_job_creates_topics_without_fixing_drift_and_migrates() -> None:
    job = by_kind("Job", "base")["docstream-setup"]
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "docstream topics ensure" in script and "--fix" not in script
    assert "docstream warehouse migrate" in script


def test_the_gpu_component_patches_ocr_with_one_gpu() -> None:
    (patch,) = load_docs(K8S / "gpu" / "ocr-gpu.yaml")
    assert (patch["kind"], patch["metadata"]["name"]) == ("Deployment", "docstream-ocr")
    (c,) = patch["spec"]["template"]["spec"]["containers"]
    assert c["name"] == container(deployment("ocr"))["name"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1


# -- autoscaling -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GROUP_NAMES)
def test_each_group_has_a_scaled_object_on_the_signal(name: str) -> None:
    so = by_kind("ScaledObject", "keda")[f"docstream-{name}"]
    spec = so["spec"]
    assert spec["scaleTargetRef"]["name"] == f"docstream-{name}"
    assert spec["scaleTargetRef"].get("kind", "Deployment") == "Deployment"
    low, high = policy_bounds()
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (low, high)
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= partitions()
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == BEHAVIOR
    (trigger,) = spec["triggers"]
    assert (trigger["type"], trigger["metricType"]) == ("prometheus", "AverageValue")
    meta = trigger["metadata"]
    assert meta["threshold"] == "1"
    assert meta["ignoreNullValues"] == "false"
    assert meta["serverAddress"].startswith("http")
    assert meta["query"] == f'max({SIGNAL}{{namespace="{NAMESPACE}", group="{group_id(name)}"}})'


@pytest.mark.parametrize("name", GROUP_NAMES)
def test_each_group_has_an_hpa_on_the_signal(name: str) -> None:
    hpa = by_kind("HorizontalPodAutoscaler", "hpa")[f"docstream-{name}"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": f"docstream-{name}",
    }
    low, high = policy_bounds()
    assert (spec["minReplicas"], spec["maxReplicas"]) == (low, high)
    assert 1 <= spec["minReplicas"] <= spec["maxReplicas"] <= partitions()
    (metric,) = spec["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"] == {
        "name": SIGNAL,
        "selector": {"matchLabels": {"group": group_id(name)}},
    }
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    assert spec["behavior"] == BEHAVIOR


def test_the_behaviour_repeats_the_policy_defaults() -> None:
    """The HPA's windows and scale-in step are the policy's own (docs/scaling.md)."""
    policy = ScalingSettings()
    assert BEHAVIOR["scaleUp"]["stabilizationWindowSeconds"] == policy.up_window_s
    assert BEHAVIOR["scaleDown"]["stabilizationWindowSeconds"] == policy.down_window_s
    assert BEHAVIOR["scaleDown"]["policies"] == [
        {"type": "Pods", "value": policy.max_scale_in, "periodSeconds": 120}
    ]
    assert (policy.min_replicas, policy.max_replicas) == policy_bounds()


def test_the_adapter_rule_serves_the_signal_per_group_and_namespace() -> None:
    (values,) = load_docs(ADAPTER_VALUES)
    assert values["rules"]["default"] is False
    (rule,) = values["rules"]["external"]
    assert rule["seriesQuery"].startswith(SIGNAL + "{")
    assert rule["name"]["as"] == SIGNAL
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}}
    assert rule["metricsQuery"] == "max(<<.Series>>{<<.LabelMatchers>>}) by (group)"


def test_the_kafka_trigger_example_is_not_applied() -> None:
    listed = yaml.safe_load((K8S / "keda" / "kustomization.yaml").read_text(encoding="utf-8"))["resources"]
    assert KAFKA_TRIGGER_EXAMPLE.name not in listed
    (example,) = [d for d in load_docs(KAFKA_TRIGGER_EXAMPLE) if d["kind"] == "ScaledObject"]
    assert example["spec"]["triggers"][0]["type"] == "kafka"


# -- kustomize -------------------------------------------------------------------------------------


@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_kustomizations_list_files_that_exist_and_every_manifest_is_listed(directory: str) -> None:
    here = K8S / directory
    k = yaml.safe_load((here / "kustomization.yaml").read_text(encoding="utf-8"))
    referenced: set[Path] = set()
    for entry in k.get("resources", []) + k.get("components", []):
        target = (here / entry).resolve()
        assert target.exists(), entry
        if target.is_dir():
            assert (target / "kustomization.yaml").exists(), entry
        referenced.add(target)
    for patch in k.get("patches", []):
        assert (here / patch["path"]).exists(), patch
        referenced.add((here / patch["path"]).resolve())
    for generator in k.get("configMapGenerator", []):
        for file in generator.get("files", []):
            assert (here / file).exists(), file
    manifests = {p.resolve() for p in here.glob("*.yaml") if p.name != "kustomization.yaml"}
    assert manifests - {p.resolve() for p in NOT_APPLIED} <= referenced


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_overlays_build(overlay: str) -> None:
    kinds = [d["kind"] for d in kustomize(K8S / overlay)]
    scaler = "HorizontalPodAutoscaler" if overlay == "hpa" else "ScaledObject"
    assert kinds.count(scaler) == len(GROUPS)
    assert kinds.count("Deployment") == len(GROUPS) + 2  # + the exporter and the API
    assert "ServiceMonitor" in kinds


def three_broker_settings(data: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a pod of the three-broker overlay reads from its ConfigMap (envFrom)."""
    for name in list(os.environ):
        if name.startswith(("DOCSTREAM_", "KAFKA_")):
            monkeypatch.delenv(name)
    for name, value in data.items():
        monkeypatch.setenv(name, value)
    return Settings()


def assert_three_brokers_three_replicas(settings: Settings) -> None:
    assert not settings.uses_local_broker
    servers = settings.bootstrap.split(",")
    assert len(servers) == len(set(servers)) == 3, servers
    for server in servers:
        host, _, port = server.rpartition(":")
        assert host and host == host.strip() and port.isdigit(), server
    assert settings.replication_factor == 3
    assert Replication.for_brokers(len(servers), settings.replication_factor) == Replication(3, 2)


def test_the_three_broker_patch_lists_three_brokers_and_sets_three_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (patch,) = load_docs(THREE_BROKERS / "configmap-kafka.yaml")
    assert (patch["kind"], patch["metadata"]["name"]) == ("ConfigMap", "docstream-config")
    assert set(patch["data"]) == {"KAFKA_BOOTSTRAP_SERVERS", "DOCSTREAM_REPLICATION_FACTOR"}
    assert_three_brokers_three_replicas(three_broker_settings({**configmap(), **patch["data"]}, monkeypatch))


@needs_kubectl
def test_the_three_broker_overlay_renders_the_list_and_the_replication(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rendered = kustomize(THREE_BROKERS)
    (config,) = [
        o for o in rendered if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "docstream-config"
    ]
    assert_three_brokers_three_replicas(three_broker_settings(config["data"], monkeypatch))
    assert config["data"]["DOCSTREAM_TOPIC_PARTITIONS"] == configmap()["DOCSTREAM_TOPIC_PARTITIONS"]
    # every process reads it: the setup Job (topics ensure), the exporter, the API and each group
    pods = [o for o in rendered if o["kind"] in {"Deployment", "Job"}]
    assert len(pods) == len(GROUPS) + 3
    for pod in pods:
        for c in pod["spec"]["template"]["spec"]["containers"]:
            assert {"configMapRef": {"name": "docstream-config"}} in c["envFrom"], pod["metadata"]["name"]


# -- the dashboard and the metric names ------------------------------------------------------------


def test_the_dashboard_has_a_datasource_and_a_group_variable() -> None:
    d = dashboard()
    assert d["schemaVersion"] >= 36 and d["uid"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["group"]["definition"] == "label_values(docstream_consumer_group_lag, group)"
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids))
    for panel in panels(d):
        for t in panel.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}", panel["title"]
            names = METRIC_NAME.findall(t["expr"])
            if any(n.startswith("docstream_consumer_group_") for n in names):
                assert '$group"' in t["expr"], (panel["title"], t["expr"])


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('docstream_consumer_group_lag{group=~"$group"}', {"docstream_consumer_group_lag"}),
        (
            "increase(docstream_exporter_refresh_errors_total[5m])",
            {"docstream_exporter_refresh_errors_total"},
        ),
        (
            "time() - docstream_exporter_last_refresh_timestamp_seconds",
            {"docstream_exporter_last_refresh_timestamp_seconds"},
        ),
        (
            'max by (group) (a{status="ERR"} == 1) * 3 or on (group) sum without (topic) (b:r5m offset 5m)',
            {"a", "b:r5m"},
        ),
        ('rate(kafka_consumergroup_lag{topic="x"}[$__rate_interval]) > 1e3', {"kafka_consumergroup_lag"}),
        ('up{job="docstream"} unless ignoring(instance) group_left(a, b) c', {"up", "c"}),
        ('{__name__="process_cpu_seconds_total", status="OK"}', {"process_cpu_seconds_total"}),
        ("histogram_quantile(0.9, sum by (le) (rate(x_bucket[5m])))", {"x_bucket"}),
        ("vector($objective_s) + scalar(y)", {"y"}),
    ],
)
def test_promql_metric_names(expr: str, names: set[str]) -> None:
    """The extraction the dashboard checks rely on, on its own; the regex on `docstream_` names
    alone would miss `kafka_consumergroup_lag`, `up` and the like."""
    assert promql_metric_names(expr) == names


def test_every_dashboard_query_reads_only_metrics_the_exporter_exports() -> None:
    """Each panel target and template variable of the dashboard, its metric names compared with
    `consumers.ops.exporter.METRIC_NAMES`: a name the exporter does not write would draw nothing."""
    queries = dashboard_queries()
    assert len(queries) == len(dashboard_exprs()) + 1  # the targets and $group
    for where, expr in queries:
        names = promql_metric_names(expr)
        assert names or expr in NO_SERIES, f"{where}: no metric in {expr!r}"
        unknown = sorted(names - set(METRIC_NAMES))
        assert not unknown, f"{where}: {expr!r} reads {unknown}, not exported by consumers/ops/exporter.py"


def test_the_dashboard_shows_every_metric_family_the_exporter_exports() -> None:
    used = {name for _, expr in dashboard_queries() for name in promql_metric_names(expr)}
    assert set(METRIC_NAMES) <= used, sorted(set(METRIC_NAMES) - used)


def test_the_autoscalers_queries_read_only_exported_metrics() -> None:
    """The same for the PromQL outside the dashboard: the ScaledObjects' (also the example's)."""
    queries = [
        t["metadata"]["query"]
        for path in sorted((K8S / "keda").glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for so in load_docs(path)
        for t in so["spec"].get("triggers", [])  # a TriggerAuthentication has none
        if t["type"] == "prometheus"
    ]
    assert len(queries) == len(GROUPS)
    for query in queries:
        assert promql_metric_names(query) == {SIGNAL}, query


def test_every_metric_named_in_the_manifests_dashboard_and_docs_is_exported() -> None:
    files = [p for p in K8S.rglob("*") if p.is_file()] + [DOCS]
    named: dict[str, set[str]] = {}
    for path in files:
        for name in METRIC_NAME.findall(path.read_text(encoding="utf-8")):
            named.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert SIGNAL in named
    unknown = {name: sorted(where) for name, where in named.items() if name not in METRIC_NAMES}
    assert not unknown, unknown


# -- schemas ---------------------------------------------------------------------------------------

SCHEMAS = Path(__file__).resolve().parent / "k8s_schemas"
# The oldest and the newest Kubernetes that kubernetes-validate (requirements.lock) bundles schemas of.
KUBERNETES_VERSIONS = ("1.25", "1.37")
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): SCHEMAS / "keda" / "scaledobject-keda-v1alpha1.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): SCHEMAS
    / "keda"
    / "triggerauthentication-keda-v1alpha1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SCHEMAS
    / "monitoring.coreos.com"
    / "servicemonitor-monitoring-v1.json",
}
# YAML under infra/k8s that holds no object to validate, and why.
NOT_VALIDATED = {
    ADAPTER_VALUES: "Helm values for prometheus-adapter, not an object",
    **{
        k: "kustomize's own configuration (Kustomization, Component): kustomize checks it when it builds"
        for k in K8S.rglob("kustomization.yaml")
    },
}


def patch_files() -> set[Path]:
    """Strategic-merge patches: partial objects, validated as the overlays render them."""
    out = set()
    for k in K8S.rglob("kustomization.yaml"):
        for patch in yaml.safe_load(k.read_text(encoding="utf-8")).get("patches", []):
            out.add(k.parent / patch["path"])
    return out


@functools.cache
def crd_validator(path: Path) -> Any:
    schema = json.loads(path.read_text(encoding="utf-8"))
    cls = validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def kubernetes_errors(obj: dict[str, Any], version: str) -> list[str]:
    """The first error of kubernetes-validate's strict schema (no other fields than declared)."""
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = ".".join(str(p) for p in e.path) or "(top)"
        return [f"Kubernetes {e.version} schema (strict), at {where}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"{e.message}: vendor its CRD's schema in tests/unit/k8s_schemas/ (README.md there)"]
    return []


def schema_errors(obj: dict[str, Any], version: str) -> list[str]:
    """Why `obj` does not validate against its schema for Kubernetes `version` (empty: it does)."""
    if not isinstance(obj, dict) or not {"apiVersion", "kind"} <= set(obj):
        return ["not a Kubernetes object (no apiVersion or kind)"]
    crd = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    if crd is None:
        return kubernetes_errors(obj, version)
    errors = [
        f"{crd.relative_to(ROOT)}, at {'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
        for e in sorted(crd_validator(crd).iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path])
    ]
    # A CRD's schema leaves `metadata` to the API server: ObjectMeta from the Kubernetes schemas.
    holder = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj.get("metadata")}
    return errors + kubernetes_errors(holder, version)


_checked: dict[tuple[str, str], list[str]] = {}


def manifest_errors(source: str, docs: list[dict[str, Any]], version: str) -> list[str]:
    """One line per error: the file or overlay, the object (kind/name) and the schema's error."""
    out: list[str] = []
    for obj in docs:
        key = (json.dumps(obj, sort_keys=True, default=str), version)
        if key not in _checked:  # the overlays render the same objects several times
            _checked[key] = schema_errors(obj, version)
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = f"{obj.get('kind')}/{meta.get('name') if isinstance(meta, dict) else None}"
        out.extend(f"{source}: {name}: {error}" for error in _checked[key])
    return out


def manifest_files() -> list[Path]:
    skipped = set(NOT_VALIDATED) | patch_files()
    return [p for p in yaml_files() if p not in skipped]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_against_its_schema(version: str) -> None:
    files = manifest_files()
    docs = {path: load_docs(path) for path in files}
    kinds = {d["kind"] for ds in docs.values() for d in ds}
    assert {"Deployment", "Job", "HorizontalPodAutoscaler", "ScaledObject", "ServiceMonitor"} <= kinds
    assert sum(len(ds) for ds in docs.values()) >= 25
    errors = [
        e for path, ds in docs.items() for e in manifest_errors(str(path.relative_to(ROOT)), ds, version)
    ]
    assert not errors, "\n".join(errors)


def test_every_yaml_file_is_validated_or_has_a_reason_not_to_be() -> None:
    unaccounted = set(yaml_files()) - set(manifest_files()) - set(NOT_VALIDATED) - patch_files()
    assert not unaccounted
    assert patch_files() == {K8S / "gpu" / "ocr-gpu.yaml", THREE_BROKERS / "configmap-kafka.yaml"}


def rendered() -> dict[str, Path]:
    """What the rendered-output check builds: every kustomization that is not a Component."""
    return {
        d: K8S / d
        for d in KUSTOMIZATIONS
        if yaml.safe_load((K8S / d / "kustomization.yaml").read_text(encoding="utf-8"))["kind"]
        == "Kustomization"
    }


@needs_kubectl
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_overlay_validates_against_the_schemas(version: str, tmp_path: Path) -> None:
    # the GPU Component renders only inside an overlay: keda/ with it, as docs/kubernetes.md adds it
    gpu = tmp_path / "keda-gpu"
    gpu.mkdir()
    up = Path(os.path.relpath(K8S, gpu))
    (gpu / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {up / 'keda'}\ncomponents:\n  - {up / 'gpu'}\n",
        encoding="utf-8",
    )
    builds = {
        **{f"kubectl kustomize infra/k8s/{d}": path for d, path in rendered().items()},
        "keda + gpu": gpu,
    }
    errors = []
    for source, directory in builds.items():
        docs = kustomize(directory)
        assert docs, source
        errors += manifest_errors(source, docs, version)
    assert not errors, "\n".join(errors)


BROKEN = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: docstream-broken, namespace: docstream}
spec:
  replica: 2
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      containers: [{name: c, image: x}]
---
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: docstream-broken, namespace: docstream, labelz: {}}
spec:
  scaleTargetRef: {name: docstream-broken}
  minReplicaCount: one
  triggers: [{metadata: {query: up}, metricType: AverageValue}]
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: docstream-broken, namespace: docstream}
spec:
  selector: {matchLabels: {app: x}}
  endpoint: [{port: metrics}]
---
apiVersion: example.com/v1
kind: Unknown
metadata: {name: docstream-broken}
"""


def test_the_schema_check_fails_on_broken_manifests(tmp_path: Path) -> None:
    """The same check on a file with mistakes in each object: each error names the file, the
    object and what the schema says."""
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN, encoding="utf-8")
    errors = manifest_errors(str(path), load_docs(path), KUBERNETES_VERSIONS[-1])
    text = "\n".join(errors)
    assert all(e.startswith(f"{path}: ") for e in errors), text
    deployment_errors = [e for e in errors if ": Deployment/docstream-broken: " in e]
    assert len(deployment_errors) == 1, text  # kubernetes-validate reports the first one
    assert "Kubernetes 1.37 schema (strict)" in deployment_errors[0]
    assert "at spec: Additional properties are not allowed ('replica' was unexpected)" in deployment_errors[0]
    so = [e for e in errors if ": ScaledObject/docstream-broken: " in e]
    assert any("at spec.minReplicaCount: 'one' is not of type 'integer'" in e for e in so), text
    assert any("at spec.triggers.0: 'type' is a required property" in e for e in so), text
    assert any("scaledobject-keda-v1alpha1.json" in e for e in so), text
    assert any("at metadata: " in e and "'labelz' was unexpected" in e for e in so), text
    monitor = "\n".join(e for e in errors if ": ServiceMonitor/docstream-broken: " in e)
    assert (
        "servicemonitor-monitoring-v1.json, at spec: " in monitor and "'endpoint' was unexpected" in monitor
    )
    (unknown,) = [e for e in errors if ": Unknown/docstream-broken: " in e]
    assert "Couldn't find schema for kind Unknown" in unknown and "tests/unit/k8s_schemas/" in unknown


@pytest.mark.parametrize("key", sorted(CRD_SCHEMAS), ids=lambda key: "-".join(key))
def test_the_vendored_crd_schemas_are_valid_and_name_their_source(key: tuple[str, str]) -> None:
    path = CRD_SCHEMAS[key]
    schema = json.loads(path.read_text(encoding="utf-8"))
    validators.validator_for(schema).check_schema(schema)
    assert schema["properties"]["apiVersion"]["enum"] == [key[0]]
    assert schema["properties"]["kind"]["enum"] == [key[1]]
    assert re.search(r"from github\.com/\S+ v\S+ \([0-9a-f]{40}\) \S+\.yaml;", schema["$comment"]), schema[
        "$comment"
    ]
    readme = (SCHEMAS / "README.md").read_text(encoding="utf-8")
    assert str(path.relative_to(SCHEMAS)) in readme
