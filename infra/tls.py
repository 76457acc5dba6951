"""The secured local broker's material as pure data: the files of its `tls/` folder, the openssl
commands that make a CA and a broker certificate signed by it, the SCRAM users' passwords file,
and the client settings one principal needs to reach the broker.

Pure: nothing here runs a program, reads a file or draws a random number (the serial and the
password maker are passed in); `infra.security` runs these commands and writes the files, and
`infra.server_properties` renders the broker's side (`SecureListeners`).

The folder (0700; every key, the keystore and the passwords 0600):

    ca.key / ca.pem          the local CA: its key never leaves the folder; ca.pem is what clients
                             trust (DOCSTREAM_SSL_CA_LOCATION)
    broker.key / broker.pem  the brokers' key and certificate, signed by the CA, for 127.0.0.1 and
                             localhost (subjectAltName): clients verify the hostname, as
                             librdkafka does by default (ssl.endpoint.identification.algorithm)
    keystore.pem             broker.key + broker.pem + ca.pem, the broker's PEM keystore
    users.json               every principal's SCRAM password, made once, reused on restart

Every node of a local cluster shares the one folder: one CA, one certificate (they all live on
127.0.0.1), one set of users (the controller quorum serves the credentials every node formatted
with, so they must be the same).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from docstream.errors import BrokerError
from docstream.settings import Settings

SECURE, PLAIN = "secure", "plain"  # how a broker's storage was formatted (infra.broker)
SECURITY_PROTOCOL = "SASL_SSL"
SCRAM_MECHANISM = "SCRAM-SHA-512"
# The certificate's subject; the controller listener maps it to the `admin` principal (mTLS).
BROKER_COMMON_NAME = "docstream-broker"
CA_SUBJECT = "/CN=docstream local CA"
SUBJECT_ALT_NAMES = ("IP:127.0.0.1", "DNS:localhost")
CA_DAYS = 3650
BROKER_DAYS = 825  # what browsers and most TLS stacks still accept for a leaf certificate
RENEW_WITHIN_S = 7 * 24 * 3600  # a broker certificate this close to its end is made again at start
DIR_MODE = 0o700
PRIVATE_MODE = 0o600
# What secrets.token_urlsafe makes: safe inside `--add-scram 'SCRAM-SHA-512=[name=u,password=p]'`
# and inside the JAAS line of server.properties, neither of which quotes its values.
PASSWORD_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,}")
USER_PATTERN = re.compile(r"[a-z][a-z0-9_-]*")


@dataclass(frozen=True)
class TlsFiles:
    """The paths of the secured broker's material under one folder."""

    root: Path

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.pem"

    @property
    def broker_key(self) -> Path:
        return self.root / "broker.key"

    @property
    def broker_csr(self) -> Path:
        return self.root / "broker.csr"

    @property
    def broker_cert(self) -> Path:
        return self.root / "broker.pem"

    @property
    def broker_extensions(self) -> Path:
        return self.root / "broker.ext"

    @property
    def keystore(self) -> Path:
        return self.root / "keystore.pem"

    @property
    def users(self) -> Path:
        return self.root / "users.json"

    @property
    def private(self) -> tuple[Path, ...]:
        """The files only the broker's user may read (0600)."""
        return (self.ca_key, self.broker_key, self.keystore, self.users)


# -- certificates -------------------------------------------------------------------------------


def key_command(openssl: str, path: Path) -> list[str]:
    """A new EC P-256 private key in PKCS#8 PEM (the form Kafka's PEM keystore reads), unencrypted:
    the folder's and the file's modes protect it, as they would the password of an encrypted one."""
    return [openssl, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)]


def ca_command(openssl: str, files: TlsFiles, days: int = CA_DAYS) -> list[str]:
    """The self-signed CA certificate, allowed to sign certificates and nothing else."""
    return [
        openssl,
        "req",
        "-x509",
        "-new",
        "-key",
        str(files.ca_key),
        "-sha256",
        "-days",
        str(days),
        "-subj",
        CA_SUBJECT,
        "-addext",
        "basicConstraints=critical,CA:TRUE,pathlen:0",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-out",
        str(files.ca_cert),
    ]


def csr_command(openssl: str, files: TlsFiles) -> list[str]:
    """The broker key's certificate request."""
    return [
        openssl,
        "req",
        "-new",
        "-key",
        str(files.broker_key),
        "-subj",
        f"/CN={BROKER_COMMON_NAME}",
        "-out",
        str(files.broker_csr),
    ]


def sign_command(openssl: str, files: TlsFiles, serial: int, days: int = BROKER_DAYS) -> list[str]:
    """The CA signs the broker's request with the extensions of `broker_extensions()`; the serial
    is given (a random one: no serial file to keep)."""
    return [
        openssl,
        "x509",
        "-req",
        "-in",
        str(files.broker_csr),
        "-CA",
        str(files.ca_cert),
        "-CAkey",
        str(files.ca_key),
        "-set_serial",
        str(serial),
        "-sha256",
        "-days",
        str(days),
        "-extfile",
        str(files.broker_extensions),
        "-out",
        str(files.broker_cert),
    ]


def expiring_command(openssl: str, cert: Path, within_s: int = RENEW_WITHIN_S) -> list[str]:
    """Exit 0 when the certificate is still valid `within_s` seconds from now, 1 when it is not."""
    return [openssl, "x509", "-checkend", str(within_s), "-noout", "-in", str(cert)]


