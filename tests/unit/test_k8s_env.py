"""What a pod under infra/k8s is given is what it uses: environment variables, Secrets, volumes; and
each workload is to Kafka the principal it should be.

Every variable a manifest sets (`env[]`, and `envFrom[]`: each key of the named ConfigMap, or of
the Secret as docs/kubernetes.md lists it) must be one a docstream process reads: a name derived
from the `Settings` model (its prefix, nested delimiter and aliases, recursively), or one of the
few variables another library reads (`FOREIGN_ENV`, each with its reader). Settings has
extra="ignore", so a misspelt DOCSTREAM_* variable would otherwise be ignored without a word.

Every Secret a pod names (`secretKeyRef`, `secretRef`, a secret volume) must be created somewhere
the operator can see: a Secret or secretGenerator in the manifests, or the table of Secrets in
docs/kubernetes.md ("Secrets an operator creates"); a pod would otherwise wait in
CreateContainerConfigError. Every volume a pod declares is mounted by one of its containers, and
every mount names a declared volume.

Every workload authenticates as its own principal (docstream.principals): a group's Deployment
(label `docstream.io/group`) as that group, the API as `api`, the exporter as `ops`, the setup Job
as `admin`. Each of its containers takes DOCSTREAM_SASL_USERNAME / DOCSTREAM_SASL_PASSWORD from
the Secret `docstream-kafka-<principal>` (keys `username`, `password`) and mounts the brokers' CA
(Secret `docstream-kafka-ca`) where the ConfigMap's DOCSTREAM_SSL_CA_LOCATION points; a KEDA Kafka
trigger authenticates with its group's Secret.

`problems()` and `principal_problems()` are the checks, pure functions of parsed manifests; they run
on the files as written, on the overlays as kubectl renders them, and on made-up manifests that
must fail.
"""

from __future__ import annotations

import posixpath
import re
import shutil
import subprocess
import types
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo

from docstream.principals import ADMIN, API, OPS, PRINCIPALS
from docstream.settings import Settings
from docstream.topology import resolve_group

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
DOCS = ROOT / "docs" / "kubernetes.md"
KUBECTL = shutil.which("kubectl")
SECRETS_HEADING = "## Secrets an operator creates"
NOT_APPLIED = {K8S / "keda" / "kafka-trigger.example.yaml", K8S / "hpa" / "prometheus-adapter-values.yaml"}

# Variables that no Settings field reads and a library in the image does, with where it reads them.
# Only what the manifests or the documented Secrets set belongs here.
FOREIGN_ENV: dict[str, str] = {
    "AWS_ACCESS_KEY_ID": "botocore (boto3's S3 client): botocore/credentials.py, EnvProvider.ACCESS_KEY",
    "AWS_SECRET_ACCESS_KEY": "botocore: botocore/credentials.py, EnvProvider.SECRET_KEY",
    # Not AWS_REGION: botocore reads it only in its "auto" defaults mode on AWS compute.
    "AWS_DEFAULT_REGION": "botocore: botocore/configprovider.py, the client's `region`",
}
# Where a kind keeps its pod spec.
POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}


# -- the names the code reads ----------------------------------------------------------------------


