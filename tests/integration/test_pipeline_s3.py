"""The pipeline with its blob store in S3 (a real S3 server: moto's, its own process, over HTTP), on
a broker of its own: the sample documents go through the ocr, embeddings and thumbnails workers and
the warehouse sink, their objects really in the bucket; and a worker lives through an S3 outage
(the server stopped with SIGSTOP, resumed with SIGCONT) without dead-lettering anything, logging
it once when S3 goes and once when it returns."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka_helpers import private_broker

from consumers.groups import WORKER_GROUPS, build_sink, build_worker
from consumers.ops.pipeline import dead_letter_reasons, run_until_caught_up, stage_results
from consumers.warehouse.store import Warehouse
from docstream.cli.warehouse import DDL_DIR
from docstream.settings import Settings
from docstream.topology import STAGE_NAMES, declared_topics, group_id
from infra.broker import LocalBroker
from infra.s3 import S3Server
from infra.topics import ensure_topics
from producers.samples import publish_samples

pytestmark = pytest.mark.kafka

PARTITIONS = 3
OUTAGE_S = 5.0
BLOBS = f"blobs-{uuid.uuid4().hex[:8]}"  # the module's store: its tests' groups read each other's events


@pytest.fixture(scope="module")
def broker(kafka_jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    with private_broker(tmp_path_factory.mktemp("s3-pipeline-broker"), PARTITIONS) as own:
        yield own


def s3_settings(broker: LocalBroker, s3: S3Server, home: Path, groups: str, **more: object) -> Settings:
    """Settings of a run with its own groups (and their retry / dead-letter topics), on the module's store."""
    s = Settings(
        bootstrap_servers=broker.bootstrap,
        home=home,
        topic_partitions=PARTITIONS,
        blob_url=s3.blob_url(BLOBS),
        s3_endpoint_url=s3.endpoint_url,
        group_prefix=f"{groups}.",
        **more,  # type: ignore[arg-type]  # Settings' fields by name
    )
    ensure_topics({"bootstrap.servers": broker.bootstrap}, declared_topics(PARTITIONS, s.group_prefix))
    return s


def no_dead_letter_for_s3(s: Settings, name: str, ids: set[str]) -> None:
    """The group dead-lettered none of `ids`, and nothing for the blob store (an undecodable event of
    a run is dead-lettered by every group that reads it)."""
    reasons = dead_letter_reasons(s, group_id(name, s.group_prefix))
    assert not ids & set(reasons), reasons
    assert not [r for r in reasons.values() if "BlobStore" in r or "S3" in r], reasons


def test_the_sample_documents_go_through_every_group_with_their_objects_in_s3(
    broker: LocalBroker, s3_env: S3Server, tmp_path: Path
) -> None:
    s = s3_settings(broker, s3_env, tmp_path / "home", f"p{uuid.uuid4().hex[:8]}")
    published, undecodable = publish_samples(s, skip={"broken.pdf"})
    ids = {doc.document_id for _, doc in published}
    with Warehouse(s.warehouse_url) as warehouse:
        warehouse.migrate(DDL_DIR)
        workers = [build_worker(name, s) for name in WORKER_GROUPS]
        sink, sink_worker = build_sink(s, warehouse)
        with sink:
            run_until_caught_up(s, [*workers, sink_worker], 240, lambda _: None)

    results = stage_results(s, ids)
    for name in STAGE_NAMES:
        assert {event["document_id"] for event in results[name]} == ids, name
    for name in WORKER_GROUPS:  # only this run's undecodable event, nothing for S3
        assert set(dead_letter_reasons(s, group_id(name, s.group_prefix))) <= {undecodable}, name
    prefix = BLOBS
    keys = s3_env.keys(f"{prefix}/")
    for _, doc in published:
        assert doc.blob_uri.removeprefix(f"s3://{s3_env.bucket}/") in keys
    for name in STAGE_NAMES:
        assert [k for k in keys if k.startswith(f"{prefix}/results/{name}/")], name
        assert [k for k in keys if k.startswith(f"{prefix}/completions/{name}/")], name


def test_a_worker_waits_through_an_s3_outage_and_loses_nothing(
    broker: LocalBroker, s3_env: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = s3_settings(broker, s3_env, tmp_path / "home", f"o{uuid.uuid4().hex[:8]}", s3_timeout_s=1.0)
    published, _ = publish_samples(s, skip={"broken.pdf"})
    ids = {doc.document_id for _, doc in published}
    worker = build_worker("thumbnails", s)  # checks the bucket at start, before the outage
    caplog.set_level(logging.WARNING, logger="docstream.blobstore")
    s3_env.pause()
    resumer = threading.Timer(OUTAGE_S, s3_env.resume)
    resumer.start()
    try:
        run_until_caught_up(s, [worker], 180, lambda _: None)
    finally:
        resumer.join()
    assert {event["document_id"] for event in stage_results(s, ids)["thumbnails"]} >= ids
    no_dead_letter_for_s3(s, "thumbnails", ids)
    lines = [r.getMessage() for r in caplog.records if r.name == "docstream.blobstore"]
    assert len([m for m in lines if "unreachable" in m]) == 1, lines
    assert len([m for m in lines if "reachable again" in m]) == 1, lines
