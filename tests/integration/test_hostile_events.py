"""Hostile doc.uploaded events on a real broker, through the OCR, embeddings and thumbnails groups.

Each group must read nothing outside the blob store (another scheme, `..`, a relative path, a
symlink out), hash what it reads before computing or reusing anything, refuse bad fields where the
event enters, and refuse the same documents for the same reason (unknown type, page bomb, pixel
bomb, text that is not UTF-8): every such event lands in the group's dead-letter topic with its
reason, no result object or completion comes of it, and the good documents around it complete.
"""

from __future__ import annotations

import hashlib
import io
import time
import uuid
import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka_helpers import create_topics, read_messages, value_of
from PIL import Image

from consumers.embeddings.model import EmbeddingModel
from consumers.embeddings.worker import EmbeddingStage
from consumers.handler import stage_decoder, stage_handler
from consumers.ocr.engine import OcrEngine
from consumers.ocr.worker import OcrStage
from consumers.runtime import Worker
from consumers.runtime import headers as hdr
from consumers.thumbnails.worker import ThumbnailStage
from docstream.blobstore import BlobStore
from docstream.settings import OcrSettings, RuntimeSettings, ThumbnailSettings
from docstream.topology import STAGE_NAMES
from docstream.validation import Limits
from producers.documents import pdf_bomb_like, text_pdf
from schemas.codec import make_codec

ETC = Path("/etc/hosts")
PROVIDERS = ("CPUExecutionProvider",)


@pytest.fixture(scope="module")
def engines() -> tuple[OcrEngine, EmbeddingModel]:
    return OcrEngine(PROVIDERS), EmbeddingModel(providers=PROVIDERS)


def _png_claiming(width: int, height: int) -> bytes:
    """A small PNG whose header claims `width` x `height` pixels (a decompression bomb's shape)."""
    out = io.BytesIO()
    Image.new("L", (1, 1)).save(out, "PNG")
    data = bytearray(out.getvalue())
    ihdr = 8 + 8  # signature, then the IHDR chunk's length and type
    data[ihdr : ihdr + 8] = width.to_bytes(4, "big") + height.to_bytes(4, "big")

    crc = zlib.crc32(bytes(data[ihdr - 4 : ihdr + 13]))
    data[ihdr + 13 : ihdr + 17] = crc.to_bytes(4, "big")
    return bytes(data)


def _record(
    blobs: BlobStore, document_id: str, content: bytes, content_type: str, **over: Any
) -> dict[str, Any]:
    stored = blobs.put_content(content)
    return {
        "document_id": document_id,
        "tenant": "acme",
        "content_sha256": stored.sha256,
        "size_bytes": stored.size,
        "content_type": content_type,
        "blob_uri": stored.uri,
        "uploaded_at": datetime.now(UTC),
        "trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": None},
        "attributes": {},
        "source": None,
    } | over