def _aliases(info: FieldInfo) -> list[str]:
    alias = info.validation_alias
    if isinstance(alias, str):
        return [alias]
    if isinstance(alias, AliasChoices):
        return [choice for choice in alias.choices if isinstance(choice, str)]
    return []


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation admits (`Model`, `Model | None`, ...)."""
    candidates = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    if typing.get_origin(annotation) is typing.Union:
        candidates = typing.get_args(annotation)
    return [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]


def settings_env_names(settings: type[BaseModel] = Settings) -> frozenset[str]:
    """Every environment variable `settings` reads, upper case: `<prefix><FIELD>` or the field's
    aliases (which pydantic-settings reads as they are, without the prefix), and for a nested model
    its own name (a JSON object) and each of its fields after the nested delimiter, recursively."""
    config = settings.model_config
    prefix = str(config.get("env_prefix", ""))
    delimiter = config.get("env_nested_delimiter")
    names: set[str] = set()

    def walk(model: type[BaseModel], stem: str | None) -> None:
        for name, info in model.model_fields.items():
            if stem is None:
                here = _aliases(info) or [prefix + name]
            else:
                here = [f"{stem}{delimiter}{segment}" for segment in (name, *_aliases(info))]
            names.update(h.upper() for h in here)
            if delimiter:
                for nested in _models(info.annotation):
                    for h in here:
                        walk(nested, h)

    walk(settings, None)
    return frozenset(names)


READ = settings_env_names() | set(FOREIGN_ENV)


# -- the manifests ---------------------------------------------------------------------------------


@dataclass
class Known:
    """What exists for a pod to name: ConfigMaps and Secrets with their keys (None: keys unknown)."""

    configmaps: dict[str, set[str] | None] = field(default_factory=dict)
    secrets: dict[str, set[str] | None] = field(default_factory=dict)


def catalogue(
    objects: Iterable[dict[str, Any]],
    kustomizations: Iterable[dict[str, Any]] = (),
    documented: dict[str, set[str]] | None = None,
) -> Known:
    """The ConfigMaps and Secrets that the objects, kustomize's generators and the documented list
    create (a ConfigMap's patches add their keys to the same name)."""
    known = Known()
    for obj in objects:
        if obj.get("kind") in {"ConfigMap", "Secret"}:
            written = set(obj.get("data") or {}) | set(obj.get("stringData") or {})
            table = known.configmaps if obj["kind"] == "ConfigMap" else known.secrets
            table[obj["metadata"]["name"]] = (table.get(obj["metadata"]["name"]) or set()) | written
    for k in kustomizations:
        for kind, generated in (("configMapGenerator", known.configmaps), ("secretGenerator", known.secrets)):
            for generator in k.get(kind, []):
                keys = {literal.partition("=")[0] for literal in generator.get("literals", [])}
                keys |= {Path(f).name for f in generator.get("files", [])}
                # keys of `envs` files are not read here: unknown keys, so every key is accepted
                generated[generator["name"]] = None if generator.get("envs") else keys
    for name, keys in (documented or {}).items():
        known.secrets.setdefault(name, keys)
    return known


def documented_secrets(text: str) -> dict[str, set[str]]:
    """The table under SECRETS_HEADING: each row's Secret (first cell) and its keys (the
    backquoted names of the second cell)."""
    section = text.partition(SECRETS_HEADING)[2].partition("\n## ")[0]
    out: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and (name := re.fullmatch(r"`([a-z0-9.-]+)`", cells[0])):
            out[name.group(1)] = set(re.findall(r"`([^`]+)`", cells[1]))
    return out


def pod_specs(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    path = POD_SPEC_PATHS.get(obj.get("kind", ""))
    spec: Any = obj
    for step in path or ("-",):
        spec = spec.get(step) if isinstance(spec, dict) else None
    if isinstance(spec, dict):
        yield spec


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def problems(
    sourced: Iterable[tuple[str, dict[str, Any]]], known: Known, *, volumes: bool = True
) -> list[str]:
    """One line per variable nobody reads, Secret or ConfigMap nobody creates, volume nobody mounts
    and mount of no volume, in the pods of `sourced` ((where, object) pairs). `volumes=False` for
    strategic-merge patches, whose volumes are the patched object's."""
    out: list[str] = []
    for where, obj in sourced:
        for spec in pod_specs(obj):
            at = f"{where}: {obj['kind']}/{obj['metadata']['name']}"
            for c in _containers(spec):
                out += _env_problems(f"{at}: container {c.get('name')}", c, known)
            if volumes:
                out += _volume_problems(at, spec, known)
    return out


def _unread(where: str, names: Iterable[str], origin: str) -> list[str]:
    return [
        f"{where}: {name} ({origin}) is read by no Settings field and is not in FOREIGN_ENV"
        for name in sorted(names)
        if name.upper() not in READ
    ]


def _env_problems(where: str, c: dict[str, Any], known: Known) -> list[str]:
    out = _unread(where, [e["name"] for e in c.get("env", [])], "env")
    for e in c.get("env", []):
        source = e.get("valueFrom") or {}
        if ref := source.get("secretKeyRef"):
            out += _secret_problems(where, ref["name"], ref.get("key"), known)
        if (ref := source.get("configMapKeyRef")) and not ref.get("optional"):
            keys = known.configmaps.get(ref["name"], set())
            if keys is not None and ref["key"] not in keys:
                out.append(f"{where}: configMapKeyRef {ref['name']}/{ref['key']}: no such ConfigMap key")
    for source in c.get("envFrom", []):
        prefix = source.get("prefix", "")
        if ref := source.get("configMapRef"):
            keys = known.configmaps.get(ref["name"])
            if ref["name"] not in known.configmaps:
                out.append(f"{where}: envFrom ConfigMap {ref['name']} is in no manifest")
            out += _unread(where, [prefix + k for k in keys or ()], f"key of ConfigMap {ref['name']}")
        if ref := source.get("secretRef"):
            out += _secret_problems(where, ref["name"], None, known)
            secret_keys = known.secrets.get(ref["name"]) or set()
            out += _unread(where, [prefix + k for k in secret_keys], f"key of Secret {ref['name']}")
    return out


def _secret_problems(where: str, name: str, key: str | None, known: Known) -> list[str]:
    if name not in known.secrets:
        return [
            f"{where}: Secret {name} is created by no manifest and not listed under"
            f" {SECRETS_HEADING!r} in docs/kubernetes.md"
        ]
    keys = known.secrets[name]
    if key is not None and keys is not None and key not in keys:
        return [f"{where}: Secret {name} has no key {key!r} (it has {sorted(keys)})"]
    return []


def _volume_problems(where: str, spec: dict[str, Any], known: Known) -> list[str]:
    declared = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = [
        (c.get("name"), m["name"])
        for c in _containers(spec)
        for m in [*c.get("volumeMounts", []), *c.get("volumeDevices", [])]
    ]
    out = [
        f"{where}: container {c} mounts volume {v!r}, which the pod does not declare"
        for c, v in mounts
        if v not in declared
    ]
    mounted = {v for _, v in mounts}
    for name, volume in declared.items():
        secrets = [volume["secret"]["secretName"]] if "secret" in volume else []
        secrets += [
            s["secret"]["name"] for s in (volume.get("projected") or {}).get("sources", []) if "secret" in s
        ]
        if name not in mounted:
            what = f"secret volume {name!r} (Secret {', '.join(secrets)})" if secrets else f"volume {name!r}"
            out.append(f"{where}: {what} is mounted by no container")
        for secret in secrets:
            out += _secret_problems(f"{where}: volume {name!r}", secret, None, known)
    return out


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def written() -> tuple[list[tuple[str, dict[str, Any]]], list[dict[str, Any]]]:
    """(where, object) for every object as written under infra/k8s, and the kustomizations."""
    objects, kustomizations = [], []
    for path in sorted(K8S.rglob("*.yaml")):
        if path in NOT_APPLIED:
            continue
        if path.name == "kustomization.yaml":
            kustomizations += yaml_docs(path)
        else:
            objects += [(str(path.relative_to(ROOT)), d) for d in yaml_docs(path)]
    return objects, kustomizations


def patch_sources(kustomizations: Iterable[dict[str, Any]]) -> set[str]:
    """The strategic-merge patches, as `written()` names their files."""
    return {
        str((k.parent / p["path"]).relative_to(ROOT))
        for k in K8S.rglob("kustomization.yaml")
        for p in yaml.safe_load(k.read_text(encoding="utf-8")).get("patches", [])
    }


def real_known() -> Known:
    objects, kustomizations = written()
    return catalogue([o for _, o in objects], kustomizations, documented_secrets(DOCS.read_text("utf-8")))


# -- the real manifests ----------------------------------------------------------------------------


def test_every_manifest_sets_only_what_is_read_and_names_only_what_exists() -> None:
    objects, kustomizations = written()
    patches = patch_sources(kustomizations)
    known = real_known()
    assert {"docstream-config"} <= set(known.configmaps)
    pods = [(w, o) for w, o in objects if list(pod_specs(o))]
    assert len(pods) >= 8  # five groups, the exporter, the API, the setup Job (+ the GPU patch)
    found = problems([(w, o) for w, o in pods if w not in patches], known)
    found += problems([(w, o) for w, o in pods if w in patches], known, volumes=False)
    assert not found, "\n".join(found)


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
@pytest.mark.parametrize("overlay", ["keda", "hpa", "three-brokers"])
def test_every_rendered_overlay_sets_only_what_is_read(overlay: str) -> None:
    assert KUBECTL is not None
    built = subprocess.run(
        [KUBECTL, "kustomize", str(K8S / overlay)], capture_output=True, text=True, timeout=60, check=False
    )
    assert built.returncode == 0, built.stderr
    rendered = [d for d in yaml.safe_load_all(built.stdout) if d]
    known = catalogue(rendered, (), documented_secrets(DOCS.read_text("utf-8")))
    found = problems([(f"kubectl kustomize infra/k8s/{overlay}", o) for o in rendered], known)
    assert not found, "\n".join(found)


def test_the_documented_secrets_are_used_and_their_keys_are_read() -> None:
    """docs/kubernetes.md lists what an operator creates: each Secret is named by some pod, and each
    key a pod takes whole (envFrom) is a variable something reads."""
    documented = documented_secrets(DOCS.read_text("utf-8"))
    assert {"docstream-warehouse", "docstream-blobs", "docstream-kafka-ca"} <= set(documented)
    assert {f"docstream-kafka-{p}" for p in PRINCIPALS} <= set(documented)
    text = "\n".join(path.read_text("utf-8") for path in K8S.rglob("*.yaml"))
    for name, keys in documented.items():
        assert keys, name
        assert re.search(rf"name: {re.escape(name)}\b", text), f"{name} is named by no manifest"
        if re.search(rf"secretRef:\s*\n\s*name: {re.escape(name)}\b", text):
            assert {k.upper() for k in keys} <= READ, (name, sorted(keys - READ))


@pytest.mark.skipif(find_spec("botocore") is None, reason="botocore is not installed")
def test_botocore_reads_the_foreign_variables() -> None:
    spec = find_spec("botocore")
    assert spec is not None and spec.submodule_search_locations
    source = "\n".join(
        p.read_text("utf-8")
        for p in Path(next(iter(spec.submodule_search_locations))).glob("*.py")
        if p.name in {"credentials.py", "configprovider.py"}
    )
    for name in FOREIGN_ENV:
        assert f"'{name}'" in source or f'"{name}"' in source, name


# -- the names read --------------------------------------------------------------------------------


def test_the_names_read_are_derived_from_settings() -> None:
    names = settings_env_names()
    assert {"DOCSTREAM_HOME", "DOCSTREAM_BLOB_URL", "DOCSTREAM_API__HOST", "DOCSTREAM_API"} <= names
    assert {"DOCSTREAM_RUNTIME__RETRY__MAX_ATTEMPTS", "DOCSTREAM_SCALING__MAX_REPLICAS"} <= names
    assert {"KAFKA_BOOTSTRAP_SERVERS", "DOCSTREAM_BOOTSTRAP_SERVERS", "KAFKA_SASL_PASSWORD"} <= names
    # a field with aliases is read only by them, not by its prefixed name's other spellings
    assert "DOCSTREAM_KAFKA_BOOTSTRAP_SERVERS" not in names
    assert "DOCSTREAM_RUNTIME__NO_SUCH_KNOB" not in names
    assert not names & set(FOREIGN_ENV)


@pytest.mark.parametrize(
    ("name", "value", "read"),
    [
        ("DOCSTREAM_RUNTIME__RETRY__MAX_ATTEMPTS", "7", lambda s: s.runtime.retry.max_attempts == 7),
        ("DOCSTREAM_API__HOST", "0.0.0.0", lambda s: s.api.host == "0.0.0.0"),
        ("KAFKA_BOOTSTRAP_SERVERS", "k:9092", lambda s: s.bootstrap_servers == "k:9092"),
        ("DOCSTREAM_SASL_USERNAME", "u", lambda s: s.sasl_username == "u"),
        ("DOCSTREAM_WAREHOUSE__URL", "http://h:8123", lambda s: s.warehouse.url == "http://h:8123"),
    ],
)
def test_a_derived_name_is_one_settings_really_reads(
    name: str, value: str, read: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert name in settings_env_names()
    monkeypatch.setenv(name, value)
    assert read(Settings())


# -- made-up manifests that must fail --------------------------------------------------------------


def pod(
    *, env: list[Any] | None = None, env_from: list[Any] | None = None, volumes: list[Any] | None = None
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "c", "image": "docstream", "env": env or [], "envFrom": env_from or []}
    c["volumeMounts"] = [{"name": "home", "mountPath": "/var/lib/docstream"}]
    spec = {
        "containers": [c],
        "volumes": volumes if volumes is not None else [{"name": "home", "emptyDir": {}}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "made-up"},
        "spec": {"template": {"spec": spec}},
    }


CONFIG = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "cfg"},
    "data": {"DOCSTREAM_HOME": "/x"},
}
SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "in-manifest"}, "data": {"url": "eA=="}}


