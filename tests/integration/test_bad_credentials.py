"""Bad credentials get a clear answer, on the real secured broker (SASL_SSL, SCRAM-SHA-512, TLS):

- a command (`docstream topics describe`, `docstream lag`) with a wrong password, a CA that did not
  sign the broker's certificate, or an expired copy of the right CA ends with exit 2 in seconds, its
  one-line error naming the setting to fix;
- a worker that keeps trying (the runtime's consume loop) logs one line when its user is refused
  and one when the broker takes it again (the user created meanwhile), never a flood, and stops
  promptly when asked.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # no __all__
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from consumers.groups import build_worker
from consumers.ops import acls as cluster_acls
from docstream import acls
from docstream.kafka import clients
from docstream.principals import ADMIN, OPS
from docstream.settings import Settings
from docstream.topology import declared_topics
from infra.broker import LocalBroker
from infra.topics import ensure_topics

pytestmark = pytest.mark.kafka

COMMAND_S = 30.0  # a command gives up long before this; librdkafka's own timeouts are a minute


def run_cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """The command's answer, its stderr unwrapped (the console folds long lines)."""
    command = [sys.executable, "-c", "from docstream.cli import main; main()", *argv]
    answer = subprocess.run(command, env=env, capture_output=True, text=True, timeout=COMMAND_S * 2)
    answer.stderr = " ".join(answer.stderr.split())
    return answer


def cli_env(secure_kafka: LocalBroker, tmp_path: Path, **overrides: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("DOCSTREAM_", "KAFKA_"))
    }  # nothing of the caller's
    env.update(secure_kafka.client_settings(OPS))
    env["DOCSTREAM_HOME"] = str(tmp_path / "home")
    env.update(overrides)
    return env


def expired_copy_of_ca(ca_cert: Path, ca_key: Path, folder: Path) -> Path:
    """The broker's CA as it would be after its end date: same name and key, validity in the past."""
    cert = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    key = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(cert.subject)
        .issuer_name(cert.subject)
        .public_key(cert.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=30))
        .not_valid_after(now - dt.timedelta(days=1))
    )
    for extension in cert.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    expired = builder.sign(key, hashes.SHA256())  # type: ignore[arg-type]  # the CA's EC (or RSA) key
    path = folder / "expired-ca.pem"
    path.write_bytes(expired.public_bytes(serialization.Encoding.PEM))
    return path


def other_ca(folder: Path) -> Path:
    path = folder / "other-ca.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=not the broker's CA", "-keyout", str(folder / "other-ca.key"), "-out", str(path)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return path


@pytest.mark.parametrize("command", [("topics", "describe"), ("lag",)])
def test_a_command_with_a_wrong_password_exits_2_naming_the_setting(
    secure_kafka: LocalBroker, tmp_path: Path, command: tuple[str, ...]
) -> None:
    env = cli_env(secure_kafka, tmp_path, DOCSTREAM_SASL_PASSWORD="not-the-password-0000")
    began = time.monotonic()
    answer = run_cli(env, *command)
    took = time.monotonic() - began
    assert answer.returncode == 2, (answer.stdout, answer.stderr)
    assert "DOCSTREAM_SASL_PASSWORD" in answer.stderr and "Authentication failed" in answer.stderr
    assert took < COMMAND_S, took
    assert "Traceback" not in answer.stderr


def test_a_command_trusting_another_ca_exits_2_naming_the_setting(
    secure_kafka: LocalBroker, tmp_path: Path
) -> None:
    env = cli_env(secure_kafka, tmp_path, DOCSTREAM_SSL_CA_LOCATION=str(other_ca(tmp_path)))
    answer = run_cli(env, "topics", "describe")
    assert answer.returncode == 2, (answer.stdout, answer.stderr)
    assert "DOCSTREAM_SSL_CA_LOCATION" in answer.stderr and "certificate verify failed" in answer.stderr
    assert "Traceback" not in answer.stderr


def test_a_command_with_an_expired_certificate_exits_2_saying_so(
    secure_kafka: LocalBroker, tmp_path: Path
) -> None:
    files = secure_kafka.material.files
    expired = expired_copy_of_ca(files.ca_cert, files.ca_key, tmp_path)
    env = cli_env(secure_kafka, tmp_path, DOCSTREAM_SSL_CA_LOCATION=str(expired))
    answer = run_cli(env, "topics", "describe")
    assert answer.returncode == 2, (answer.stdout, answer.stderr)
    assert "certificate has expired" in answer.stderr and "renew it" in answer.stderr, answer.stderr
    assert "Traceback" not in answer.stderr


def test_the_right_credentials_pass_the_same_command(secure_kafka: LocalBroker, tmp_path: Path) -> None:
    """The control: the same command, the settings the broker printed."""
    ensure_topics(secure_kafka.client_config(ADMIN), declared_topics(3))
    answer = run_cli(cli_env(secure_kafka, tmp_path), "topics", "describe", "--json")
    assert answer.returncode == 0, answer.stderr


@pytest.mark.timeout(180)
def test_a_refused_worker_logs_once_keeps_trying_and_logs_once_when_taken_again(
    secure_kafka: LocalBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose SCRAM user does not exist yet: one line naming DOCSTREAM_SASL_PASSWORD when it
    starts, quiet while librdkafka retries, one line when the user is created, and it stops at once."""
    user, password = f"late-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    fields: dict[str, object] = {
        **secure_kafka.client_settings(OPS),
        "DOCSTREAM_SASL_USERNAME": user,
        "DOCSTREAM_SASL_PASSWORD": password,
        "home": tmp_path / "home",
        "topic_partitions": 3,
        "group_prefix": f"bad{uuid.uuid4().hex[:8]}.",
    }
    s = Settings(**fields)  # type: ignore[arg-type]  # by alias and name
    ensure_topics(secure_kafka.client_config(ADMIN), declared_topics(3, s.group_prefix))
    grant = [dataclasses.replace(acl, principal=user) for acl in acls.plan(s.group_prefix)["thumbnails"]]
    cluster_acls.apply(secure_kafka.client_config(ADMIN), grant)  # what thumbnails may do, for `user`
    caplog.set_level(logging.DEBUG, logger="docstream.kafka")
    worker = build_worker("thumbnails", s)
    runner_error: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # the test reports it
            runner_error.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        assert wait_for(lambda: not worker.health().broker_reachable, 60), "the refusal was never declared"
        time.sleep(10)  # librdkafka retries all along
        admin = clients.admin_client(secure_kafka.client_config(ADMIN))
        upsert = UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
        )
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)
        assert wait_for(lambda: worker.health().broker_reachable, 60), "never taken again"
    finally:
        began = time.monotonic()
        worker.stop()
        runner.join(timeout=30)
        stopped_in = time.monotonic() - began
    assert not runner.is_alive() and stopped_in < 15, stopped_in
    lines = [
        r.getMessage() for r in caplog.records if r.name == "docstream.kafka" and r.levelno >= logging.INFO
    ]
    down = [line for line in lines if "unreachable since" in line]
    back = [line for line in lines if "back after" in line]
    assert len(down) == 1 and "DOCSTREAM_SASL_PASSWORD" in down[0], lines
    assert len(back) == 1, lines
    assert len(lines) == 2, lines  # nothing else: no flood while librdkafka retried
    assert runner_error == [], runner_error


def wait_for(condition: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]  # a callable
            return True
        time.sleep(0.5)
    return False
