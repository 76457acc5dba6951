"""The consume loop every docstream worker runs: at-least-once delivery, effects keyed.

`Worker.run` is the loop: poll -> admit -> dispatch -> settle -> flow control. A message is
done only in this order, and its offset never moves before the earlier steps hold:

    1. the handler wrote its effect (a result object under its idempotency key) and returned;
    2. every result event it emitted was acknowledged by the broker (acks=all);
       - or, when it failed: its retry / dead-letter record was acknowledged instead;
    3. its offset is *stored* (only once every earlier offset of the partition is done);
    4. stored offsets are *committed*: periodically, on revoke and on shutdown.

A crash anywhere before 3 redelivers the message; the idempotency key makes the second run
of its effect harmless.

Retries go through the group's retry topic. It has the source's partition count and an
event keeps its key, so its retry lands on the partition with the same number; a second
consumer (`_retries`, group `<group>.retry`) is assigned exactly the retry partitions whose
numbers match the source partitions this worker owns. So the owner of a key also owns its
retries: later events of that key wait (the key is *parked*) until the retried one is handled.
On assignment, a source partition stays paused until the pending retries of its number have
been read, so a new owner learns which keys are waiting before it handles later events.
"""

from __future__ import annotations

import contextlib
import queue
import random
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from consumers.runtime import headers as hdr
from consumers.runtime.message import Decoder, Failure, Handler, Message
from consumers.runtime.offsets import PartitionOffsets
from consumers.runtime.retry import Route, backoff_ms, route
from consumers.runtime.routing import dead_letter_record, retry_record
from consumers.runtime.window import KeyOrderedWindow
from docstream import kafka_config
from docstream.errors import ConfigurationError, KafkaError
from docstream.settings import RuntimeSettings
from docstream.topology import dead_letter_topic, retry_group_id, retry_topic

TP = tuple[str, int]
FETCH_BATCH = 500


@dataclass
class RunStats:
    """What a worker has done so far; read by tests, `until` predicates and health checks."""

    fetched: int = 0
    handled: int = 0
    retried: int = 0
    dead_lettered: int = 0
    rewound: int = 0
    rebalances: int = 0
    in_flight: int = 0
    last_loop_ms: int = 0
    assigned: set[TP] = field(default_factory=set)


class _EmitContext:
    """The `Context` a handler gets: emits go through the worker's producer, acks come back."""

    __slots__ = ("_message", "_on_ack", "_producer")

    def __init__(self, producer: Any, message: Message, on_ack: Callable[..., None]) -> None:
        self._producer, self._message, self._on_ack = producer, message, on_ack

    def emit(
        self, topic: str, key: bytes | None, value: bytes, headers: hdr.HeaderList | None = None
    ) -> None:
        self._message.emitted += 1
        callback = partial(self._on_ack, self._message)
        while True:
            try:
                self._producer.produce(topic, value, key, headers=headers, on_delivery=callback)
                return
            except BufferError:  # the producer's queue is full: let deliveries drain, try again
                self._producer.poll(0.05)


