"""Who each process of a secured chaos run is (consumers.ops.chaos.pipeline.principal_of) and the
environment it gets (as_principal, process_environment, Pipeline): its own principal's client
settings, none of the parent's Kafka security variables (a KAFKA_ alias would win over ours), at
every start, restarts included; and the harness's own Settings per principal (harness.PreparedRun)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from consumers.ops.chaos import pipeline as chaos_pipeline
from consumers.ops.chaos.harness import PreparedRun
from consumers.ops.chaos.pipeline import (
    COMMANDS,
    PRINCIPAL_OF,
    Pipeline,
    as_principal,
    environment,
    principal_of,
    process_environment,
)
from docstream import faults
from docstream.principals import ADMIN, API, OPS, PRINCIPALS
from docstream.settings import Settings
from docstream.topology import ANALYTICS, GROUPS, STAGE_NAMES, WAREHOUSE
from infra.cluster import LocalCluster

PARENT = {  # a parent that runs as someone else, both spellings
    "PATH": "/usr/bin",
    "DOCSTREAM_HOME": "/run/home",
    "KAFKA_BOOTSTRAP_SERVERS": "elsewhere:9092",
    "KAFKA_SASL_USERNAME": "admin",
    "KAFKA_SASL_PASSWORD": "admins-secret",
    "DOCSTREAM_SASL_USERNAME": "ops",
    "DOCSTREAM_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "KAFKA_SSL_KEY_LOCATION": "/parent/key.pem",
    "docstream_ssl_certificate_location": "/parent/cert.pem",  # any case: the settings ignore it
}


def credentials(user: str) -> dict[str, str]:
    """What LocalCluster.client_settings(user) gives (infra.tls.client_settings)."""
    return {
        "DOCSTREAM_BOOTSTRAP_SERVERS": "127.0.0.1:20001,127.0.0.1:20003",
        "DOCSTREAM_SECURITY_PROTOCOL": "SASL_SSL",
        "DOCSTREAM_SASL_MECHANISM": "SCRAM-SHA-512",
        "DOCSTREAM_SSL_CA_LOCATION": "/run/cluster/tls/ca.pem",
        "DOCSTREAM_SASL_USERNAME": user,
        "DOCSTREAM_SASL_PASSWORD": f"{user}-secret",
    }


EVERYONE = {user: credentials(user) for user in PRINCIPALS if user != ADMIN}


def test_every_process_runs_as_its_groups_principal_and_the_api_as_api() -> None:
    assert {
        **{stage: stage for stage in STAGE_NAMES},
        "sink": WAREHOUSE,
        ANALYTICS: ANALYTICS,
        "api": API,
    } == PRINCIPAL_OF
    # every declared group's principal is some process's, and no process is admin or ops
    assert {spec.name for spec in GROUPS} <= set(PRINCIPAL_OF.values()) <= set(PRINCIPALS) - {ADMIN, OPS}
    assert set(PRINCIPAL_OF) == set(COMMANDS)


def test_a_kind_without_a_principal_is_refused() -> None:
    with pytest.raises(ValueError, match="'exporter'"):
        principal_of("exporter")


def test_as_principal_drops_every_security_variable_of_the_parent_and_sets_the_principals() -> None:
    env = as_principal(PARENT, credentials("ocr"))
    assert env == {"PATH": "/usr/bin", "DOCSTREAM_HOME": "/run/home", **credentials("ocr")}


def test_as_principal_without_credentials_leaves_no_security_variable() -> None:
    env = as_principal(PARENT, {})
    assert env == {
        "PATH": "/usr/bin",
        "DOCSTREAM_HOME": "/run/home",
        "KAFKA_BOOTSTRAP_SERVERS": "elsewhere:9092",  # not a security setting: the caller's choice
    }


def test_the_settings_a_child_reads_back_are_its_principals(monkeypatch: pytest.MonkeyPatch) -> None:
    env = process_environment(PARENT, "sink", {"DOCSTREAM_HOME": "/run/sink"}, EVERYONE)
    for name in [n for n in os.environ if n.upper().startswith(("KAFKA_", "DOCSTREAM_"))]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    read = Settings()
    assert (read.sasl_username, read.security_protocol, read.ssl_key_location) == (
        WAREHOUSE,
        "SASL_SSL",
        None,
    )
    assert read.sasl_password is not None and read.sasl_password.get_secret_value() == "warehouse-secret"
    assert read.bootstrap == "127.0.0.1:20001,127.0.0.1:20003"
    assert str(read.home) == "/run/sink"


def test_a_plain_run_passes_the_environment_through() -> None:
    base = environment(PARENT, KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:20001", **{faults.ENV: "x"})
    assert not any("SASL" in name or "SSL" in name or "SECURITY" in name for name in base)
    assert process_environment(base, "ocr", {"TMPDIR": "/t"}) == {**base, "TMPDIR": "/t"}


def test_environment_drops_the_callers_armed_fault_and_security() -> None:
    env = environment({**PARENT, faults.ENV: "before_handle:3"}, DOCSTREAM_HOME="/h")
    assert faults.ENV not in env and "KAFKA_SASL_USERNAME" not in env and env["DOCSTREAM_HOME"] == "/h"


SHOW = "import os; print(os.environ.get('DOCSTREAM_SASL_USERNAME'), os.environ.get('KAFKA_SASL_USERNAME'))"


def test_each_process_starts_and_restarts_as_its_own_principal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Pipeline itself: every process, a replica ("ocr-2" runs "ocr") and a restart included."""
    monkeypatch.setattr(chaos_pipeline, "COMMANDS", {kind: [sys.executable, "-c", SHOW] for kind in COMMANDS})
    names = (*STAGE_NAMES, "ocr-2", "sink", ANALYTICS, "api")
    pipe = Pipeline(
        environment(PARENT), tmp_path / "logs", names=names, kinds={"ocr-2": "ocr"}, credentials=EVERYONE
    )
    pipe.start_all()
    await_ended(pipe)
    pipe.kill("sink")  # started again at once, as a supervisor would
    await_ended(pipe)
    pipe.stop()
    shown = {name: (tmp_path / "logs" / f"{name}.log").read_text().split("\n")[:-1] for name in names}
    expected = {**PRINCIPAL_OF, "ocr-2": "ocr"}
    for name in names:
        runs = 2 if name == "sink" else 1
        assert shown[name] == [f"{expected[name]} None"] * runs, name


