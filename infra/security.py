"""The secured local broker's material on disk: made with openssl at the first secured start,
found again on every later one (`BrokerMaterial.ensure`).

The edge of `infra.tls`: this module runs its openssl commands (`infra.processes.run_tool`),
writes its files with their modes, draws the certificate serial and the passwords
(`secrets`), and reads the users' passwords back. A broker certificate that ends within a week
is made again from the same CA (clients keep trusting ca.pem); the CA and the passwords are made
once and kept.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from docstream.errors import BrokerError, ToolMissingError
from infra import tls
from infra.processes import run_tool
from infra.tls import DIR_MODE, PRIVATE_MODE, TlsFiles

OPENSSL_HINT = "OpenSSL (e.g. `apt-get install openssl` or `brew install openssl`)"
TOOL_TIMEOUT_S = 60.0


class BrokerMaterial:
    """The CA, the broker certificate and the SCRAM users of one secured broker (or cluster)."""

    def __init__(
        self,
        root: Path,
        *,
        openssl: str = "openssl",
        make_password: Callable[[], str] = secrets.token_urlsafe,
        make_serial: Callable[[], int] = lambda: secrets.randbits(63),
    ) -> None:
        self.files = TlsFiles(root)
        self.openssl = openssl
        self.make_password = make_password
        self.make_serial = make_serial

    def ensure(self, users: Iterable[str]) -> dict[str, str]:
        """Make what is missing (the folder, the CA, a broker certificate, the users' passwords)
        and tighten the modes of what is there; every user's password."""
        # The folder is private before anything is made in it: a key openssl writes is never
        # readable by others, even before its own mode is tightened below.
        self.files.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.files.root, DIR_MODE)
        openssl = self._openssl()
        if not self.files.ca_cert.exists() or not self.files.ca_key.exists():
            self._run(tls.key_command(openssl, self.files.ca_key), "make the CA's key")
            self._run(tls.ca_command(openssl, self.files), "make the CA's certificate")
            self.files.broker_cert.unlink(missing_ok=True)  # signed by a CA that is gone
        if not self._broker_cert_current(openssl):
            self._make_broker_certificate(openssl)
        passwords = self._ensure_users(users)
        for path in self.files.private:
            os.chmod(path, PRIVATE_MODE)
        return passwords

    def passwords(self) -> dict[str, str]:
        """The users' passwords; a BrokerError when the broker was never started secured."""
        path = self.files.users
        try:
            return tls.parse_users(path.read_text(), path)
        except FileNotFoundError as exc:
            raise BrokerError(
                f"no SCRAM users at {path}: the local broker is not secured "
                "(`docstream broker start --secure`)"
            ) from exc

    def password(self, user: str) -> str:
        """One user's password; a BrokerError naming the users there are when it is none of them."""
        passwords = self.passwords()
        if user not in passwords:
            raise BrokerError(
                f"no SCRAM user {user!r} on the secured broker; its users: {', '.join(passwords)}"
            )
        return passwords[user]

    def exists(self) -> bool:
        return self.files.users.exists()

    def _ensure_users(self, users: Iterable[str]) -> dict[str, str]:
        wanted = tuple(users)
        known = self.passwords() if self.files.users.exists() else {}
        added = tls.new_passwords([u for u in wanted if u not in known], self.make_password)
        if added:
            write_private(self.files.users, tls.render_users({**known, **added}))
        return {**known, **added}

    def _broker_cert_current(self, openssl: str) -> bool:
        """A broker certificate and keystore are there and the certificate is not about to end."""
        if not (self.files.broker_cert.exists() and self.files.keystore.exists()):
            return False
        command = tls.expiring_command(openssl, self.files.broker_cert)
        return subprocess.run(command, capture_output=True, timeout=TOOL_TIMEOUT_S).returncode == 0

    def _make_broker_certificate(self, openssl: str) -> None:
        files = self.files
        self._run(tls.key_command(openssl, files.broker_key), "make the broker's key")
        self._run(tls.csr_command(openssl, files), "make the broker's certificate request")
        write_private(files.broker_extensions, tls.broker_extensions())
        self._run(tls.sign_command(openssl, files, self.make_serial()), "sign the broker's certificate")
        files.broker_csr.unlink(missing_ok=True)
        files.broker_extensions.unlink(missing_ok=True)
        keystore = tls.keystore_pem(
            files.broker_key.read_text(), files.broker_cert.read_text(), files.ca_cert.read_text()
        )
        write_private(files.keystore, keystore)

    def _run(self, command: list[str], what: str) -> None:
        run_tool(command, TOOL_TIMEOUT_S, f"openssl could not {what} in {self.files.root}")

    def _openssl(self) -> str:
        path = shutil.which(self.openssl)
        if path is None:
            raise ToolMissingError(
                f"`{self.openssl}` was not found on PATH: the secured local broker (--secure, "
                f"DOCSTREAM_BROKER_SECURE) makes its certificates with {OPENSSL_HINT}"
            )
        return path


def write_private(path: Path, text: str) -> None:
    """Write a file that only its owner may read, never readable by others for a moment."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_MODE)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)
    os.chmod(path, PRIVATE_MODE)
