"""Tenants held apart in the ingest API's URI imports, on a real broker: a JSON upload's URI is read
only when it names a regular, single-link file in the tenant's own folder of the import root after
symlinks, from the descriptor that was checked (docstream.confined). Each refusal is a 400 whose
body shows no server path and no other tenant's name, with nothing stored and nothing published;
a symlink flipped to another tenant's file while 200 uploads name it never publishes that file."""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from kafka_helpers import private_broker, read_partitions, value_of

from docstream.api.keys import KeyStore
from docstream.api.server import ServedApi, serve_in_thread
from docstream.api.service import ApiService
from docstream.settings import ApiSettings, Settings
from docstream.topology import DOC_UPLOADED
from infra.broker import LocalBroker
from producers.documents import text_pdf
from schemas.codec import make_codec

pytestmark = pytest.mark.kafka

RUN = uuid.uuid4().hex[:8]
THEIRS = text_pdf([f"globex's confidential ledger {RUN}"])  # a valid document: only the rule refuses it
OUTSIDE = text_pdf([f"a document outside the import root {RUN}"])
SAFE = text_pdf([f"acme's own document {RUN}"])


@dataclass(frozen=True)
class Door:
    """The API on a private broker, its import root and blob store, and the tenants' keys."""

    api: ServedApi
    settings: Settings
    broker: LocalBroker
    inbox: Path
    tmp: Path
    auth: Callable[[str], dict[str, str]]

    def post(self, tenant: str, relative: str) -> requests.Response:
        uri = f"file://{self.inbox}/{relative}"
        return requests.post(
            f"{self.api.url}/v1/documents", headers=self.auth(tenant), json={"uri": uri}, timeout=15
        )

    def published(self, tenant: str) -> list[str]:
        """The content sha256 of every doc.uploaded event of `tenant`, in order."""
        codec = make_codec(None)
        records = [
            codec.decode(DOC_UPLOADED, value_of(msg), topic=DOC_UPLOADED)
            for msg in read_partitions(self.broker.bootstrap, DOC_UPLOADED, 1)
        ]
        return [str(r["content_sha256"]) for r in records if r["tenant"] == tenant]

    def stored(self) -> set[str]:
        """The names of the content objects in the blob store (a document's sha256 each)."""
        content = Path(self.settings.blob_root) / "content"
        return {p.name for p in content.rglob("*") if p.is_file()} if content.exists() else set()


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    tmp = Path(os.path.realpath(tmp_path_factory.mktemp("tenant-paths")))
    inbox = tmp / "inbox"
    (inbox / "acme" / "2024").mkdir(parents=True)
    (inbox / "globex").mkdir(parents=True)
    (inbox / "globex" / "confidential.pdf").write_bytes(THEIRS)
    (tmp / "outside.pdf").write_bytes(OUTSIDE)
    with private_broker(tmp / "broker", 1) as broker:
        settings = Settings(
            bootstrap_servers=broker.bootstrap,
            home=tmp / "home",
            topic_partitions=1,
            api=ApiSettings(refresh_s=0.5, import_roots=(str(inbox),)),
        )
        keys: dict[str, dict[str, str]] = {}

        def auth(tenant: str) -> dict[str, str]:
            if tenant not in keys:
                keys[tenant] = {
                    "Authorization": f"Bearer {KeyStore.from_settings(settings).create(tenant).key}"
                }
            return keys[tenant]

        with serve_in_thread(ApiService.from_settings(settings)) as api:
            yield Door(api, settings, broker, inbox, tmp, auth)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _acme_gl(inbox: Path) -> tuple[str, str]:
    (inbox / "acme" / "gl").symlink_to("../globex")
    return "acme", "acme/gl/confidential.pdf"


def _acme_gl_absolute(inbox: Path) -> tuple[str, str]:
    (inbox / "acme" / "gl-abs").symlink_to(inbox / "globex")
    return "acme", "acme/gl-abs/confidential.pdf"


def _hard_link(inbox: Path) -> tuple[str, str]:
    os.link(inbox / "globex" / "confidential.pdf", inbox / "acme" / "hard.pdf")
    return "acme", "acme/hard.pdf"


def _tenant_folder_to_globex(inbox: Path) -> tuple[str, str]:
    (inbox / "initech").symlink_to(inbox / "globex")
    return "initech", "initech/confidential.pdf"


def _tenant_folder_to_etc(inbox: Path) -> tuple[str, str]:
    (inbox / "umbrella").symlink_to("/etc")
    return "umbrella", "umbrella/passwd"


def _outside_the_root(inbox: Path) -> tuple[str, str]:
    (inbox / "acme" / "outside.pdf").symlink_to(inbox.parent / "outside.pdf")
    return "acme", "acme/outside.pdf"


