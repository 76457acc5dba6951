"""A worker process for crash and shutdown tests: a real consumer runtime in its own process.

Its handler writes the effect (a result object under the message's idempotency key, once)
and appends to two logs the tests read: `handled.log` (every handler call) and
`effects.log` (every effect actually created). With `--hang-on KEY`, it touches
`<log-dir>/hanging` after writing the effect of KEY and sleeps, so a test can kill it inside
the handler.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path

from consumers.runtime import Context, Worker
from consumers.runtime.message import Message
from docstream.blobstore import BlobStore
from docstream.idempotency import idempotency_key
from docstream.settings import RuntimeSettings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--blobs", required=True)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--hang-on", default="")
    parser.add_argument("--handle-seconds", type=float, default=0.0)
    args = parser.parse_args()
    store = BlobStore(args.blobs)
    log_dir: Path = args.log_dir

    def handle(message: Message, ctx: Context) -> None:
        key = (message.key() or b"").decode()
        with (log_dir / "handled.log").open("a") as log:
            log.write(f"{key}\n")
        digest = hashlib.sha256(message.value() or b"").hexdigest()
        if store.put_result("test", idempotency_key(digest, "test", "v1"), message.value() or b""):
            with (log_dir / "effects.log").open("a") as log:
                log.write(f"{key}\n")
        time.sleep(args.handle_seconds)
        if key == args.hang_on:
            (log_dir / "hanging").touch()
            time.sleep(3600)

    worker = Worker(
        group_id=args.group,
        topics=[args.topic],
        handler=handle,
        connection={"bootstrap.servers": args.bootstrap},
        runtime=RuntimeSettings(
            concurrency=2, commit_interval_ms=200, shutdown_timeout_s=20, session_timeout_ms=6000
        ),
    )
    worker.install_signal_handlers()
    (log_dir / "started").touch()
    stats = worker.run()
    (log_dir / "stopped").write_text(f"{stats.handled}\n")


if __name__ == "__main__":
    main()
