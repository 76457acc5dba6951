"""The secured local broker's parts that need no JVM: its rendered properties, the openssl commands
and the material they make (real openssl, a few milliseconds), the users file, the modes, the
client settings, and the refusal to start a storage the other way than it was formatted."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from docstream.cli.broker import app
from docstream.errors import BrokerError, ToolMissingError
from docstream.kafka.config import connection_config
from docstream.principals import PRINCIPALS
from docstream.settings import Settings
from infra import tls
from infra.broker import LocalBroker
from infra.cluster import LocalCluster, manages
from infra.security import BrokerMaterial
from infra.server_properties import SecureListeners, render_server_properties
from infra.tls import TlsFiles

OPENSSL = shutil.which("openssl")
needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="no openssl on PATH")
PASSWORD = "p" * 20


def properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def secured(tmp_path: Path) -> dict[str, str]:
    listeners = SecureListeners(tmp_path / "keystore.pem", tmp_path / "ca.pem", "s3cret-admin-password")
    return properties(render_server_properties(9092, 9093, Path("/d"), secure=listeners))


# -- server.properties ----------------------------------------------------------------------------


def test_a_secured_node_serves_clients_and_brokers_on_sasl_ssl_only(tmp_path: Path) -> None:
    conf = secured(tmp_path)
    assert conf["listeners"] == "SASL_SSL://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert conf["advertised.listeners"] == "SASL_SSL://127.0.0.1:9092"
    assert conf["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:SSL"
    assert "PLAINTEXT" not in conf["listeners"] + conf["listener.security.protocol.map"]
    assert conf["inter.broker.listener.name"] == "SASL_SSL"
    assert conf["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert conf["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    jaas = conf["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    assert 'username="admin" password="s3cret-admin-password";' in jaas and "ScramLoginModule" in jaas


def test_a_secured_node_trusts_the_local_ca_and_asks_controllers_clients_for_certificates(
    tmp_path: Path,
) -> None:
    conf = secured(tmp_path)
    assert (conf["ssl.keystore.type"], conf["ssl.keystore.location"]) == (
        "PEM",
        str(tmp_path / "keystore.pem"),
    )
    assert (conf["ssl.truststore.type"], conf["ssl.truststore.location"]) == ("PEM", str(tmp_path / "ca.pem"))
    assert conf["listener.name.controller.ssl.client.auth"] == "required"
    assert conf["ssl.principal.mapping.rules"] == "RULE:^CN=docstream-broker$/admin/,DEFAULT"
    assert conf["ssl.endpoint.identification.algorithm"] == "https"


def test_a_secured_node_denies_whatever_no_acl_grants(tmp_path: Path) -> None:
    conf = secured(tmp_path)
    assert conf["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert conf["super.users"] == "User:admin"
    assert conf["allow.everyone.if.no.acl.found"] == "false"


def test_the_admin_password_is_not_in_the_listeners_repr(tmp_path: Path) -> None:
    listeners = SecureListeners(tmp_path / "k", tmp_path / "c", "s3cret-admin-password")
    assert "s3cret" not in repr(listeners)


def test_a_plain_node_has_no_security_lines() -> None:
    conf = properties(render_server_properties(9092, 9093, Path("/d")))
    assert conf["listener.security.protocol.map"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert not any(key.startswith(("ssl.", "sasl.", "authorizer", "super.")) for key in conf)


def test_every_node_of_a_secured_cluster_shares_one_tls_folder(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, brokers=3, broker_port=19092, controller_port=19093, secure=True)
    assert {n.material.files.root for n in cluster.nodes} == {tmp_path.resolve() / "tls"}
    assert all(n.secure for n in cluster.nodes)


# -- the certificates -----------------------------------------------------------------------------


def test_the_broker_certificate_names_the_loopback_address_and_localhost() -> None:
    text = tls.broker_extensions()
    assert "subjectAltName=IP:127.0.0.1,DNS:localhost\n" in text
    assert "extendedKeyUsage=serverAuth,clientAuth\n" in text and "CA:FALSE" in text


def test_the_commands_sign_with_the_ca_and_a_given_serial(tmp_path: Path) -> None:
    files = TlsFiles(tmp_path)
    sign = tls.sign_command("openssl", files, serial=12345)
    assert sign[sign.index("-CA") + 1] == str(files.ca_cert)
    assert sign[sign.index("-CAkey") + 1] == str(files.ca_key)
    assert sign[sign.index("-set_serial") + 1] == "12345"
    assert sign[sign.index("-extfile") + 1] == str(files.broker_extensions)
    ca = tls.ca_command("openssl", files)
    assert "basicConstraints=critical,CA:TRUE,pathlen:0" in ca and ca[ca.index("-out") + 1] == str(
        files.ca_cert
    )
    assert tls.key_command("openssl", files.ca_key)[-1] == str(files.ca_key)
    assert tls.expiring_command("openssl", files.broker_cert, 60)[2:4] == ["-checkend", "60"]


@needs_openssl
def test_the_material_is_made_once_private_and_verifies(tmp_path: Path) -> None:
    material = BrokerMaterial(tmp_path / "tls")
    passwords = material.ensure(PRINCIPALS)
    files = material.files
    assert set(passwords) == set(PRINCIPALS) and len(set(passwords.values())) == len(PRINCIPALS)
    assert stat.S_IMODE(files.root.stat().st_mode) == 0o700
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files.private} == {
        p.name: 0o600 for p in files.private
    }
    assert not tls.too_open(files.root.stat().st_mode, directory=True)
    assert not files.broker_csr.exists() and not files.broker_extensions.exists()
    verify = [str(OPENSSL), "verify", "-CAfile", str(files.ca_cert), str(files.broker_cert)]
    assert subprocess.run(verify, capture_output=True).returncode == 0
    shown = subprocess.run(
        [str(OPENSSL), "x509", "-noout", "-ext", "subjectAltName", "-in", str(files.broker_cert)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "IP Address:127.0.0.1" in shown and "DNS:localhost" in shown
    keystore = files.keystore.read_text()
    assert keystore.index("PRIVATE KEY") < keystore.index("CERTIFICATE")
    assert keystore.count("BEGIN CERTIFICATE") == 2  # the broker's, then the CA's

    ca_before, cert_before = files.ca_cert.read_bytes(), files.broker_cert.read_bytes()
    os.chmod(files.users, 0o644)
    assert material.ensure(PRINCIPALS) == passwords, "a restart keeps every password"
    assert (files.ca_cert.read_bytes(), files.broker_cert.read_bytes()) == (ca_before, cert_before)
    assert stat.S_IMODE(files.users.stat().st_mode) == 0o600, "a loosened file is made private again"


@needs_openssl
def test_a_broker_certificate_about_to_end_is_made_again_by_the_same_ca(tmp_path: Path) -> None:
    material = BrokerMaterial(tmp_path / "tls", make_serial=lambda: 7)
    material.ensure(["admin"])
    files = material.files
    ca_before = files.ca_cert.read_bytes()
    short = tls.sign_command(str(OPENSSL), files, serial=8, days=1)
    files.broker_extensions.write_text(tls.broker_extensions())
    subprocess.run(tls.csr_command(str(OPENSSL), files), check=True, capture_output=True)
    subprocess.run(short, check=True, capture_output=True)
    ending = files.broker_cert.read_bytes()
    material.ensure(["admin"])
    assert files.broker_cert.read_bytes() != ending and files.ca_cert.read_bytes() == ca_before


def test_no_openssl_is_a_clear_error_naming_it(tmp_path: Path) -> None:
    material = BrokerMaterial(tmp_path / "tls", openssl="no-such-openssl-here")
    with pytest.raises(ToolMissingError, match=r"no-such-openssl-here.*OpenSSL"):
        material.ensure(PRINCIPALS)


@pytest.mark.parametrize(
    ("mode", "directory", "too_open"),
    [
        (0o600, False, False),
        (0o400, False, False),
        (0o640, False, True),
        (0o604, False, True),
        (0o700, True, False),
        (0o750, True, True),
        (0o500, True, True),  # its owner could not write a renewed certificate into it
    ],
)
def test_only_the_owner_may_read_the_material(mode: int, directory: bool, too_open: bool) -> None:
    assert tls.too_open(mode, directory=directory) is too_open


# -- the users ------------------------------------------------------------------------------------


def test_passwords_are_made_by_the_given_maker_and_read_back(tmp_path: Path) -> None:
    made = iter(["a" * 20, "b" * 20])
    passwords = tls.new_passwords(["admin", "ocr"], lambda: next(made))
    assert passwords == {"admin": "a" * 20, "ocr": "b" * 20}
    assert tls.parse_users(tls.render_users(passwords), tmp_path / "users.json") == passwords


@pytest.mark.parametrize(
    "text", ["not json", "[]", '{"admin": 1}', '{"admin": "short"}', '{"Bad User": "x"}']
)
def test_a_damaged_users_file_is_a_clear_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(BrokerError, match="users"):
        tls.parse_users(text, tmp_path / "users.json")


def test_the_format_argument_names_the_user_and_mechanism() -> None:
    assert tls.scram_argument("ocr", PASSWORD) == f"SCRAM-SHA-512=[name=ocr,password={PASSWORD}]"
    with pytest.raises(BrokerError):
        tls.scram_argument("ocr", "has,comma]and-more-than-16")


def test_the_format_arguments_are_quoted_for_java() -> None:
    text = tls.java_argfile(["-cp", "/lib dir/*", 'say "hi"', "C:\\x"])
    assert text == '"-cp"\n"/lib dir/*"\n"say \\"hi\\""\n"C:\\\\x"\n'


# -- what a client needs --------------------------------------------------------------------------


def test_client_settings_are_docstreams_own_variables_and_give_the_client_config(tmp_path: Path) -> None:
    env = tls.client_settings("127.0.0.1:9092", tmp_path / "ca.pem", "ops", PASSWORD)
    assert env == {
        "DOCSTREAM_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
        "DOCSTREAM_SECURITY_PROTOCOL": "SASL_SSL",
        "DOCSTREAM_SASL_MECHANISM": "SCRAM-SHA-512",
        "DOCSTREAM_SSL_CA_LOCATION": str(tmp_path / "ca.pem"),
        "DOCSTREAM_SASL_USERNAME": "ops",
        "DOCSTREAM_SASL_PASSWORD": PASSWORD,
    }
    fields: dict[str, Any] = dict(env)  # by the aliases, as the environment gives them
    as_settings = Settings(**fields)
    config = tls.client_config("127.0.0.1:9092", tmp_path / "ca.pem", "ops", PASSWORD)
    assert connection_config(as_settings) == config
    assert "ssl.endpoint.identification.algorithm" not in config  # librdkafka's default (https) stays


def test_the_exported_local_address_still_counts_as_the_local_cluster(tmp_path: Path) -> None:
    assert manages(Settings(home=tmp_path, bootstrap_servers=None))
    assert manages(Settings(home=tmp_path, bootstrap_servers="127.0.0.1:9092"))
    assert not manages(Settings(home=tmp_path, bootstrap_servers="kafka.example:9092"))


# -- formatted one way, started the other ---------------------------------------------------------


def formatted(tmp_path: Path, how: str | None) -> None:
    (tmp_path / "data").mkdir(parents=True)
    (tmp_path / "data" / "meta.properties").write_text("cluster.id=x\n")
    if how is not None:
        (tmp_path / "formatted").write_text(f"{how}\n")


@pytest.mark.parametrize(
    ("how", "secure", "says"),
    [
        (None, True, "formatted plain and cannot start secure"),  # formatted before --secure existed
        ("plain", True, "formatted plain and cannot start secure"),
        ("secure", False, "formatted secure and cannot start plain: start it with --secure"),
    ],
)
def test_a_storage_is_started_only_the_way_it_was_formatted(
    tmp_path: Path, how: str | None, secure: bool, says: str
) -> None:
    formatted(tmp_path, how)
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls" / "users.json").write_text(json.dumps({"admin": PASSWORD}))
    broker = LocalBroker(tmp_path, broker_port=1, controller_port=2, secure=secure)
    with pytest.raises(BrokerError, match=says) as refused:
        broker.launch()
    assert f"docstream broker stop && rm -rf {tmp_path.resolve()}" in str(refused.value)


def test_a_secured_storage_without_its_passwords_says_to_reset(tmp_path: Path) -> None:
    formatted(tmp_path, "secure")
    broker = LocalBroker(tmp_path, broker_port=1, controller_port=2, secure=True)
    with pytest.raises(BrokerError, match="passwords are gone"):
        broker.launch()


def test_credentials_of_a_plain_broker_exit_2_saying_how_to_secure_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCSTREAM_HOME", str(tmp_path))
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("DOCSTREAM_BOOTSTRAP_SERVERS", raising=False)
    shown = CliRunner().invoke(app, ["credentials"])
    assert shown.exit_code == 2 and "--secure" in shown.output
    unknown = CliRunner().invoke(app, ["credentials", "--user", "mallory"])
    assert unknown.exit_code == 2 and "no principal" in unknown.output