def _fifo(inbox: Path) -> tuple[str, str]:
    os.mkfifo(inbox / "acme" / "pipe.pdf")
    return "acme", "acme/pipe.pdf"


def _a_folder(inbox: Path) -> tuple[str, str]:
    return "acme", "acme/2024"


def _another_tenants_folder_by_name(inbox: Path) -> tuple[str, str]:
    return "acme", "globex/confidential.pdf"


def _dot_dot(inbox: Path) -> tuple[str, str]:
    return "acme", "acme/../globex/confidential.pdf"


def _percent_dot_dot(inbox: Path) -> tuple[str, str]:
    return "acme", "acme/%2e%2e/globex/confidential.pdf"


@pytest.mark.parametrize(
    "case",
    [
        _acme_gl,
        _acme_gl_absolute,
        _hard_link,
        _tenant_folder_to_globex,
        _tenant_folder_to_etc,
        _outside_the_root,
        _fifo,
        _a_folder,
        _another_tenants_folder_by_name,
        _dot_dot,
        _percent_dot_dot,
    ],
)
def test_a_uri_not_naming_a_single_link_file_of_the_tenants_own_folder_is_400_nothing_stored_or_published(
    door: Door, case: Callable[[Path], tuple[str, str]]
) -> None:
    tenant, relative = case(door.inbox)
    events, stored = door.published(tenant), door.stored()
    answer = door.post(tenant, relative)
    assert answer.status_code == 400, answer.text
    assert str(door.tmp) not in answer.text and "/etc" not in answer.text, answer.text
    assert "globex" not in answer.text, answer.text
    assert answer.json()["error"].startswith("the uri ")
    assert door.stored() == stored and sha(THEIRS) not in stored
    assert door.published(tenant) == events


def test_the_tenants_own_files_are_202_a_plain_one_one_in_a_subfolder_and_one_through_its_own_symlink(
    door: Door,
) -> None:
    documents = {
        "acme/plain.pdf": text_pdf([f"plain {RUN}"]),
        "acme/2024/invoice.pdf": text_pdf([f"in a subfolder {RUN}"]),
    }
    for relative, data in documents.items():
        (door.inbox / relative).write_bytes(data)
    (door.inbox / "acme" / "latest.pdf").symlink_to("2024/invoice.pdf")
    for relative, data in [*documents.items(), ("acme/latest.pdf", documents["acme/2024/invoice.pdf"])]:
        answer = door.post("acme", relative)
        assert answer.status_code == 202, (relative, answer.text)
        assert answer.json()["content_sha256"] == sha(data) and answer.json()["tenant"] == "acme"
    published = door.published("acme")
    assert {sha(d) for d in documents.values()} <= set(published)
    assert published.count(sha(documents["acme/2024/invoice.pdf"])) == 1  # the symlink's: deduplicated
    assert {sha(d) for d in documents.values()} <= door.stored()


def test_a_symlink_flipped_to_globex_while_200_uploads_name_it_never_publishes_globexs_file(
    door: Door,
) -> None:
    """A thread swaps acme/flip between acme's safe.pdf and ../globex/confidential.pdf (a new link
    renamed over it) in a tight loop while the uploads run: every 202 is the safe file's."""
    acme = door.inbox / "acme"
    (acme / "safe.pdf").write_bytes(SAFE)
    targets = ("safe.pdf", "../globex/confidential.pdf")
    (acme / "flip").symlink_to(targets[0])
    stop = threading.Event()
    flips = 0

    def flipping() -> None:
        nonlocal flips
        while not stop.is_set():
            spare = acme / f"flip.{flips % 2}"
            spare.symlink_to(targets[flips % 2 == 0])
            os.replace(spare, acme / "flip")
            flips += 1

    flipper = threading.Thread(target=flipping, name="symlink flipper", daemon=True)
    flipper.start()
    try:
        answers = [door.post("acme", "acme/flip") for _ in range(200)]
    finally:
        stop.set()
        flipper.join(10)
    statuses = [a.status_code for a in answers]
    assert set(statuses) <= {202, 400}, statuses
    accepted = [a.json() for a in answers if a.status_code == 202]
    assert {a["content_sha256"] for a in accepted} <= {sha(SAFE)}
    assert all("globex" not in a.text for a in answers if a.status_code == 400)
    assert sha(THEIRS) not in door.published("acme") and sha(THEIRS) not in door.stored()
    # Both sides of the flip were really seen, and the flipper kept flipping through the run.
    assert statuses.count(202) > 0 and statuses.count(400) > 0 and flips > 200, (statuses.count(202), flips)
    print(
        f"200 uploads, {flips} flips: {statuses.count(202)} x 202 (acme's file), {statuses.count(400)} x 400"
    )