def check(obj: dict[str, Any], documented: dict[str, set[str]] | None = None) -> list[str]:
    return problems([("made-up.yaml", obj)], catalogue([CONFIG, SECRET, obj], (), documented))


def test_a_made_up_manifest_that_is_right_passes() -> None:
    obj = pod(
        env=[
            {"name": "DOCSTREAM_API__HOST", "value": "0.0.0.0"},
            {"name": "AWS_DEFAULT_REGION", "value": "eu-west-1"},
            {
                "name": "DOCSTREAM_WAREHOUSE__URL",
                "valueFrom": {"secretKeyRef": {"name": "in-manifest", "key": "url"}},
            },
        ],
        env_from=[{"configMapRef": {"name": "cfg"}}, {"secretRef": {"name": "listed", "optional": True}}],
    )
    assert check(obj, {"listed": {"AWS_ACCESS_KEY_ID"}}) == []


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (
            pod(env=[{"name": "DOCSTREAM_API__HOTS", "value": "0.0.0.0"}]),
            "DOCSTREAM_API__HOTS (env) is read by no",
        ),
        (pod(env=[{"name": "AWS_REGION", "value": "eu-west-1"}]), "AWS_REGION (env) is read by no"),
        (
            pod(env_from=[{"configMapRef": {"name": "cfg"}, "prefix": "X_"}]),
            "X_DOCSTREAM_HOME (key of ConfigMap cfg) is read by no",
        ),
        (
            pod(env_from=[{"configMapRef": {"name": "nowhere"}}]),
            "envFrom ConfigMap nowhere is in no manifest",
        ),
        (
            pod(
                env=[
                    {
                        "name": "DOCSTREAM_WAREHOUSE__URL",
                        "valueFrom": {"secretKeyRef": {"name": "nowhere", "key": "url"}},
                    }
                ]
            ),
            "Secret nowhere is created by no manifest and not listed",
        ),
        (
            pod(
                env=[
                    {
                        "name": "DOCSTREAM_WAREHOUSE__URL",
                        "valueFrom": {"secretKeyRef": {"name": "in-manifest", "key": "dsn"}},
                    }
                ]
            ),
            "Secret in-manifest has no key 'dsn'",
        ),
        (
            pod(env_from=[{"secretRef": {"name": "nowhere", "optional": True}}]),
            "Secret nowhere is created by no",
        ),
        (
            pod(env_from=[{"secretRef": {"name": "listed"}}]),
            "AWS_SECRET_KEY (key of Secret listed) is read by no",
        ),
        (
            pod(
                volumes=[
                    {"name": "home", "emptyDir": {}},
                    {"name": "tls", "secret": {"secretName": "in-manifest"}},
                ]
            ),
            "secret volume 'tls' (Secret in-manifest) is mounted by no container",
        ),
        (
            pod(
                volumes=[
                    {"name": "home", "emptyDir": {}},
                    {"name": "tls", "secret": {"secretName": "nowhere"}},
                ]
            ),
            "volume 'tls': Secret nowhere is created by no manifest",
        ),
        (pod(volumes=[]), "container c mounts volume 'home', which the pod does not declare"),
    ],
)
def test_a_made_up_manifest_with_a_mistake_fails(obj: dict[str, Any], expected: str) -> None:
    found = check(obj, {"listed": {"AWS_SECRET_KEY"}})
    assert any(expected in line for line in found), found
    assert all(line.startswith("made-up.yaml: Deployment/made-up: ") for line in found), found


