"""The rebalance probe on the real local broker: a cooperative join reaches the newcomer after
the others' next heartbeat (two rounds) and a leave stops only the leaver's partitions."""

from __future__ import annotations

from consumers.ops.capacity.rebalance import probe_rebalance


def test_a_cooperative_join_and_leave_on_the_real_broker(kafka_bootstrap: str) -> None:
    join, leave = probe_rebalance(kafka_bootstrap, assignor="cooperative", members=2, settle_s=10)
    assert join.change == "join" and leave.change == "leave"
    # The newcomer consumes after a heartbeat round or two (3 s heartbeats), not at once, and not
    # after a session timeout (45 s); the members that keep their partitions do not stop.
    assert 1.0 < join.resume_s < 10.0
    assert join.member_stall_s < 1.0
    # The leaver's partitions (12 over 3 members: 4) wait for their new owner at most a heartbeat
    # round or two (0 to 3 s measured: the others may learn of the leave at once), never a session
    # timeout (45 s); the others' partitions do not wait.
    assert 0.0 <= leave.moved_gap_s < 10.0
    assert leave.moved_partitions <= 6