def _outside(path: Path) -> dict[str, Any]:
    """Fields that make an event's hash and size true for a file outside the store."""
    data = path.read_bytes()
    return {"content_sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data)}


def _cases(blobs: BlobStore, root: Path) -> dict[str, tuple[dict[str, Any], str, str]]:
    """document id -> (record, error class suffix, reason) for every hostile upload."""
    victim = text_pdf(["VICTIM CONTRACT the real text"])
    attacker = text_pdf(["ATTACKER text planted under the victim's hash"])
    (root / "content" / "zz").mkdir(parents=True, exist_ok=True)
    (root / "content" / "zz" / "link").symlink_to(ETC)
    plain = "text/plain"
    cases = {
        "av-etchosts": (
            _record(blobs, "av-etchosts", b"x", plain, blob_uri=f"file://{ETC}", **_outside(ETC)),
            "UnsafeReferenceError",
            "outside the blob store",
        ),
        "av-environ": (
            _record(blobs, "av-environ", b"x", plain, blob_uri="file:///proc/self/environ"),
            "UnsafeReferenceError",
            "outside the blob store",
        ),
        "av-traversal": (
            _record(
                blobs,
                "av-traversal",
                b"x",
                plain,
                blob_uri=f"file://{root}/content/../../../../etc/hosts",
                **_outside(ETC),
            ),
            "UnsafeReferenceError",
            "canonical",
        ),
        "av-relative": (
            _record(blobs, "av-relative", b"x", plain, blob_uri="../../../../etc/hosts", **_outside(ETC)),
            "UnsafeReferenceError",
            "is not a file:// URI",
        ),
        "av-symlink": (
            _record(
                blobs, "av-symlink", b"x", plain, blob_uri=f"file://{root}/content/zz/link", **_outside(ETC)
            ),
            "UnsafeReferenceError",
            "symlink",
        ),
        "av-swapped-hash": (
            _record(
                blobs,
                "av-swapped-hash",
                attacker,
                "application/pdf",
                content_sha256=hashlib.sha256(victim).hexdigest(),
                size_bytes=len(attacker),
            ),
            "ContentMismatchError",
            hashlib.sha256(attacker).hexdigest(),  # the reason names the hash of what was read
        ),
        "av-negative-size": (
            _record(blobs, "av-negative-size", b"fine text", plain, size_bytes=-5),
            "InvalidEventError",
            "size_bytes -5",
        ),
        "": (_record(blobs, "", b"some text", plain), "InvalidEventError", "document_id"),
        "av-unknown-type": (
            _record(blobs, "av-unknown-type", b"MZ\x90\x00", "application/x-msdownload"),
            "InvalidEventError",
            "unsupported content type",
        ),
        "av-page-bomb": (
            _record(blobs, "av-page-bomb", pdf_bomb_like(100_000), "application/pdf"),
            "InvalidEventError",
            "too many pages: 100000",
        ),
        "av-huge-page": (
            _record(blobs, "av-huge-page", pdf_bomb_like(1, page_size=(14_400, 14_400)), "application/pdf"),
            "InvalidEventError",
            "page 1 too large",
        ),
        "av-pixel-bomb": (
            _record(blobs, "av-pixel-bomb", _png_claiming(30_000, 30_000), "image/png"),
            "InvalidEventError",
            "too large",
        ),
        "av-garbage-text": (
            _record(blobs, "av-garbage-text", b"\xff\xfe\x00\x81 garbage \xc3\x28", plain),
            "PermanentError",
            "not UTF-8",
        ),
    }
    return cases


def _produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> None:
    codec = make_codec(None)
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for record in records:
        producer.produce(
            topic, key=record["document_id"].encode() or b"empty", value=codec.encode("doc.uploaded", record)
        )
    assert producer.flush(15) == 0


def _run(worker: Worker, done: Callable[[Any], bool]) -> Any:
    deadline = time.monotonic() + 90
    stats = worker.run(until=lambda s: done(s) or time.monotonic() > deadline)
    assert done(stats), f"{worker.group_id} stopped at {stats}"
    return stats


def _dead_letters(bootstrap: str, topic: str, count: int) -> dict[str, dict[str, str]]:
    found = {}
    for message in read_messages(bootstrap, topic, count, timeout=30):
        key = (message.key() or b"").decode()
        found["" if key == "empty" else key] = hdr.to_dict(message.headers())
    return found


def test_every_stage_dead_letters_hostile_uploads_with_their_reason_and_reads_nothing_outside(
    kafka_bootstrap: str, tmp_path: Path, engines: tuple[OcrEngine, EmbeddingModel]
) -> None:
    name = uuid.uuid4().hex[:8]
    uploads, ocr_done, embedded, thumbnailed = (f"{t}-{name}" for t in ("up", "ocr", "emb", "thumb"))
    groups = {stage: f"test.hostile.{stage}.{name}" for stage in STAGE_NAMES}
    create_topics(
        kafka_bootstrap,
        [
            uploads,
            ocr_done,
            embedded,
            thumbnailed,
            *(f"{g}.{k}" for g in groups.values() for k in ("retry", "dlq")),
        ],
    )
    root = tmp_path / "blobs"
    blobs, codec = BlobStore(str(root)), make_codec(None)
    cases = _cases(blobs, root)
    good = _record(blobs, "good-doc", text_pdf(["An honest invoice, total 12.00"]), "application/pdf")
    _produce(kafka_bootstrap, uploads, [good, *(record for record, _, _ in cases.values())])

    connection, limits = {"bootstrap.servers": kafka_bootstrap}, Limits()
    runtime = RuntimeSettings(concurrency=2)
    ocr_engine, model = engines
    ocr_settings = OcrSettings(providers=PROVIDERS)
    n = len(cases) + 1
    ocr = Worker(
        group_id=groups["ocr"],
        topics=[uploads],
        connection=connection,
        runtime=runtime,
        handler=stage_handler(
            OcrStage(ocr_engine, ocr_settings, result_topic=ocr_done), blobs, codec, limits=limits
        ),
        decoder=stage_decoder(codec, limits),
    )
    thumbs = Worker(
        group_id=groups["thumbnails"],
        topics=[uploads],
        connection=connection,
        runtime=runtime,
        handler=stage_handler(
            ThumbnailStage(blobs, ThumbnailSettings(), result_topic=thumbnailed), blobs, codec, limits=limits
        ),
        decoder=stage_decoder(codec, limits),
    )
    emb = Worker(
        group_id=groups["embeddings"],
        topics=[uploads, ocr_done],
        connection=connection,
        runtime=runtime,
        handler=stage_handler(EmbeddingStage(model, result_topic=embedded), blobs, codec, limits=limits),
        decoder=stage_decoder(codec, limits, {ocr_done: "doc.ocr.done"}),
    )
    for worker in (ocr, thumbs):
        stats = _run(worker, lambda s: s.handled + s.dead_lettered >= n)
        assert (stats.handled, stats.dead_lettered, stats.retried) == (1, n - 1, 0), worker.group_id
    stats = _run(emb, lambda s: s.handled + s.dead_lettered >= n + 1)  # + the good document's doc.ocr.done
    assert (stats.handled, stats.dead_lettered, stats.retried) == (2, n - 1, 0)

    for stage, group in groups.items():
        letters = _dead_letters(kafka_bootstrap, f"{group}.dlq", n - 1)
        assert set(letters) == set(cases), stage
        for document_id, (_, error_class, reason) in cases.items():
            headers = letters[document_id]
            assert headers[hdr.ERROR_CLASS].endswith(error_class), (
                stage,
                document_id,
                headers[hdr.ERROR_CLASS],
            )
            assert reason in headers[hdr.ERROR_MESSAGE], (stage, document_id, headers[hdr.ERROR_MESSAGE])
            assert headers[hdr.ATTEMPT] == "1"  # permanent at once: never retried

    completed = {
        topic: {
            codec.decode(event, value_of(m))["document_id"] for m in read_messages(kafka_bootstrap, topic, 1)
        }
        for topic, event in (
            (ocr_done, "doc.ocr.done"),
            (embedded, "doc.embedded"),
            (thumbnailed, "doc.thumbnailed"),
        )
    }
    assert completed == {ocr_done: {"good-doc"}, embedded: {"good-doc"}, thumbnailed: {"good-doc"}}
    secret = ETC.read_bytes().strip().splitlines()[0]
    for path in (root / "results").rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), path


