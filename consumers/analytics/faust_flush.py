"""A patch to faust 0.15.3: its producer's flush waits for every buffered table write (see the function).

Applied by `make_app` (consumers.analytics.app) before it builds the app, once per process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

logger = logging.getLogger(__name__)


DRAIN_TIMEOUT_S = 30.0


def drain_table_writes_on_flush() -> None:
    """Make faust's producer flush wait until every buffered table write is sent (once per process).

    faust commits a source offset only after `app.producer.flush()` (its at-least-once commit, and
    the commit before a rebalance hands partitions over). A table write is queued in the producer's
    `ProducerBuffer` and sent by a background task, and faust 0.15.3's flush gave up on that buffer
    after 0.1 s without a send (`ProducerBuffer.flush_atmost`): an offset could be committed with its
    event's table write still queued. A crash then lost the write; a rebalance handed the partition
    to a worker that recovered the changelog before the write reached it. Either way the event was
    committed and missing from the fold (rollups short by the last events a worker handled before a
    rebalance). Patched here: `ProducerBuffer._send_pending` counts the sends in flight, and the
    flush first waits until the buffer is empty and none is in flight (bounded by DRAIN_TIMEOUT_S,
    then it logs and goes on rather than hang).
    """
    from faust.transport.drivers.aiokafka import Producer
    from faust.transport.producer import ProducerBuffer

    if getattr(Producer.flush, "_docstream_drains", False):
        return
    send_pending, flush = ProducerBuffer._send_pending, Producer.flush

    async def counted_send_pending(self: Any, fut: Any) -> None:
        self._docstream_in_flight = getattr(self, "_docstream_in_flight", 0) + 1
        try:
            await send_pending(self, fut)
        finally:
            self._docstream_in_flight -= 1

    async def draining_flush(self: Any) -> None:
        buffer = self.buffer
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while buffer.size or getattr(buffer, "_docstream_in_flight", 0):
            if time.monotonic() > deadline:
                logger.warning("flushing with %d table writes still buffered", buffer.size)
                break
            await asyncio.sleep(0.005)
        await flush(self)

    draining_flush._docstream_drains = True  # type: ignore[attr-defined]
    ProducerBuffer._send_pending = counted_send_pending  # type: ignore[method-assign]
    Producer.flush = draining_flush  # type: ignore[method-assign]