class Worker:
    """One member of a consumer group, running `handler` on every message of `topics`."""

    def __init__(
        self,
        *,
        group_id: str,
        topics: Sequence[str],
        handler: Handler,
        connection: dict[str, Any],
        runtime: RuntimeSettings,
        decoder: Decoder | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        consumer_overrides: dict[str, Any] | None = None,
    ) -> None:
        if not topics:
            raise ConfigurationError("a worker needs at least one topic")
        self.group_id, self.topics = group_id, list(topics)
        self.retry_topic, self.dlq_topic = retry_topic(group_id), dead_letter_topic(group_id)
        self._handler, self._decoder, self._runtime = handler, decoder, runtime
        self._clock, self._rng = clock, rng or random.Random()
        self._consumer = Consumer(self._consumer_config(connection, group_id, consumer_overrides))
        self._retries = Consumer(
            self._consumer_config(connection, retry_group_id(group_id), consumer_overrides)
        )
        self._producer = Producer(kafka_config.producer_config(connection, **{"linger.ms": 1}))
        self._pool = ThreadPoolExecutor(runtime.concurrency, thread_name_prefix=f"{group_id}-handler")
        self._window: KeyOrderedWindow[Message] = KeyOrderedWindow(runtime.max_in_flight)
        self._offsets: dict[TP, PartitionOffsets] = {}
        self._to_store: dict[TP, int] = {}
        self._done: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._running_runs = 0
        self._gates: dict[int, int] = {}  # retry partition -> end offset to read before its source runs
        self._parked: dict[int, set[Any]] = {}  # retry partition -> keys waiting for a retry there
        self._flow_paused = False
        self._closing = False
        self._stop = threading.Event()
        self.stats = RunStats()

    # -- the loop -------------------------------------------------------------------------

    def run(self, until: Callable[[RunStats], bool] | None = None) -> RunStats:
        """Consume until `stop()` (or SIGTERM/SIGINT via `install_signal_handlers`) or `until`."""
        self._consumer.subscribe(
            self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        try:
            while not self._stop.is_set() and not (until and until(self.stats)):
                messages = self._poll()  # 1. fetch no more than the window has room for
                for raw, via_retry in messages:
                    self._admit(raw, via_retry)  # 2. into the key-ordered window (or rewind)
                self._dispatch()  # 3. runnable keys' runs to the handler threads
                self._settle(block=not messages)  # 4. outcomes, acks -> store offsets
                self._flow_control()  # 5. pause / resume; health
        finally:
            self._shutdown()
        return self.stats

    def stop(self) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM / SIGINT stop the loop gracefully (call from the main thread)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    # -- 1. poll ----------------------------------------------------------------------------

    def _poll(self) -> list[tuple[Any, bool]]:
        room = max(1, min(self._window.free, FETCH_BATCH))
        timeout = 0.0 if self._running_runs else 0.1
        try:
            batch = [(m, True) for m in self._retries.consume(room, 0) if not self._skip(m)]
            room = max(1, room - len(batch))
            batch += [(m, False) for m in self._consumer.consume(room, timeout) if not self._skip(m)]
        except KafkaException as exc:
            raise KafkaError(f"{self.group_id}: consume failed: {exc}") from exc
        self.stats.fetched += len(batch)
        return batch

    @staticmethod
    def _skip(raw: Any) -> bool:
        error = raw.error()
        if error is None:
            return False
        if error.fatal():
            raise KafkaError(f"fatal consumer error: {error}")
        return True  # partition EOF and other informational events

    # -- 2. admit -------------------------------------------------------------------------

    def _admit(self, raw: Any, via_retry: bool) -> None:
        if len(self._window) >= self._window.capacity:
            self._rewind(raw, via_retry)
            return
        message = Message(raw, via_retry)
        tp = (message.topic, message.partition)
        self._offsets.setdefault(tp, PartitionOffsets()).admit(message.offset)
        key = message.ordering_key
        returning = via_retry and key in self._parked.get(message.partition, ())
        if returning:
            self._parked[message.partition].discard(key)
        self._window.admit(key, message, message.not_before_ms(), front=returning)
        if via_retry:
            self._open_gate(message.partition, message.offset + 1)

    def _rewind(self, raw: Any, via_retry: bool) -> None:
        """A message fetched while the window is full is read again later."""
        consumer = self._retries if via_retry else self._consumer
        consumer.seek(TopicPartition(raw.topic(), raw.partition(), raw.offset()))
        self.stats.rewound += 1

    # -- 3. dispatch ----------------------------------------------------------------------

    def _dispatch(self) -> None:
        runs = self._window.take_runs(int(self._clock() * 1000))
        if not runs:
            return
        lanes = min(len(runs), self._runtime.concurrency)
        for lane in range(lanes):
            self._running_runs += 1
            self._pool.submit(self._run_lane, runs[lane::lanes])

    def _run_lane(self, runs: list[tuple[Any, list[Message]]]) -> None:
        """Handler thread: each key's run in order; a failure leaves the rest of that run."""
        report: list[tuple[Any, list[Message], Failure | None, list[Message]]] = []
        for key, run in runs:
            for i, message in enumerate(run):
                try:
                    if self._decoder is not None:
                        message.record = self._decoder(message)
                    self._handler(message, _EmitContext(self._producer, message, self._on_ack))
                except Exception as exc:  # every failure is data: it goes to retry or DLQ
                    report.append((key, run[: i + 1], Failure(exc, traceback.format_exc()), run[i + 1 :]))
                    break
            else:
                report.append((key, run, None, []))
        self._done.put(("lane", report))

    def _on_ack(self, message: Message, err: Any, _msg: Any) -> None:
        self._done.put(("ack", message, err))

    # -- 4. settle ------------------------------------------------------------------------

    def _settle(self, block: bool) -> None:
        self._producer.poll(0)
        timeout = 0.05 if block and self._running_runs else 0.0
        while True:
            try:
                item = self._done.get(timeout=timeout) if timeout else self._done.get_nowait()
            except queue.Empty:
                break
            timeout = 0.0
            if item[0] == "lane":
                self._running_runs -= 1
                for report in item[1]:
                    self._settle_run(*report)
            elif item[0] == "ack":
                self._settle_ack(item[1], item[2])
            else:
                self._settle_reroute(item[1], item[2])
        self._store_offsets()

    def _settle_run(self, key: Any, ran: list[Message], failure: Failure | None, rest: list[Message]) -> None:
        handled = ran[:-1] if failure else ran
        for message in handled:
            message.handled = True
            self._maybe_finish(message)
        if failure:
            self._reroute(ran[-1], failure.error, failure.traceback)
        self._window.release(key, rest)

    def _settle_ack(self, message: Message, err: Any) -> None:
        message.acked += 1
        if err is not None:
            message.failure = KafkaError(f"result event not delivered: {err}", retriable=True)
        self._maybe_finish(message)

    def _maybe_finish(self, message: Message) -> None:
        """Step 3 for a handled message once every result it emitted is acknowledged."""
        if not message.handled or message.acked < message.emitted:
            return
        if message.failure is not None:
            self._reroute(message, message.failure, "")
        else:
            self.stats.handled += 1
            self._finish(message)

    def _reroute(self, message: Message, error: BaseException, trace: str) -> None:
        """A failed message goes to the retry topic (its key parked) or the dead-letter topic."""
        if route(error, message.attempt, self._runtime.retry) is Route.RETRY:
            due = int(self._clock() * 1000) + backoff_ms(self._runtime.retry, message.attempt + 1, self._rng)
            record = retry_record(message, self.group_id, self.retry_topic, error, trace, due)
            if (self.retry_topic, record.partition) in self.stats.assigned:
                self._window.park(message.ordering_key)
                self._parked.setdefault(record.partition, set()).add(message.ordering_key)
            self.stats.retried += 1
        else:
            record = dead_letter_record(message, self.group_id, self.dlq_topic, error, trace)
            self.stats.dead_lettered += 1
        self._producer.produce(
            record.topic,
            record.value,
            record.key,
            partition=record.partition,
            headers=record.headers,
            on_delivery=partial(self._on_reroute_ack, message),
        )

    def _on_reroute_ack(self, message: Message, err: Any, _msg: Any) -> None:
        self._done.put(("reroute", message, err))

    def _settle_reroute(self, message: Message, err: Any) -> None:
        if err is None:
            self._finish(message)
            return
        # The retry / dead-letter record was not stored: handle the message again instead.
        message.handled, message.failure, message.emitted, message.acked = False, None, 0, 0
        self._window.settled()
        self._window.admit(message.ordering_key, message, front=True)

    def _finish(self, message: Message) -> None:
        tp = (message.topic, message.partition)
        self._window.settled()
        tracker = self._offsets.get(tp)
        if tracker is None:  # the partition was revoked meanwhile; its new owner re-reads it
            return
        storable = tracker.finish(message.offset)
        if storable is not None:
            self._to_store[tp] = storable

    def _store_offsets(self) -> None:
        for (topic, partition), offset in self._to_store.items():
            consumer = self._retries if topic == self.retry_topic else self._consumer
            with contextlib.suppress(KafkaException):  # revoked between finish and store
                consumer.store_offsets(offsets=[TopicPartition(topic, partition, offset)])
        self._to_store.clear()

    # -- 5. flow control ------------------------------------------------------------------

    def _flow_control(self) -> None:
        full = len(self._window) >= self._window.capacity
        if full and not self._flow_paused:
            self._set_paused(True)
        elif self._flow_paused and len(self._window) <= self._window.capacity * 3 // 4:
            self._set_paused(False)
        self.stats.in_flight = len(self._window)
        self.stats.last_loop_ms = int(self._clock() * 1000)

    def _set_paused(self, paused: bool) -> None:
        self._flow_paused = paused
        for consumer in (self._consumer, self._retries):
            parts = [TopicPartition(t, p) for t, p in self.stats.assigned if self._owns(consumer, t)]
            if not paused:
                parts = [
                    tp for tp in parts if tp.topic == self.retry_topic or tp.partition not in self._gates
                ]
            if parts:
                (consumer.pause if paused else consumer.resume)(parts)

    def _owns(self, consumer: Any, topic: str) -> bool:
        return (topic == self.retry_topic) == (consumer is self._retries)

    # -- rebalances -------------------------------------------------------------------------

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self.stats.rebalances += 1
        consumer.incremental_assign(partitions)
        self.stats.assigned |= {(tp.topic, tp.partition) for tp in partitions}
        numbers = {tp.partition for tp in partitions if tp.topic == self.topics[0]}
        mirrored = [TopicPartition(self.retry_topic, n) for n in numbers]
        if mirrored:
            self._retries.incremental_assign(mirrored)
            self.stats.assigned |= {(self.retry_topic, n) for n in numbers}
            self._close_gates(numbers)
        if self._flow_paused:
            self._set_paused(True)

    def _close_gates(self, numbers: set[int]) -> None:
        """Pause source partitions until their retry partition's pending records are read."""
        parts = [TopicPartition(self.retry_topic, n) for n in numbers]
        committed = {tp.partition: tp.offset for tp in self._retries.committed(parts, timeout=10)}
        for n in numbers:
            low, high = self._retries.get_watermark_offsets(TopicPartition(self.retry_topic, n), timeout=10)
            start = committed.get(n, -1)
            if max(start, low) < high:
                self._gates[n] = high
        gated = [
            TopicPartition(t, p) for t, p in self.stats.assigned if t in self.topics and p in self._gates
        ]
        if gated:
            self._consumer.pause(gated)

    def _open_gate(self, number: int, position: int) -> None:
        if number in self._gates and position >= self._gates[number]:
            del self._gates[number]
            if not self._flow_paused:
                parts = [
                    TopicPartition(t, p) for t, p in self.stats.assigned if t in self.topics and p == number
                ]
                self._consumer.resume(parts)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        if self._closing:  # close() revokes everything after _shutdown committed it
            return
        self._hand_back(partitions, commit=True)
        consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        if self._closing:
            return
        self._hand_back(partitions, commit=False)
        consumer.incremental_unassign(partitions)

    def _hand_back(self, partitions: list[Any], commit: bool) -> None:
        """Drop queued messages of revoked partitions, finish running ones, commit, unassign."""
        self.stats.rebalances += 1
        revoked = {(tp.topic, tp.partition) for tp in partitions}
        numbers = {p for t, p in revoked if t == self.topics[0]}
        revoked |= {(self.retry_topic, n) for n in numbers}
        self._window.drop(lambda m: (m.topic, m.partition) in revoked)
        self._drain()
        if commit:
            self._commit()
        for tp in revoked:
            self._offsets.pop(tp, None)
            self.stats.assigned.discard(tp)
        for n in numbers:
            self._gates.pop(n, None)
            for key in self._parked.pop(n, set()):
                self._window.unpark(key)
        if numbers:
            self._retries.incremental_unassign([TopicPartition(self.retry_topic, n) for n in numbers])

    # -- shutdown -------------------------------------------------------------------------

    def _drain(self) -> None:
        """Let running handlers finish and every produced record be acknowledged, then settle."""
        deadline = time.monotonic() + self._runtime.shutdown_timeout_s
        while self._running_runs and time.monotonic() < deadline:
            self._settle(block=True)
        self._producer.flush(max(0.0, deadline - time.monotonic()))
        self._settle(block=False)

    def _commit(self) -> None:
        """Step 4, synchronously: what was stored is committed before partitions move."""
        self._store_offsets()
        for consumer in (self._consumer, self._retries):
            with contextlib.suppress(KafkaException):  # _NO_OFFSET: nothing stored since the last commit
                consumer.commit(asynchronous=False)

    def _shutdown(self) -> None:
        """Stop fetching, finish running work, commit, leave the group, flush the producer."""
        self._set_paused(True)
        self._window.drop(lambda m: True)
        self._drain()
        self._commit()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._closing = True
        self._retries.close()
        self._consumer.close()

    def _consumer_config(
        self, connection: dict[str, Any], group: str, overrides: dict[str, Any] | None
    ) -> dict[str, Any]:
        conf = kafka_config.consumer_config(connection, group, self._runtime)
        conf.update(overrides or {})
        return conf
