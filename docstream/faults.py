"""Fault points: where a chaos run (`docstream chaos`, consumers/ops/chaos) SIGKILLs a worker.

A worker started with `DOCSTREAM_FAULT=<point>:<n>` kills itself with SIGKILL the n-th time it
reaches `<point>`, counting from its start; without the variable every `reached` call is one
comparison with None. The points, in the order an event passes them:

    before_handle  the event is about to be handed to the handler: nothing of it done
    in_handler     a stage wrote its result object, not yet its completion record or event
    after_effect   effects written and result events acknowledged, the offsets not yet stored
    after_store    offsets stored in the consumer, not yet committed to the broker

Each is a moment where a crash must cost nothing but a redelivery: the chaos checker shows that
no document is lost and no effect or rollup counted twice, whichever point it was.

Two more faults a chaos run turns on from outside (inert without their variables):

    DOCSTREAM_FAULT_SWITCHES=<dir>   while `<dir>/warehouse-down` exists, the warehouse adapter
                                     fails every insert as an unreachable server does
                                     (TransientError: the sink's batch takes the retry path)
    DOCSTREAM_FAULT_SLOW=<stage>:<f> that stage's compute takes f times as long (it sleeps f-1
                                     times what the compute took): a dependency slowed f-fold
"""

from __future__ import annotations

import os
import signal
import sys
import threading

POINTS = ("before_handle", "in_handler", "after_effect", "after_store")
ENV = "DOCSTREAM_FAULT"
SWITCHES_ENV = "DOCSTREAM_FAULT_SWITCHES"
SLOW_ENV = "DOCSTREAM_FAULT_SLOW"
WAREHOUSE_DOWN = "warehouse-down"


def parse(value: str | None) -> tuple[str, int] | None:
    """`point:n` -> (point, n); None for an unset or empty value. Raises ValueError otherwise."""
    if not value:
        return None
    point, _, count = value.partition(":")
    if point not in POINTS or not count.isdigit() or int(count) < 1:
        raise ValueError(
            f"{ENV}={value!r}: expected <point>:<n> with point one of {', '.join(POINTS)} and n >= 1"
        )
    return point, int(count)


def parse_slow(value: str | None) -> tuple[str, float] | None:
    """`stage:factor` -> (stage, factor); None for an unset or empty value."""
    if not value:
        return None
    stage, _, factor = value.partition(":")
    try:
        number = float(factor)
    except ValueError:
        number = 0.0
    if not stage or number < 1:
        raise ValueError(f"{SLOW_ENV}={value!r}: expected <stage>:<factor> with factor >= 1")
    return stage, number


_armed = parse(os.environ.get(ENV))
_switches = os.environ.get(SWITCHES_ENV) or None
_slow = parse_slow(os.environ.get(SLOW_ENV))
_seen = 0
_lock = threading.Lock()


def reached(point: str) -> None:
    """Count a pass through `point`; SIGKILL this process on the armed pass."""
    if _armed is None or point != _armed[0]:
        return
    global _seen
    with _lock:
        _seen += 1
        if _seen < _armed[1]:
            return
    sys.stderr.write(f"docstream fault: SIGKILL at {point} (pass {_seen})\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def switched_on(name: str) -> bool:
    """Whether the switch file `name` exists in DOCSTREAM_FAULT_SWITCHES (False when unset)."""
    return _switches is not None and os.path.exists(os.path.join(_switches, name))


def slowdown(stage: str) -> float:
    """The factor `stage`'s compute is slowed by (1.0: not slowed)."""
    return _slow[1] if _slow is not None and _slow[0] == stage else 1.0