def test_documented_secrets_are_read_from_the_table() -> None:
    text = (
        "# x\n\n## Secrets an operator creates\n\n| Secret | keys | required |\n|---|---|---|\n"
        "| `docstream-a` | `url` | yes |\n| `docstream-b` | `K_1`, `K_2` (or none) | no |\n"
        "\n## Next\n\n| `docstream-c` | `nope` |\n"
    )
    assert documented_secrets(text) == {"docstream-a": {"url"}, "docstream-b": {"K_1", "K_2"}}


# -- who each workload is to Kafka -----------------------------------------------------------------

SASL_KEYS = {"DOCSTREAM_SASL_USERNAME": "username", "DOCSTREAM_SASL_PASSWORD": "password"}
CA_SECRET = "docstream-kafka-ca"
NAMED_PRINCIPALS = {
    ("Deployment", "docstream-api"): API,
    ("Deployment", "docstream-exporter"): OPS,
    ("Job", "docstream-setup"): ADMIN,
}


def principal_of(obj: dict[str, Any]) -> str | None:
    """The principal a workload authenticates as: a group's Deployment as its group (label
    `docstream.io/group`), the API, the exporter and the setup Job by name; None: not known."""
    labels = obj["metadata"].get("labels") or {}
    if obj["kind"] == "Deployment" and "docstream.io/group" in labels:
        return str(labels["docstream.io/group"])
    return NAMED_PRINCIPALS.get((obj["kind"], obj["metadata"]["name"]))


