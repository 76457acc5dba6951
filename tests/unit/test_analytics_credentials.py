"""The analytics worker's faust credentials come from the librdkafka settings every client uses."""

from __future__ import annotations

import os
import ssl
import subprocess
from pathlib import Path

import pytest
from faust.auth import SASLCredentials, SSLCredentials
from faust.types.auth import AuthProtocol, SASLMechanism

from consumers.analytics.credentials import faust_credentials
from docstream.errors import ConfigurationError
from docstream.kafka.config import connection_config, with_security
from docstream.settings import Settings

BOOTSTRAP = {"bootstrap.servers": "127.0.0.1:9092"}


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ca")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=docstream-test-ca", "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.pem")],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return folder / "ca.pem"


@pytest.mark.parametrize("protocol", [None, "PLAINTEXT", "plaintext"])
def test_plaintext_has_no_credentials(protocol: str | None) -> None:
    connection = {**BOOTSTRAP, **({"security.protocol": protocol} if protocol else {})}
    assert faust_credentials(connection) is None


def test_sasl_ssl_scram_carries_the_user_and_a_verifying_context(ca_file: Path) -> None:
    credentials = faust_credentials(
        {
            **BOOTSTRAP,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "analytics",
            "sasl.password": "s3cret",
            "ssl.ca.location": str(ca_file),
        }
    )
    assert isinstance(credentials, SASLCredentials)
    assert credentials.protocol is AuthProtocol.SASL_SSL
    assert credentials.mechanism is SASLMechanism.SCRAM_SHA_512
    assert (credentials.username, credentials.password) == ("analytics", "s3cret")
    context = credentials.ssl_context
    assert context is not None and context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert any("docstream-test-ca" in str(ca.get("subject")) for ca in context.get_ca_certs())


def test_the_host_name_check_follows_librdkafkas_switch(ca_file: Path) -> None:
    credentials = faust_credentials(
        {
            **BOOTSTRAP,
            "security.protocol": "SSL",
            "ssl.ca.location": str(ca_file),
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    assert isinstance(credentials, SSLCredentials)
    assert credentials.protocol is AuthProtocol.SSL
    assert credentials.context.verify_mode is ssl.CERT_REQUIRED and not credentials.context.check_hostname


def test_sasl_plaintext_has_no_tls() -> None:
    credentials = faust_credentials(
        {**BOOTSTRAP, "security.protocol": "SASL_PLAINTEXT", "sasl.username": "u", "sasl.password": "p"}
    )
    assert isinstance(credentials, SASLCredentials)
    assert credentials.protocol is AuthProtocol.SASL_PLAINTEXT and credentials.ssl_context is None
    assert credentials.mechanism is SASLMechanism.PLAIN  # librdkafka's default mechanism too


@pytest.mark.parametrize(
    ("extra", "setting"),
    [
        ({"security.protocol": "SASL_SSL", "sasl.username": "u"}, "DOCSTREAM_SASL_PASSWORD"),
        (
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI", "sasl.username": "u"},
            "DOCSTREAM_SASL_MECHANISM",
        ),
        ({"security.protocol": "TLS"}, "DOCSTREAM_SECURITY_PROTOCOL"),
        ({"security.protocol": "SSL", "ssl.ca.location": "/no/such/ca.pem"}, "DOCSTREAM_SSL_CA_LOCATION"),
        (
            {
                "security.protocol": "SSL",
                "ssl.certificate.location": "/no/cert.pem",
                "ssl.key.location": "/no/k",
            },
            "DOCSTREAM_SSL_CERTIFICATE_LOCATION",
        ),
    ],
)
def test_a_setting_faust_cannot_honour_names_the_setting(extra: dict[str, str], setting: str) -> None:
    with pytest.raises(ConfigurationError, match=setting):
        faust_credentials({**BOOTSTRAP, **extra})


def test_a_child_connects_as_its_parents_settings_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(
        home=tmp_path,
        bootstrap_servers="127.0.0.1:9094",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="analytics",
        sasl_password="pw",  # type: ignore[arg-type]  # pydantic makes it a SecretStr
        ssl_ca_location="/tls/ca.pem",
    )
    inherited = {
        "KAFKA_SASL_USERNAME": "ops",  # an alias that would win over DOCSTREAM_SASL_USERNAME
        "DOCSTREAM_SASL_PASSWORD": "old",
        "KAFKA_SSL_KEY_LOCATION": "/k",
        "PATH": "/bin",
    }
    env = with_security(inherited, settings)
    assert env == {
        "PATH": "/bin",
        "DOCSTREAM_SECURITY_PROTOCOL": "SASL_SSL",
        "DOCSTREAM_SASL_MECHANISM": "SCRAM-SHA-512",
        "DOCSTREAM_SASL_USERNAME": "analytics",
        "DOCSTREAM_SASL_PASSWORD": "pw",
        "DOCSTREAM_SSL_CA_LOCATION": "/tls/ca.pem",
    }
    for name in list(os.environ):
        if name.startswith(("KAFKA_", "DOCSTREAM_")):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    child = Settings(home=tmp_path, bootstrap_servers="127.0.0.1:9094")
    assert connection_config(child) == connection_config(settings)