def test_a_document_whose_hash_was_claimed_by_another_event_keeps_its_own_text(
    kafka_bootstrap: str, tmp_path: Path, engines: tuple[OcrEngine, EmbeddingModel]
) -> None:
    """The attacker's event (victim's sha256, attacker's bytes) first, the victim's upload later:
    the victim's OCR text is the victim's."""
    name = uuid.uuid4().hex[:8]
    uploads, ocr_done, group = f"up-{name}", f"ocr-{name}", f"test.hash.{name}"
    create_topics(kafka_bootstrap, [uploads, ocr_done, f"{group}.retry", f"{group}.dlq"])
    blobs, codec = BlobStore(str(tmp_path / "blobs")), make_codec(None)
    victim, attacker = text_pdf(["VICTIM the real contract"]), text_pdf(["ATTACKER planted text"])
    claim = _record(
        blobs,
        "attack",
        attacker,
        "application/pdf",
        content_sha256=hashlib.sha256(victim).hexdigest(),
        size_bytes=len(attacker),
    )
    real = _record(blobs, "victim", victim, "application/pdf")
    _produce(kafka_bootstrap, uploads, [claim, real])
    settings = OcrSettings(providers=PROVIDERS)
    worker = Worker(
        group_id=group,
        topics=[uploads],
        connection={"bootstrap.servers": kafka_bootstrap},
        runtime=RuntimeSettings(concurrency=1),
        handler=stage_handler(OcrStage(engines[0], settings, result_topic=ocr_done), blobs, codec),
        decoder=stage_decoder(codec),
    )
    stats = _run(worker, lambda s: s.handled + s.dead_lettered >= 2)
    assert (stats.handled, stats.dead_lettered) == (1, 1)
    [done] = [codec.decode("doc.ocr.done", value_of(m)) for m in read_messages(kafka_bootstrap, ocr_done, 1)]
    assert done["document_id"] == "victim"
    text = blobs.get(done["result_uri"]).decode()
    assert "VICTIM the real contract" in text and "ATTACKER" not in text
