"""A publish that times out has one meaning, on a broker of the test's own that is down, then back.

The publish raises PublishTimeout, which says the event may still be stored and carries the record;
the broker comes back and the producer delivers it anyway while it closes; the caller publishes
the record again as the error says. The topic then holds that upload twice, and every consumer
counts it once: the rollup fold, the warehouse's upload identity, and a stage's completion key.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka_helpers import read_messages
from typed_records import upload_event

from consumers.analytics.events import upload_from_record
from consumers.analytics.windows import WindowFold
from consumers.warehouse.rows import upload_row
from docstream.blobstore import BlobStore
from docstream.errors import PublishTimeout
from docstream.idempotency import completion_key
from docstream.topology import TopicSpec
from infra.broker import LocalBroker, free_port
from infra.topics import ensure_topics
from producers.events import DOC_UPLOADED_EVENT
from producers.publisher import Publisher
from schemas.codec import make_codec
from schemas.events import DocUploaded


@pytest.fixture
def broker(kafka_jars: Path, tmp_path: Path) -> Iterator[LocalBroker]:
    own = LocalBroker(tmp_path / "broker", broker_port=free_port(), controller_port=free_port())
    own.start(timeout=90)
    try:
        yield own
    finally:
        own.stop(timeout=15)


def test_a_timed_out_publish_published_again_is_one_upload_downstream(
    broker: LocalBroker, tmp_path: Path
) -> None:
    topic = f"uploads-{uuid.uuid4().hex[:8]}"
    connection = {"bootstrap.servers": broker.bootstrap}
    ensure_topics(connection, [TopicSpec(topic, 1, ())])
    codec, blobs = make_codec(None), BlobStore(str(tmp_path / "blobs"))
    publisher = Publisher(
        connection, codec=codec, blobs=blobs, overrides={"message.timeout.ms": 120_000, "log_level": 0}
    )
    publisher.check_topic(topic)
    broker.stop(timeout=15)
    with pytest.raises(PublishTimeout) as caught:
        publisher.publish_document(
            b"quarterly figures", tenant="acme", content_type="text/plain", topic=topic, timeout=2.0
        )
    error = caught.value
    assert isinstance(error, TimeoutError)  # what callers of a blocking publish catch
    assert "may still be stored" in str(error) and "120000 ms" in str(error)
    assert "same record again" in str(error)
    record = error.record
    assert isinstance(record, dict) and error.topic == topic

    broker.start(timeout=90)
    publisher.close(timeout=60)  # the producer delivers the timed-out event after all
    with Publisher(connection, codec=codec) as again:  # the caller retries as the error says
        again.publish(DOC_UPLOADED_EVENT, record, topic=topic, timeout=30)

    events = [
        codec.decode("doc.uploaded", m.value() or b"") for m in read_messages(broker.bootstrap, topic, 3, 20)
    ]
    assert len(events) == 2 and events[0] == events[1]  # stored twice: delivered late, and published again
    fold = WindowFold()
    assert [fold.add(upload_from_record(event)) for event in events] == [True, False]
    assert fold.duplicates == 1
    rows = [upload_row(upload_event(event), 0, offset) for offset, event in enumerate(events)]
    identity = {
        (row[1], row[0], row[5]) for row in rows
    }  # the uploads table's key: tenant, document, uploaded_at
    assert len(identity) == 1  # one `uploads` row: (tenant, document, uploaded_at) is its key
    uploads = [DocUploaded.from_record(event) for event in events]
    assert (
        len({completion_key("ocr", "v1", u, u.uploaded_at) for u in uploads}) == 1
    )  # one completion per stage