def secret_name(principal: str) -> str:
    return f"docstream-kafka-{principal}"


def principal_problems(sourced: Iterable[tuple[str, dict[str, Any]]], ca_location: str) -> list[str]:
    """One line per workload with no known principal, per container whose SASL user or password is
    not its principal's Secret, and per container that does not mount the CA at `ca_location`."""
    out: list[str] = []
    ca_dir, ca_file = posixpath.split(ca_location)
    for where, obj in sourced:
        for spec in pod_specs(obj):
            at = f"{where}: {obj['kind']}/{obj['metadata']['name']}"
            principal = principal_of(obj)
            if principal not in PRINCIPALS:
                out.append(f"{at}: authenticates as no principal of docstream.principals ({principal})")
                continue
            ca_volumes = {
                v["name"]
                for v in spec.get("volumes", [])
                if (v.get("secret") or {}).get("secretName") == CA_SECRET
                and ca_file in {i["path"] for i in v["secret"].get("items", [{"path": ca_file}])}
            }
            for c in _containers(spec):
                env = {e["name"]: e for e in c.get("env", [])}
                for name, key in SASL_KEYS.items():
                    ref = (env.get(name, {}).get("valueFrom") or {}).get("secretKeyRef")
                    wanted = {"name": secret_name(principal), "key": key}
                    if ref != wanted:
                        out.append(
                            f"{at}: container {c.get('name')}: {name} must come from {wanted} "
                            f"(principal {principal}), not {ref}"
                        )
                mounted = {m["name"] for m in c.get("volumeMounts", []) if m.get("mountPath") == ca_dir}
                if not mounted & ca_volumes:
                    out.append(
                        f"{at}: container {c.get('name')} does not mount Secret {CA_SECRET} at {ca_dir}"
                    )
    return out


