"""The at-least-once consumer runtime every docstream worker runs on.

loop.py      the consume loop: poll -> admit -> dispatch -> settle -> flow control
window.py    the bounded in-flight window with key-ordered concurrency (pure)
offsets.py   which offset may be stored, given out-of-order completions (pure)
retry.py     backoff and failure classification (pure)
headers.py   retry / dead-letter header names and their encoding
message.py   what a handler receives, and the context it emits results through
"""

from consumers.runtime.loop import RunStats, Worker
from consumers.runtime.message import Context, Handler, Message

__all__ = ["Context", "Handler", "Message", "RunStats", "Worker"]
