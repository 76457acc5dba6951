"""The at-least-once consumer runtime every docstream worker runs on.

loop.py      the consume loop, wiring over the parts below: poll -> admit -> settle -> flow
             control; rebalances, retry gates on assignment, commit on revoke and shutdown
partitions.py  the two consumers as one assignment: rebalances, retry gates, pauses, store, commit
clients.py   the Kafka client calls the loop makes (Protocols) and the default factories
lanes.py     key-ordered concurrency: the handler threads, fed by the loop from the schedule
schedule.py  keys scheduled, not hashed: what a free thread may take next; parked keys,
             delayed retries (pure)
handoff.py   what the lanes and the producer's callbacks hand the loop, typed: LaneReport;
             LaneDone, Acked, Rerouted on the settle queue
offsets.py   segments in flight per partition, holes, the offset to store (pure)
gates.py     retry gates: a source partition waits until its retry partition is read (pure)
rebalance.py failed rebalance callbacks, run again from the loop (pure)
flow.py      flow control: fetch room, when to pause and resume (pure)
message.py   the Context a handler gets with each message; Event, a message held on to
retry.py     backoff and failure classification (pure)
routing.py   the retry and dead-letter records of a failed message (pure)
headers.py   retry / dead-letter header names and their encoding
stats.py     RunStats and WorkerHealth, what a worker reports

Imports run one way: offsets <- message <- handoff, schedule, clients <- lanes <- loop, and
gates, flow, clients <- partitions <- loop, rebalance <- loop (no cycle).
"""

from consumers.runtime.loop import RunStats, Worker
from consumers.runtime.message import Context, Event, Handler

__all__ = ["Context", "Event", "Handler", "RunStats", "Worker"]
