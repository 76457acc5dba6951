"""A replica SIGKILLed under load loses no accepted document: its peer relays its outbox.

Two API processes (`docstream api serve`), each with a home of its own, share the broker and one
blob store. Uploads are posted to both, alternately, without pause. The broker stops, so the
uploads go on being answered 202 from each replica's outbox (objects in the shared blob store);
replica A is SIGKILLed in the middle of that load, with records waiting, and is NOT started again.
The broker comes back: B sees A's heartbeat stop, takes A's folder over and relays it. Every
document answered 202 by either replica is then on doc.uploaded, and every copy of one is byte for
byte its first.
"""

from __future__ import annotations

import io
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from api_process import start_api
from kafka_helpers import private_broker, read_partitions

from docstream.api.keys import KeyStore
from docstream.blobstore import BlobStore
from docstream.topology import DOC_UPLOADED
from infra.broker import LocalBroker, free_port
from producers.documents import text_pdf

pytestmark = pytest.mark.kafka

PARTITIONS = 3


@pytest.fixture(scope="module")
def broker(kafka_jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    with private_broker(tmp_path_factory.mktemp("takeover-broker"), PARTITIONS) as own:
        yield own


def test_a_killed_replicas_outbox_is_relayed_by_its_peer(broker: LocalBroker, tmp_path: Path) -> None:
    blobs_dir = tmp_path / "shared-blobs"
    env = {"DOCSTREAM_BLOB_URL": str(blobs_dir)}
    key = KeyStore(BlobStore(str(blobs_dir))).create("acme").key
    auth = {"Authorization": f"Bearer {key}"}
    ports = [free_port(), free_port()]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    apis = [
        start_api(tmp_path / name, broker.bootstrap, port, log, PARTITIONS, env)
        for name, port, log in zip(("a", "b"), ports, logs, strict=True)
    ]
    accepted: list[tuple[str, int, str]] = []  # (document id, replica, state)
    stop = threading.Event()
    lock = threading.Lock()

    def load() -> None:
        i = 0
        while not stop.is_set():
            replica = i % 2
            i += 1
            try:
                answer = requests.post(
                    f"http://127.0.0.1:{ports[replica]}/v1/documents",
                    headers=auth,
                    files={"file": ("d.pdf", io.BytesIO(text_pdf([f"takeover {uuid.uuid4().hex}"])))},
                    timeout=30,
                )
            except requests.ConnectionError:
                continue  # the killed replica: no answer, nothing promised
            if answer.status_code == 202:
                with lock:
                    accepted.append((answer.json()["document_id"], replica, answer.json()["state"]))

    loader = threading.Thread(target=load, daemon=True)
    try:
        loader.start()
        time.sleep(3)  # published while the broker is up
        broker.stop(timeout=30)
        time.sleep(4)  # into the outboxes
        outbox_a = blobs_dir / "state" / "api" / "outbox"
        waiting = [p for p in outbox_a.rglob("*") if p.is_file()]
        assert waiting, "nothing waits in the outboxes"
        apis[0].send_signal(signal.SIGKILL)  # under load, with records waiting
        apis[0].wait(10)
        time.sleep(2)
        stop.set()
        loader.join(60)
        with lock:
            by_a = [d for d, r, s in accepted if r == 0 and s == "outbox"]
        assert by_a, "replica A accepted nothing into its outbox before it was killed"
        broker.start(timeout=90)
        deadline = time.monotonic() + 120
        while [p for p in outbox_a.rglob("*") if p.is_file() and not p.name.startswith(".tmp-")]:
            assert apis[1].poll() is None, logs[1].read_text()[-2000:]
            assert time.monotonic() < deadline, (
                f"the outboxes were not drained: {logs[1].read_text()[-3000:]}"
            )
            time.sleep(0.5)
        assert "records its outbox left behind" in logs[1].read_text()  # one line: B took A's folder
    finally:
        stop.set()
        for api in apis:
            if api.poll() is None:
                api.send_signal(signal.SIGTERM)
                api.wait(20)

    records = read_partitions(broker.bootstrap, DOC_UPLOADED, PARTITIONS)
    first: dict[bytes, tuple[bytes | None, list[Any]]] = {}
    for msg in records:
        seen = (msg.value(), list(msg.headers() or []))
        key_ = msg.key()
        assert key_ is not None
        assert first.setdefault(key_, seen) == seen, f"a copy of {key_!r} differs from its first"
    ids = {d.encode() for d, _, _ in accepted}
    missing = ids - set(first)
    by_state = {s: sum(1 for _, _, st in accepted if st == s) for s in ("published", "outbox")}
    print(
        f"peer takeover: {len(accepted)} accepted ({by_state}), {len(by_a)} in the killed replica's"
        f" outbox; {len(records)} records on {DOC_UPLOADED}, {len(missing)} missing"
    )
    assert not missing, f"{len(missing)} accepted documents never reached {DOC_UPLOADED}"