def workloads(objects: Iterable[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    return [(w, o) for w, o in objects if list(pod_specs(o))]


def ca_location() -> str:
    """Where the ConfigMap of base/ says the CA is (the overlays patch other keys only)."""
    (config,) = yaml_docs(K8S / "base" / "configmap.yaml")
    return str(config["data"]["DOCSTREAM_SSL_CA_LOCATION"])


def test_each_workload_authenticates_as_the_principal_of_its_group() -> None:
    objects, kustomizations = written()
    patches = patch_sources(kustomizations)
    pods = [(w, o) for w, o in workloads(objects) if w not in patches]
    assert principal_problems(pods, ca_location()) == []
    seen = {principal_of(o) for _, o in pods}
    assert seen == set(PRINCIPALS), "every principal is some workload's, and only those"
    by_name = {o["metadata"]["name"]: principal_of(o) for _, o in pods}
    assert by_name["docstream-ocr"] == "ocr" and by_name["docstream-warehouse"] == "warehouse"


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
@pytest.mark.parametrize("overlay", ["keda", "hpa", "three-brokers"])
def test_each_rendered_workload_authenticates_as_its_principal(overlay: str) -> None:
    assert KUBECTL is not None
    built = subprocess.run(
        [KUBECTL, "kustomize", str(K8S / overlay)], capture_output=True, text=True, timeout=60, check=False
    )
    assert built.returncode == 0, built.stderr
    rendered = [(f"kubectl kustomize infra/k8s/{overlay}", d) for d in yaml.safe_load_all(built.stdout) if d]
    assert principal_problems(workloads(rendered), ca_location()) == []


def test_the_kafka_trigger_authenticates_as_its_group() -> None:
    """KEDA's Kafka scaler (the example) reads the group's offsets as the group's own principal."""
    docs = yaml_docs(K8S / "keda" / "kafka-trigger.example.yaml")
    auths = {d["metadata"]["name"]: d for d in docs if d["kind"] == "TriggerAuthentication"}
    triggers = [t for d in docs if d["kind"] == "ScaledObject" for t in d["spec"]["triggers"]]
    assert triggers
    for trigger in triggers:
        group = resolve_group(trigger["metadata"]["consumerGroup"]).name
        assert group is not None
        assert (trigger["metadata"]["sasl"], trigger["metadata"]["tls"]) == ("scram_sha512", "enable")
        refs = {
            r["parameter"]: r for r in auths[trigger["authenticationRef"]["name"]]["spec"]["secretTargetRef"]
        }
        assert refs["username"] == {"parameter": "username", "name": secret_name(group), "key": "username"}
        assert refs["password"] == {"parameter": "password", "name": secret_name(group), "key": "password"}
        assert refs["ca"] == {"parameter": "ca", "name": CA_SECRET, "key": "ca.crt"}


def _secured(principal: str, secret_of: str | None = None, mount_ca: bool = True) -> dict[str, Any]:
    obj = pod(
        env=[
            {
                "name": name,
                "valueFrom": {"secretKeyRef": {"name": secret_name(secret_of or principal), "key": key}},
            }
            for name, key in SASL_KEYS.items()
        ],
        volumes=[
            {"name": "home", "emptyDir": {}},
            {
                "name": "ca",
                "secret": {"secretName": CA_SECRET, "items": [{"key": "ca.crt", "path": "ca.crt"}]},
            },
        ],
    )
    obj["metadata"]["labels"] = {"docstream.io/group": principal}
    if mount_ca:
        obj["spec"]["template"]["spec"]["containers"][0]["volumeMounts"].append(
            {"name": "ca", "mountPath": "/etc/kafka-ca", "readOnly": True}
        )
    return obj


def test_a_made_up_workload_with_its_own_principal_passes() -> None:
    assert principal_problems([("made-up.yaml", _secured("ocr"))], "/etc/kafka-ca/ca.crt") == []


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (
            _secured("ocr", secret_of="api"),
            "DOCSTREAM_SASL_USERNAME must come from {'name': 'docstream-kafka-ocr'",
        ),
        (
            _secured("ocr", mount_ca=False),
            "container c does not mount Secret docstream-kafka-ca at /etc/kafka-ca",
        ),
        (_secured("nobody"), "authenticates as no principal of docstream.principals (nobody)"),
        (pod(), "DOCSTREAM_SASL_PASSWORD must come from"),  # no group label, no known name
    ],
)
def test_a_made_up_workload_with_the_wrong_principal_fails(obj: dict[str, Any], expected: str) -> None:
    if "labels" not in obj["metadata"]:
        obj["metadata"] = {"name": "docstream-api"}  # the API by name, with no credentials at all
    found = principal_problems([("made-up.yaml", obj)], "/etc/kafka-ca/ca.crt")
    assert any(expected in line for line in found), found