def broker_extensions() -> str:
    """The broker certificate's extensions: the loopback names clients verify, and both server
    and client use (a node is a TLS client of the controller listener, which asks for its
    certificate)."""
    return (
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        f"subjectAltName={','.join(SUBJECT_ALT_NAMES)}\n"
    )


def keystore_pem(key: str, cert: str, ca_cert: str) -> str:
    """The broker's PEM keystore: its private key, then its certificate chain up to the CA."""
    return "".join(part if part.endswith("\n") else part + "\n" for part in (key, cert, ca_cert))


def too_open(mode: int, *, directory: bool = False) -> bool:
    """Whether a file (or the folder) of the material may be read or entered by others than its
    owner: group or world bits set."""
    return bool(mode & 0o077) or (directory and mode & 0o700 != 0o700)


# -- the SCRAM users ----------------------------------------------------------------------------


def new_passwords(users: Iterable[str], make_password: Callable[[], str]) -> dict[str, str]:
    """A fresh password for each user (make_password: `secrets.token_urlsafe` in the broker)."""
    passwords = {user: make_password() for user in users}
    for user, password in passwords.items():
        _check_user(user, password)
    return passwords


def render_users(passwords: Mapping[str, str]) -> str:
    return json.dumps(dict(passwords), indent=2, sort_keys=True) + "\n"


def parse_users(text: str, path: Path) -> dict[str, str]:
    """The passwords of users.json; a BrokerError naming the file when it is not one."""
    try:
        loaded = json.loads(text)
    except ValueError as exc:
        raise BrokerError(f"{path} is not the secured broker's users file ({exc})") from exc
    if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
        raise BrokerError(f"{path} is not the secured broker's users file (a JSON object of passwords)")
    for user, password in loaded.items():
        try:
            _check_user(user, password)
        except BrokerError as exc:
            raise BrokerError(f"{path} is not the secured broker's users file: {exc}") from exc
    return dict(loaded)


def scram_argument(user: str, password: str) -> str:
    """`kafka-storage format --add-scram`'s value for one user."""
    _check_user(user, password)
    return f"{SCRAM_MECHANISM}=[name={user},password={password}]"


def format_refusal(formatted: str | None, *, secure: bool, users_kept: bool, state_dir: Path) -> str | None:
    """Why a storage formatted `formatted` (None: not yet) must not start `secure` or plain; None
    when it may. One formatted plain has no SCRAM users and one formatted secure no PLAINTEXT
    listener: started the other way, it would be a broker nobody can use, or half secured. One
    formatted secure whose passwords file is gone has users nobody knows the passwords of."""
    reset = f"reset it (its topics are lost): `docstream broker stop && rm -rf {state_dir}`"
    wanted = SECURE if secure else PLAIN
    if formatted is not None and formatted != wanted:
        how = "with --secure (or DOCSTREAM_BROKER_SECURE=true)" if formatted == SECURE else "without --secure"
        return (
            f"the broker in {state_dir} was formatted {formatted} and cannot start {wanted}: "
            f"start it {how}, or {reset}"
        )
    if formatted == SECURE and not users_kept:
        return f"the broker in {state_dir} was formatted secure but its users' passwords are gone: {reset}"
    return None


def java_argfile(arguments: Iterable[str]) -> str:
    """A `java @file` argument file holding `arguments` (one quoted per line): the format
    command's SCRAM passwords are read from it rather than shown on the process list."""
    quoted = (arg.replace("\\", "\\\\").replace('"', '\\"') for arg in arguments)
    return "".join(f'"{arg}"\n' for arg in quoted)


def _check_user(user: str, password: str) -> None:
    if not USER_PATTERN.fullmatch(user) or not PASSWORD_PATTERN.fullmatch(password):
        raise BrokerError(
            f"the SCRAM user {user!r} has a name or password outside [A-Za-z0-9_-] (16+ characters)"
        )


# -- what a client needs ------------------------------------------------------------------------


def client_config(bootstrap: str, ca_cert: Path, user: str, password: str) -> dict[str, str]:
    """librdkafka's configuration for `user` on the secured broker. Hostname verification stays
    on (librdkafka's default, `ssl.endpoint.identification.algorithm=https`)."""
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": SECURITY_PROTOCOL,
        "sasl.mechanism": SCRAM_MECHANISM,
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(ca_cert),
    }


# Settings field -> the librdkafka key it feeds (docstream.kafka.config.connection_config).
CLIENT_FIELDS = {
    "bootstrap_servers": "bootstrap.servers",
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "ssl_ca_location": "ssl.ca.location",
    "sasl_username": "sasl.username",
    "sasl_password": "sasl.password",
}


def client_settings(bootstrap: str, ca_cert: Path, user: str, password: str) -> dict[str, str]:
    """The same as environment variables of docstream's settings (`DOCSTREAM_SASL_USERNAME` ...),
    in the order a user pastes them; `Settings(**client_settings(...))` takes them as they are."""
    config = client_config(bootstrap, ca_cert, user, password)
    return {env_name(field): config[key] for field, key in CLIENT_FIELDS.items()}


def env_name(field: str) -> str:
    """The DOCSTREAM_ environment variable of a Settings field (its alias, else prefix + name)."""
    alias = Settings.model_fields[field].validation_alias
    names = alias.choices if alias is not None and hasattr(alias, "choices") else []
    return next(
        (str(name) for name in names if str(name).startswith("DOCSTREAM_")),
        f"DOCSTREAM_{field.upper()}",
    )
