"""The at-least-once consumer runtime every docstream worker runs on.

loop.py      the consume loop: poll -> admit -> settle -> flow control; rebalances
lanes.py     key-ordered concurrency: one handler thread per lane, parked keys
message.py   the Context a handler gets with each message; Event, a message held on to
retry.py     backoff and failure classification (pure)
routing.py   the retry and dead-letter records of a failed message (pure)
headers.py   retry / dead-letter header names and their encoding
"""

from consumers.runtime.loop import RunStats, Worker
from consumers.runtime.message import Context, Event, Handler

__all__ = ["Context", "Event", "Handler", "RunStats", "Worker"]
