"""Dead letters: read a group's dead-letter topic, show its records, redrive them.

entries.py   the entry model, filters, record references, redrive history and headers (pure)
payloads.py  a dead letter's value decoded by the event contract, or a safe preview (pure)
reader.py    reading the dead-letter and retry topics with assigned, bounded, uncommitted reads
redrive.py   re-publishing dead letters to the group's retry topic

`docstream dlq list|show|redrive` (docstream/cli/dlq.py) is the command; docs/dead-letters.md
explains the headers and the history.
"""

from consumers.ops.dlq.entries import DeadLetter, Filters, RedriveStep, Ref
from consumers.ops.dlq.payloads import Payload, decode_payload
from consumers.ops.dlq.reader import DeadLetters, load
from consumers.ops.dlq.redrive import Move, plan, redrive

__all__ = [
    "DeadLetter",
    "DeadLetters",
    "Filters",
    "Move",
    "Payload",
    "RedriveStep",
    "Ref",
    "decode_payload",
    "load",
    "plan",
    "redrive",
]