def await_ended(pipe: Pipeline, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in pipe.processes.values()):
        assert time.monotonic() < deadline, "a process did not end"
        time.sleep(0.05)


def test_the_harness_settings_are_each_principals_and_never_the_environments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "admin")
    monkeypatch.setenv("DOCSTREAM_SSL_KEY_LOCATION", "/parent/key.pem")
    cluster = LocalCluster(tmp_path / "cluster", brokers=3, broker_port=20001, controller_port=20002)
    secured = PreparedRun(cluster, tmp_path / "home", {}, 1234, EVERYONE)
    ops = secured.settings(OPS)
    assert (ops.sasl_username, ops.security_protocol, ops.ssl_key_location) == (OPS, "SASL_SSL", None)
    assert ops.bootstrap == "127.0.0.1:20001,127.0.0.1:20003"
    assert ops.home == tmp_path / "home" and ops.topic_partitions == 3
    assert secured.settings(API).sasl_username == API
    assert secured.env_as(OPS)["DOCSTREAM_SASL_USERNAME"] == OPS
    plain = PreparedRun(cluster, tmp_path / "home", {}, 1234).settings(API)
    assert (plain.sasl_username, plain.security_protocol, plain.ssl_key_location) == (None, None, None)
    assert plain.bootstrap == cluster.bootstrap == "127.0.0.1:20001,127.0.0.1:20003,127.0.0.1:20005"
