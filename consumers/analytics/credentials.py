"""The faust app's broker credentials, from the same librdkafka settings every other client uses.

faust (through aiokafka) does not read librdkafka's keys: `faust_credentials` turns the connection
dictionary of `docstream.kafka.config.connection_config` (security.protocol, sasl.*, ssl.*) into
faust's `broker_credentials`, so that the analytics worker reaches the cluster the way the workers,
the sink and the API do, with the same checks:

    security.protocol   faust credentials
    (absent), PLAINTEXT None
    SSL                 SSLCredentials(context)
    SASL_PLAINTEXT      SASLCredentials(username, password, mechanism)
    SASL_SSL            SASLCredentials(username, password, mechanism, ssl_context=context)

The SSL context verifies the broker's certificate against `ssl.ca.location` (the system's CAs when
it is absent) and checks its host name, as librdkafka does by default
(`ssl.endpoint.identification.algorithm=https`; `none` turns the host name check off there and here).
`ssl.certificate.location` and `ssl.key.location` give a client certificate (mutual TLS).
A setting faust cannot honour (a mechanism aiokafka lacks, a missing password, an unreadable CA
file) is a ConfigurationError naming the DOCSTREAM_ setting to fix, raised before faust starts.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from faust.auth import Credentials, SASLCredentials, SSLCredentials

from docstream.errors import ConfigurationError

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def faust_credentials(connection: Mapping[str, Any]) -> Credentials | None:
    """faust's `broker_credentials` for a librdkafka connection dictionary (module docstring)."""
    protocol = str(connection.get("security.protocol") or "PLAINTEXT").upper()
    if protocol == "PLAINTEXT":
        return None
    if protocol not in ("SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise ConfigurationError(
            f"security protocol {protocol!r} is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL:"
            " fix DOCSTREAM_SECURITY_PROTOCOL"
        )
    context = ssl_context(connection) if protocol in ("SSL", "SASL_SSL") else None
    if protocol == "SSL":
        assert context is not None
        return SSLCredentials(context)
    mechanism = str(connection.get("sasl.mechanism") or "PLAIN").upper()
    if mechanism not in MECHANISMS:
        raise ConfigurationError(
            f"the analytics worker (faust, aiokafka) supports the SASL mechanisms {', '.join(MECHANISMS)},"
            f" not {mechanism!r}: fix DOCSTREAM_SASL_MECHANISM"
        )
    username, password = connection.get("sasl.username"), connection.get("sasl.password")
    if not username or not password:
        raise ConfigurationError(
            f"{protocol} needs a user name and a password:"
            " set DOCSTREAM_SASL_USERNAME and DOCSTREAM_SASL_PASSWORD"
        )
    return SASLCredentials(
        username=str(username), password=str(password), ssl_context=context, mechanism=mechanism
    )


def ssl_context(connection: Mapping[str, Any]) -> ssl.SSLContext:
    """A client TLS context: the broker's certificate verified (against `ssl.ca.location`, or the
    system's CAs) and, unless `ssl.endpoint.identification.algorithm` is `none`, its host name."""
    ca = connection.get("ssl.ca.location")
    try:
        context = ssl.create_default_context(cafile=str(ca) if ca else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"cannot read the CA certificate {ca}: {exc}: fix DOCSTREAM_SSL_CA_LOCATION"
        ) from None
    if str(connection.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
        context.check_hostname = False
    certificate, key = connection.get("ssl.certificate.location"), connection.get("ssl.key.location")
    if certificate or key:
        try:
            context.load_cert_chain(str(certificate), str(key) if key else None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(
                f"cannot load the client certificate {certificate} / key {key}: {exc}:"
                " fix DOCSTREAM_SSL_CERTIFICATE_LOCATION and DOCSTREAM_SSL_KEY_LOCATION"
            ) from None
    return context
