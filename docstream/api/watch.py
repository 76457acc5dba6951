"""The API's view of the cluster, refreshed in the background, never per request.

A `ClusterWatch` thread asks its sampler (docstream.api.sampler), every `refresh_s`, for one
`Sample`:

- the consumer groups (`consumers.lag.LagMonitor`: offsets, rates, time lag, Burrow status),
  fed to admission control (`AdmissionControl.observe`);
- every `dead_letters_every_s`, the dead letters of the last hour per group.

What it last saw (`view()`) answers /health and the queue positions of GET /v1/documents/{id}.
When sampling fails it logs one WARNING ("cluster unreachable"), keeps the last sample (marked
stale by its age), and one INFO line when a sample succeeds again; never a line per attempt.

The sampling runs in a child process (`SamplerProcess`), not in the API's: a librdkafka abort
there costs one sample, not the front door (docstream.api.sampler says why). When the child ends
without answering, the watch logs its end once, admission keeps its last sample, and a new child
(with fresh rate windows) starts after a back-off (`RESTART_BACKOFF_S`, doubling up to
`RESTART_BACKOFF_MAX_S` while children keep dying).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from consumers.lag.snapshot import LagSnapshot
from docstream.api.admission import AdmissionControl
from docstream.api.sampler import SamplerDied, Sampling

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = 2.0
RESTART_BACKOFF_MAX_S = 60.0


@dataclass(frozen=True)
class ClusterView:
    """What the watch last saw."""

    snapshot: LagSnapshot | None
    sampled_at: float | None  # time.time() of the last successful sample
    reachable: bool | None  # None: not tried yet
    error: str | None  # the last failure, while unreachable
    partitions: int  # of the upload topic
    dead_letters_last_hour: dict[str, int] = field(default_factory=dict)  # group id -> records


class ClusterWatch:
    """A background thread sampling the groups (through `sampler`) for admission and health."""

    def __init__(
        self,
        sampler: Sampling,
        admission: AdmissionControl,
        *,
        topic: str,
        default_partitions: int,
        refresh_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sampler, self.admission, self.topic = sampler, admission, topic
        self.refresh_s = refresh_s
        self._clock = clock
        self._view = ClusterView(None, None, None, None, default_partitions)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._deaths = 0  # of the sampling process, since its last answer
        self._retry_at = 0.0  # time.monotonic() before which a dead sampler is not started again

    def view(self) -> ClusterView:
        return self._view

    def start(self) -> ClusterWatch:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="api cluster watch", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self._stopping.set()
        self.sampler.interrupt()
        if self._thread is not None:
            self._thread.join(timeout)
        self.sampler.close()

    def refresh(self) -> ClusterView:
        """One sample, now (the thread calls it; tests and start-up may too)."""
        view = self._view
        if time.monotonic() < self._retry_at:
            return view
        try:
            sample = self.sampler.sample(after_outage=view.reachable is False)
        except InterruptedError:
            return view
        except SamplerDied as exc:
            self._deaths += 1
            backoff = min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * 2 ** (self._deaths - 1))
            self._retry_at = time.monotonic() + backoff
            level = logging.WARNING if self._deaths == 1 else logging.DEBUG
            log.log(level, "api: cluster watch: %s; admission keeps its last sample; a new one starts", exc)
            return self._unreachable(view, str(exc), quiet=True)
        except Exception as exc:  # the cluster away, a timeout: keep the last sample
            return self._unreachable(view, str(exc), quiet=False)
        self._deaths = 0
        if view.reachable is False:
            log.info("api: cluster reachable again")
        snapshot = sample.snapshot
        self.admission.observe(snapshot, self.topic)
        partitions = _partitions(snapshot, self.topic) or view.partitions
        dead = sample.dead_letters_last_hour
        self._view = ClusterView(
            snapshot,
            self._clock(),
            True,
            None,
            partitions,
            view.dead_letters_last_hour if dead is None else dead,
        )
        return self._view

    def _unreachable(self, view: ClusterView, error: str, *, quiet: bool) -> ClusterView:
        if view.reachable is not False and not quiet:
            log.warning("api: cluster unreachable, admission keeps its last sample: %s", error)
        self._view = ClusterView(
            view.snapshot, view.sampled_at, False, error, view.partitions, view.dead_letters_last_hour
        )
        return self._view

    def _run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            self.refresh()
            self._stopping.wait(max(0.0, self.refresh_s - (time.monotonic() - started)))


def _partitions(snapshot: LagSnapshot, topic: str) -> int:
    numbers = {p.partition for g in snapshot.groups for p in g.partitions if p.topic == topic}
    return max(numbers) + 1 if numbers else 0
