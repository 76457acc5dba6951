"""A patch to faust 0.15.3 / aiokafka 0.14: after a rebalance a source partition with no committed
offset is sought to its start, as one with a committed offset is sought to it (see the function).

Applied by `make_app` (consumers.analytics.app) before it builds the app, once per process.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)


def seek_uncommitted_to_start() -> None:
    """Make faust's seek to the committed offsets also rewind the partitions that have none.

    faust hands its fetch the live set of its active partitions. While its recovery reads the
    changelogs that set holds only them; when the recovery ends it is emptied for a moment before
    the source partitions are resumed, and aiokafka's `fetched_records` reads an empty set as "every
    partition": a fetch waiting then returns the source partitions' records too, moving their
    positions, and faust drops those not in its (empty) active set. It then calls `perform_seek`,
    which seeks every partition to its committed offset and so fetches the dropped records again,
    but aiokafka's `seek_to_committed` skips a partition with no committed offset (or offset 0):
    there they were lost. Seen on the real broker as a worker, restarted after a SIGKILL, that
    folded partitions 1 and 2 of its sources 1.5 s late and never partition 0, the one its killed
    predecessor had had nothing to commit in (tests/integration/test_analytics_app.py, about one run
    in twenty). Patched here: after the seek, a source partition without a committed offset is
    sought to its beginning (what `auto_offset_reset = "earliest"` means for it), one committed at
    0 to 0. Records the rewind delivers twice are redeliveries, which the fold counts once.
    Changelog partitions are left alone: the recovery positions them itself.
    """
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    if getattr(AIOKafkaConsumerThread.seek_to_committed, "_docstream_rewinds", False):
        return

    async def rewinding_seek(self: Any) -> Mapping[Any, int]:  # in the consumer's own thread
        consumer = self._ensure_consumer()
        committed: Mapping[Any, int | None] = await consumer.seek_to_committed()
        changelogs = self.app.tables.changelog_topics
        sources = {tp: offset for tp, offset in committed.items() if tp.topic not in changelogs}
        for tp in (tp for tp, offset in sources.items() if offset == 0):
            consumer.seek(tp, 0)
        unset = [tp for tp, offset in sources.items() if offset is None]
        if unset:
            by_topic: dict[str, list[int]] = {}
            for tp in sorted(unset):
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            named = ", ".join(f"{topic} {parts}" for topic, parts in by_topic.items())
            logger.info("no committed offset, read from the beginning: %s", named)
            await consumer.seek_to_beginning(*unset)
        return committed  # type: ignore[return-value]  # None where nothing is committed, as faust expects

    async def seek_to_committed(self: Any) -> Mapping[Any, int]:
        result: Mapping[Any, int] = await self.call_thread(rewinding_seek, self)
        return result

    seek_to_committed._docstream_rewinds = True  # type: ignore[attr-defined]
    AIOKafkaConsumerThread.seek_to_committed = seek_to_committed  # type: ignore[method-assign]
