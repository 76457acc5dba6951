"""The publisher against a real broker: delivery reports, consuming back, dedupe, failures, CLI."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Message
from typer.testing import CliRunner

from docstream.blobstore import BlobStore
from docstream.errors import ConfigurationError, DeliveryError, KafkaError
from docstream.kafka.config import connection_config
from docstream.settings import Settings
from docstream.validation import Limits
from producers.batch import DocumentOutcome
from producers.delivery import DeliveryFuture
from producers.murmur2 import java_partition
from producers.publisher import Publisher
from schemas.codec import Codec, make_codec

NOW = datetime(2026, 3, 4, 5, 6, 7, 890000, tzinfo=UTC)
PDF = b"%PDF-1.7\n1 0 obj << >> endobj\n%%EOF\n"


@pytest.fixture
def codec() -> Codec:
    return make_codec(None)


@pytest.fixture
def publisher(settings: Settings, codec: Codec) -> Iterator[Publisher]:
    with Publisher(
        connection_config(settings), codec=codec, blobs=BlobStore(settings.blob_root), clock=lambda: NOW
    ) as pub:
        yield pub


def consume(settings: Settings, topic: str, count: int, timeout: float = 30.0) -> list[Message]:
    """Read `count` events from the start of `topic` with a plain confluent-kafka consumer."""
    consumer = Consumer(
        {
            **connection_config(settings),
            "group.id": f"test-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    messages: list[Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(messages) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                messages.append(msg)
    finally:
        consumer.close()
    assert len(messages) == count, f"read {len(messages)} of {count} events from {topic}"
    return messages


def text_files(folder: Path, count: int, stem: str, text: str) -> list[Path]:
    """`count` small text files `<stem>00.txt` ..., file i holding `text.format(i)`."""
    files = [folder / f"{stem}{i:02d}.txt" for i in range(count)]
    for i, path in enumerate(files):
        path.write_text(text.format(i))
    return files


def uploaded_record(document_id: str, **changes: Any) -> dict[str, Any]:
    return {
        "document_id": document_id,
        "tenant": "acme",
        "content_sha256": "cd" * 32,
        "size_bytes": 10,
        "content_type": "text/plain",
        "blob_uri": "/blobs/content/cd/" + "cd" * 32,
        "uploaded_at": NOW,
        "trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": None},
        "attributes": {},
        "source": None,
    } | changes


def test_published_document_is_consumed_back_and_decodes(
    publisher: Publisher, settings: Settings, new_topic: Callable[..., str], codec: Codec
) -> None:
    topic = new_topic(partitions=3)
    doc = publisher.publish_document(
        PDF, tenant="acme", attributes={"lang": "en"}, source="scanner", topic=topic
    )

    (msg,) = consume(settings, topic, 1)
    assert msg.key() == doc.document_id.encode()
    assert (msg.partition(), msg.offset()) == (doc.delivery.partition, doc.delivery.offset)
    event = codec.decode("doc.uploaded", msg.value() or b"", topic=topic)
    assert event == {
        "document_id": doc.document_id,
        "tenant": "acme",
        "content_sha256": doc.content_sha256,
        "size_bytes": len(PDF),
        "content_type": "application/pdf",
        "blob_uri": doc.blob_uri,
        "uploaded_at": NOW,
        "trace": {"traceparent": doc.traceparent, "tracestate": None},
        "attributes": {"lang": "en"},
        "source": "scanner",
    }
    assert BlobStore(settings.blob_root).get(event["blob_uri"]) == PDF


def test_blocking_publish_returns_the_delivery_report(
    publisher: Publisher, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=3)
    before_ms = time.time() * 1000
    result = publisher.publish("doc.uploaded", uploaded_record("doc-blocking"), topic=topic)
    assert result.topic == topic
    assert result.partition == java_partition(b"doc-blocking", 3)
    assert result.offset == 0
    assert before_ms - 1000 <= result.timestamp_ms <= time.time() * 1000 + 1000
    assert 0 < result.latency_s < 30


def test_async_publish_settles_futures_and_calls_back_in_partition_order(
    publisher: Publisher, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=3)
    called_back: list[DeliveryFuture] = []
    futures = [
        publisher.publish_async(
            "doc.uploaded", uploaded_record(f"doc-{i}"), topic=topic, on_delivery=called_back.append
        )
        for i in range(50)
    ]
    results = [f.result(timeout=30) for f in futures]
    assert len(called_back) == 50 and all(f.done() for f in called_back)
    for partition in range(3):
        offsets = [r.offset for r in results if r.partition == partition]
        assert offsets == list(range(len(offsets)))  # one producer, one key order per partition
    assert {r.partition for r in results} == {java_partition(f"doc-{i}".encode(), 3) for i in range(50)}


def test_fire_and_forget_raw_events_are_all_there_after_flush(
    publisher: Publisher, settings: Settings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=3)
    for i in range(200):
        publisher.publish_raw(topic, f"key-{i}".encode(), f"value-{i}".encode(), {"origin": b"test"})
    publisher.flush(timeout=30)
    assert publisher.pending() == 0
    messages = consume(settings, topic, 200)
    assert sorted(m.value() or b"" for m in messages) == sorted(f"value-{i}".encode() for i in range(200))
    assert all(m.headers() == [("origin", b"test")] for m in messages)


def test_a_full_local_queue_is_waited_out_not_an_error(
    settings: Settings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=3)
    tiny_queue = {"queue.buffering.max.messages": 5}
    with Publisher(connection_config(settings), overrides=tiny_queue) as pub:
        futures = [pub.publish_raw_async(topic, f"k{i}".encode(), b"v") for i in range(100)]
        for i in range(100):
            pub.publish_raw(topic, f"k{i}".encode(), b"v")
        pub.flush(timeout=30)
        assert all(f.exception(timeout=0) is None for f in futures)
    consume(settings, topic, 200)


def test_the_same_content_twice_is_two_events_and_one_blob(
    publisher: Publisher, settings: Settings, new_topic: Callable[..., str], codec: Codec
) -> None:
    topic = new_topic(partitions=3)
    first = publisher.publish_document(PDF, tenant="acme", topic=topic)
    second = publisher.publish_document(PDF, tenant="acme", topic=topic)

    assert (first.stored, second.stored) == (True, False)
    assert first.document_id != second.document_id
    assert first.blob_uri == second.blob_uri
    blobs = [p for p in Path(settings.blob_root).rglob("*") if p.is_file()]
    assert len(blobs) == 1
    events = [codec.decode("doc.uploaded", m.value() or b"") for m in consume(settings, topic, 2)]
    assert {e["document_id"] for e in events} == {first.document_id, second.document_id}
    assert {e["blob_uri"] for e in events} == {first.blob_uri}


def test_document_id_override_is_the_key_and_picks_the_java_partition(
    publisher: Publisher, settings: Settings, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=3)
    path = tmp_path / "scan.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16)
    doc = publisher.publish_document(path, tenant="acme", document_id="invoice-42", topic=topic)

    assert doc.document_id == "invoice-42"
    assert doc.content_type == "image/png"
    assert doc.delivery.partition == java_partition(b"invoice-42", 3)
    (msg,) = consume(settings, topic, 1)
    assert msg.key() == b"invoice-42"


def test_a_delivery_failure_surfaces_as_delivery_error(settings: Settings, codec: Codec) -> None:
    missing = f"no-such-topic-{uuid.uuid4().hex[:8]}"  # the broker does not auto-create topics
    quick = {"message.timeout.ms": 2000}
    with Publisher(connection_config(settings), codec=codec, overrides=quick) as pub:
        with pytest.raises(DeliveryError, match="not delivered"):
            pub.publish("doc.uploaded", uploaded_record("doc-lost"), topic=missing, timeout=30)

        future = pub.publish_raw_async(missing, b"k", b"v")
        assert isinstance(future.exception(timeout=30), DeliveryError)

        pub.publish_raw(missing, b"k", b"v")
        with pytest.raises(DeliveryError, match="1 events were not delivered"):
            pub.flush(timeout=30)
        pub.flush(timeout=30)  # reported once: the next flush is clean


def test_a_batch_with_many_in_flight_lands_each_document_once_in_order_and_reports_each(
    settings: Settings, new_topic: Callable[..., str], tmp_path: Path, codec: Codec
) -> None:
    topic = new_topic(partitions=3)
    files = text_files(tmp_path, 60, "doc", "document {}\n")
    too_large, missing = files[17], files[42]
    too_large.write_text("x" * 200)
    missing.unlink()
    blobs = BlobStore(settings.blob_root)
    small = Limits(max_bytes=100)
    reported: list[DocumentOutcome] = []
    with Publisher(connection_config(settings), codec=codec, blobs=blobs, limits=small) as publisher:
        outcomes = publisher.publish_documents(
            files, tenant="acme", topic=topic, max_in_flight=16, on_outcome=reported.append
        )
    assert reported == outcomes
    assert [o.upload.data for o in outcomes] == files
    failed = {o.upload.data: str(o.error) for o in outcomes if o.status == "failed"}
    assert failed == {
        too_large: "document doc17.txt: 200 bytes > the limit of 100",
        missing: f"cannot read {missing}: No such file or directory",
    }
    landed = [o.published for o in outcomes if o.published is not None]
    assert len(landed) == 58
    messages = consume(settings, topic, 58)
    events = [codec.decode("doc.uploaded", m.value() or b"") for m in messages]
    assert sorted(e["document_id"] for e in events) == sorted(d.document_id for d in landed)  # each once
    by_id = {m.key(): (m.partition(), m.offset()) for m in messages}
    for doc in landed:  # the acknowledgement names where the event is
        assert by_id[doc.document_id.encode()] == (doc.delivery.partition, doc.delivery.offset)
        assert doc.delivery.partition == java_partition(doc.document_id.encode(), 3)
    for partition in range(3):  # each partition holds its documents in the batch's order
        offsets = [d.delivery.offset for d in landed if d.delivery.partition == partition]
        assert offsets == list(range(len(offsets)))
    for event in events:  # every event points at stored content
        assert blobs.get(event["blob_uri"]).decode().startswith("document ")
    stored = [p for p in Path(settings.blob_root).rglob("*") if p.is_file()]
    assert len(stored) == 58  # nothing of the refused documents


def test_a_batch_stops_at_a_delivery_failure_and_reports_the_rest_not_attempted(
    settings: Settings, codec: Codec
) -> None:
    missing = f"no-such-topic-{uuid.uuid4().hex[:8]}"
    quick = {"message.timeout.ms": 2000}
    blobs = BlobStore(settings.blob_root)
    with Publisher(connection_config(settings), codec=codec, blobs=blobs, overrides=quick) as publisher:
        documents = [f"document {i}".encode() for i in range(10)]
        outcomes = publisher.publish_documents(documents, tenant="acme", topic=missing, max_in_flight=4)
    assert [o.status for o in outcomes] == ["failed"] * 4 + ["not attempted"] * 6
    assert all(isinstance(o.error, DeliveryError) for o in outcomes[:4])


def test_check_topic_fails_fast_for_a_missing_topic_and_counts_partitions(
    publisher: Publisher, new_topic: Callable[..., str]
) -> None:
    assert publisher.check_topic(new_topic(partitions=3)) == 3
    with pytest.raises(KafkaError, match="not available"):
        publisher.check_topic(f"no-such-topic-{uuid.uuid4().hex[:8]}", timeout=10)


def test_a_closed_publisher_refuses_to_publish(settings: Settings) -> None:
    pub = Publisher(connection_config(settings))
    pub.close()
    pub.close()  # idempotent
    with pytest.raises(ConfigurationError, match="closed"):
        pub.publish_raw("any", b"k", b"v")


# -- the CLI ------------------------------------------------------------------------------


def cli_env(settings: Settings) -> dict[str, str | None]:
    return {"KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap, "DOCSTREAM_HOME": str(settings.home)}


def run_cli(args: list[str], env: dict[str, str | None]) -> Any:
    from docstream.cli import app

    return CliRunner().invoke(app, ["publish", *args], env=env)


def test_cli_publishes_files_as_json(
    settings: Settings, new_topic: Callable[..., str], tmp_path: Path, codec: Codec
) -> None:
    topic = new_topic(partitions=3)
    files = [tmp_path / "a.pdf", tmp_path / "b.txt", tmp_path / "c.pdf"]
    files[0].write_bytes(PDF)
    files[1].write_text("hello")
    files[2].write_bytes(PDF)  # same content as a.pdf

    result = run_cli(["--json", "--tenant", "acme", "--topic", topic, *map(str, files)], cli_env(settings))

    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["totals"] == {"documents": 3, "bytes": 2 * len(PDF) + 5, "stored": 2, "deduplicated": 1}
    content_types = [d["content_type"] for d in out["documents"]]
    assert content_types == ["application/pdf", "text/plain", "application/pdf"]
    events = [codec.decode("doc.uploaded", m.value() or b"") for m in consume(settings, topic, 3)]
    assert {e["document_id"] for e in events} == {d["document_id"] for d in out["documents"]}
    assert {e["tenant"] for e in events} == {"acme"}


def test_cli_reports_each_file_publishes_the_others_and_exits_2(
    settings: Settings, new_topic: Callable[..., str], tmp_path: Path, codec: Codec
) -> None:
    topic = new_topic(partitions=3)
    files = text_files(tmp_path, 30, "f", "file {}")
    files[3].write_bytes(b"")
    files[20].write_text("y" * 500)
    env = cli_env(settings) | {"DOCSTREAM_LIMITS__MAX_BYTES": "100"}

    result = run_cli(["--json", "--in-flight", "8", "--topic", topic, *map(str, files)], env)

    assert result.exit_code == 2, result.output
    out = json.loads(result.stdout)
    assert out["failed"] == [
        {"file": str(files[3]), "error": "document f03.txt is empty: there is nothing in it to process"},
        {"file": str(files[20]), "error": "document f20.txt: 500 bytes > the limit of 100"},
    ]
    assert out["not_attempted"] == []
    assert [d["file"] for d in out["documents"]] == [str(f) for i, f in enumerate(files) if i not in (3, 20)]
    assert out["totals"] == {
        "documents": 28,
        "bytes": sum(len(f"file {i}") for i in range(30) if i not in (3, 20)),
        "stored": 28,
        "deduplicated": 0,
    }
    events = [codec.decode("doc.uploaded", m.value() or b"") for m in consume(settings, topic, 28)]
    assert sorted(e["document_id"] for e in events) == sorted(d["document_id"] for d in out["documents"])

    table = run_cli(["--topic", topic, str(files[0]), str(files[3])], env)  # and for a person
    assert table.exit_code == 2
    assert "f03.txt is empty" in table.output and "f00.txt" in table.output


@pytest.mark.parametrize(
    ("option", "error"),
    [
        (["--tenant", "no tenant"], "documents: tenant 'no tenant' is not"),
        (["--content-type", "x/y"], "unsupported"),
    ],
)
def test_cli_refuses_a_bad_option_once_and_stores_nothing(
    settings: Settings, new_topic: Callable[..., str], tmp_path: Path, option: list[str], error: str
) -> None:
    files = text_files(tmp_path, 3, "f", "file {}")
    result = run_cli(["--topic", new_topic(partitions=1), *option, *map(str, files)], cli_env(settings))
    assert result.exit_code == 2
    assert result.output.count("error:") == 1 and error in result.output
    assert not (Path(settings.blob_root) / "content").exists()


def test_cli_document_id_names_the_key(
    settings: Settings, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=3)
    path = tmp_path / "x.pdf"
    path.write_bytes(PDF)
    result = run_cli(["--json", "--topic", topic, "--document-id", "doc-7", str(path)], cli_env(settings))
    assert result.exit_code == 0, result.output
    (doc,) = json.loads(result.stdout)["documents"]
    assert doc["document_id"] == "doc-7"
    assert doc["partition"] == java_partition(b"doc-7", 3)
    (msg,) = consume(settings, topic, 1)
    assert msg.key() == b"doc-7"


def test_cli_refuses_document_id_with_several_files(settings: Settings, tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("a")
    b.write_text("b")
    result = run_cli(["--document-id", "d", str(a), str(b)], cli_env(settings))
    assert result.exit_code == 2
    assert "--document-id" in result.output and "2 files" in result.output


def test_cli_missing_file_is_a_usage_error(settings: Settings, tmp_path: Path) -> None:
    result = run_cli([str(tmp_path / "absent.pdf")], cli_env(settings))
    assert result.exit_code == 2
    assert "does not exist" in result.output


def test_cli_missing_topic_fails_fast(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("a")
    started = time.monotonic()
    result = run_cli(["--topic", f"no-such-topic-{uuid.uuid4().hex[:8]}", str(path)], cli_env(settings))
    assert result.exit_code == 2
    assert "not available" in result.output
    assert time.monotonic() - started < 15
    assert not (Path(settings.blob_root) / "content").exists()  # nothing stored for nothing


def test_cli_without_a_running_local_broker_fails_fast(tmp_path: Path) -> None:
    from infra.broker import free_port

    path = tmp_path / "a.txt"
    path.write_text("a")
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": None,  # unset: the local broker is meant
        "DOCSTREAM_BOOTSTRAP_SERVERS": None,
        "DOCSTREAM_HOME": str(tmp_path / "home"),
        "DOCSTREAM_LOCAL_BROKER_PORT": str(free_port()),
    }
    started = time.monotonic()
    result = run_cli([str(path)], env)
    assert result.exit_code == 2
    assert "broker is not running" in result.output
    assert time.monotonic() - started < 5


def test_cli_refuses_an_empty_file_and_publishes_nothing(
    settings: Settings, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=1)
    empty, fine = tmp_path / "empty.txt", tmp_path / "fine.txt"
    empty.write_bytes(b"")
    fine.write_text("some text")
    result = run_cli(["--topic", topic, str(empty)], cli_env(settings))
    assert result.exit_code == 2
    assert "empty.txt is empty" in result.output
    result = run_cli(["--topic", topic, str(fine)], cli_env(settings))  # the topic sees only this one
    assert result.exit_code == 0, result.output
    (msg,) = consume(settings, topic, 1)
    assert (
        json.loads(json.dumps(make_codec(None).decode("doc.uploaded", msg.value() or b"")["size_bytes"])) == 9
    )


def test_cli_refuses_a_type_no_stage_reads(
    settings: Settings, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    path = tmp_path / "tool.exe"
    path.write_bytes(b"MZ\x90\x00\x03\x00\x00\x00")
    result = run_cli(["--topic", new_topic(partitions=1), str(path)], cli_env(settings))
    assert result.exit_code == 2
    assert "unsupported content type" in result.output
