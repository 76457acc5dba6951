"""The simulator's mechanics of a real group (issue 26), each in a case whose answer is known: a hot
partition caps throughput at one replica's μ, an eager pause stops all service, commit lag ages the
time lag by half the interval, metric delays hold what the policy sees; the assignment's balance
and stickiness; the policy's discounts; switching off; the scenario's errors (pure: no Kafka)."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from consumers.lag.scaling import Observation, PolicyState, ScalingConfig, decide
from consumers.ops.capacity.group import Partitions, Tally, assign, partition_weights
from consumers.ops.capacity.scenario import MECHANISMS, MetricDelays, parse_scenario
from consumers.ops.capacity.scenario_fields import ScenarioError
from consumers.ops.capacity.simulate import _Delays, simulate, simulate_policy
from docstream.cli import app

ALL_ON: dict[str, Any] = {
    "rebalance": {"assignor": "cooperative", "pause_s": 3.0},
    "metrics": {"exporter_interval_s": 5, "scrape_interval_s": 15, "poll_interval_s": 30},
    "partitions": {"skew": "uniform"},
    "commit": {"interval_s": 2.0},
}


def scenario(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "mech",
        "duration_s": 600,
        "seed": 3,
        "objective_s": 0.5,
        "arrivals": {"kind": "step", "from": 20, "to": 60, "at_s": 200},
        "service": {"kind": "exponential", "rate": 10},
        "replicas": {"initial": 3, "partitions": 8},
        "cold_start": {"model_load_s": 20},
        "policies": [
            {"name": "reactive", "kind": "reactive", "max_replicas": 8, "min_replicas": 3},
            {"name": "docstream", "kind": "docstream", "max_replicas": 8, "min_replicas": 3},
        ],
    }
    data.update(overrides)
    return data


def constant(rate: float, replicas: int, partitions: int, mechanics: dict[str, Any], **more: Any) -> Any:
    """A fixed fleet at a constant rate, service 0.1 s exactly (μ = 10/s)."""
    return parse_scenario(
        {
            "duration_s": more.pop("duration_s", 300),
            "objective_s": 0.5,
            "arrivals": {"kind": "constant", "rate": rate},
            "service": {"kind": "samples", "values_s": [0.1]},
            "replicas": {"initial": replicas, "partitions": partitions},
            "mechanics": mechanics,
            "policies": [{"name": "fixed", "kind": "fixed", "replicas": replicas}],
            **more,
        }
    )


# --------------------------------------------------------------------------------------------
# Off is off
# --------------------------------------------------------------------------------------------


def test_no_block_an_empty_block_and_disabled_blocks_give_the_same_report() -> None:
    plain = simulate(parse_scenario(scenario())).to_dict()
    empty = simulate(parse_scenario(scenario(mechanics={}))).to_dict()
    disabled = {name: {**block, "enabled": False} for name, block in ALL_ON.items()}
    off = simulate(parse_scenario(scenario(mechanics=disabled))).to_dict()
    switched = simulate(parse_scenario(scenario(mechanics=ALL_ON)).without(*MECHANISMS)).to_dict()
    assert plain == empty == off == switched
    on = simulate(parse_scenario(scenario(mechanics=ALL_ON))).to_dict()
    assert on["policies"] != plain["policies"]
    assert (
        on["mechanisms"]["commit"] == {"interval_s": 2.0, "timers": "member"}
        and plain["mechanisms"]["commit"] is None
    )


def test_without_switches_only_the_named_ones() -> None:
    s = parse_scenario(scenario(mechanics=ALL_ON))
    assert s.mechanics.on == MECHANISMS
    assert s.without("metrics", "commit").mechanics.on == ("rebalance", "partitions")
    with pytest.raises(ScenarioError, match="'metric' is not a mechanism"):
        s.without("metric")


def test_one_partition_per_replica_queue_is_the_pool_of_one() -> None:
    """One replica, one partition: the per-partition engine and the pooled one see the same events
    with the same service times (drawn at arrival there, at the start here: the same order), so
    every figure agrees."""
    base = scenario(
        replicas={"initial": 1, "partitions": 1},
        arrivals={"kind": "constant", "rate": 8},
        policies=[{"name": "one", "kind": "fixed", "replicas": 1}],
    )
    pooled = simulate(parse_scenario(base))
    split = simulate(parse_scenario({**base, "mechanics": {"partitions": {}}}))
    assert split.to_dict()["policies"] == pooled.to_dict()["policies"]
    assert split.timelines["one"].time_lag == pooled.timelines["one"].time_lag


# --------------------------------------------------------------------------------------------
# Each mechanism's effect, computed by hand
# --------------------------------------------------------------------------------------------


def test_a_hot_partition_caps_throughput_at_one_replicas_mu() -> None:
    """Zipf(3) over 4 partitions: the hottest gets 1/(1 + 1/8 + 1/27 + 1/64) = 84.7 % of 20/s =
    16.9/s, one replica serves 10/s: its queue grows by 6.9/s, with 4 replicas or 8; pooled (40/s
    of capacity) it does not grow at all."""
    share = partition_weights(4, "zipf", 3.0)[0]
    assert share == pytest.approx(1 / (1 + 1 / 8 + 1 / 27 + 1 / 64))
    zipf = {"partitions": {"skew": "zipf", "zipf_s": 3.0}}
    growth = (20 * share - 10) * 300
    for replicas in (4, 8):
        report = simulate(constant(20, replicas, 4, zipf)).policies[0]
        assert report.peak_backlog == pytest.approx(growth, rel=0.1)
    pooled = simulate(constant(20, 4, 4, {})).policies[0]
    assert pooled.peak_backlog < 30


def test_uniform_partitions_are_split_queues() -> None:
    """4 replicas, 4 uniform partitions, 30/s, 0.1 s each: each replica is an M/D/1 at rho = 0.75,
    whose mean wait is rho/(2μ(1-rho)) = 0.15 s; the pooled M/D/4 waits far less."""
    split = simulate(constant(30, 4, 4, {"partitions": {}}, duration_s=3000)).policies[0]
    pooled = simulate(constant(30, 4, 4, {}, duration_s=3000)).policies[0]
    assert split.mean_wait_s == pytest.approx(0.75 / (2 * 10 * 0.25), rel=0.15)
    assert pooled.mean_wait_s < split.mean_wait_s / 3


@pytest.mark.parametrize("partitions", [False, True])
def test_an_eager_pause_stops_all_service_for_pause_s(partitions: bool) -> None:
    """3 replicas at 10/s; at t = 15 the HPA's floor asks a 4th, ready 20 s later (t = 35). An eager
    rebalance stops every replica for 5 s then: events wait up to 5 s (nothing finishes from 35 to
    40); without the mechanism, or cooperative, nobody stops."""
    mechanics: dict[str, Any] = {"partitions": {}} if partitions else {}
    data = scenario(
        arrivals={"kind": "constant", "rate": 10},
        duration_s=120,
        policies=[{"name": "r", "kind": "reactive", "min_replicas": 4, "max_replicas": 8}],
    )
    eager = {**mechanics, "rebalance": {"assignor": "eager", "pause_s": 5.0}}
    timelines = {
        name: simulate(parse_scenario({**data, "mechanics": m})).timelines["r"]
        for name, m in (("off", mechanics), ("eager", eager))
    }
    lag = timelines["eager"].time_lag
    assert timelines["eager"].replicas[16] == 4  # asked for at 15, ready at 35
    assert max(lag[36:41]) == pytest.approx(5.0, abs=0.4)  # the oldest event since 35
    assert max(lag[:34] + lag[45:]) < 1.5
    assert max(timelines["off"].time_lag) < 1.5


def test_a_cooperative_join_takes_two_rounds() -> None:
    """The 4th replica, ready at 35 s: it joins 4 s later (the first round; the old owners serve the
    partitions it will take until then) and serves them 4 s after that (the second round); nobody
    else stops. In the pool it serves 2 x 4 s after it is ready."""
    data = scenario(
        arrivals={"kind": "constant", "rate": 10},
        duration_s=120,
        policies=[{"name": "r", "kind": "reactive", "min_replicas": 4, "max_replicas": 8}],
    )
    coop = {"rebalance": {"assignor": "cooperative", "pause_s": 4.0}}
    plain = simulate(parse_scenario({**data, "mechanics": {}})).timelines["r"]
    pooled = simulate(parse_scenario({**data, "mechanics": coop})).timelines["r"]
    first = plain.ready.index(4.0)
    assert pooled.ready.index(4.0) == first + 8
    assert max(pooled.time_lag) < 1.5
    split = simulate(parse_scenario({**data, "mechanics": {**coop, "partitions": {}}})).timelines["r"]
    assert split.ready.index(4.0) == first + 4  # a member from 39 s ...
    lag = split.time_lag
    assert max(lag) == pytest.approx(4.0, abs=1.2)  # ... whose 2 partitions wait until 43 s
    assert lag.index(max(lag)) in range(first + 6, first + 9)
    assert max(lag[: first + 4] + lag[first + 10 :]) < 1.5


def test_a_leaving_replicas_partitions_wait_pause_s() -> None:
    """A cooperative leave: the partitions the leavers held (the HPA takes 2 of 6 away at 15 s) have
    no owner for pause_s, so their oldest event (arrived just after 15 s) is about 8 s old at 23 s."""
    data = scenario(
        arrivals={"kind": "constant", "rate": 5},
        duration_s=100,
        policies=[{"name": "r", "kind": "reactive", "min_replicas": 1, "scale_down_stabilization_s": 0}],
        replicas={"initial": 6, "partitions": 6},
    )
    coop = {"partitions": {}, "rebalance": {"assignor": "cooperative", "pause_s": 8.0}}
    paused = simulate(parse_scenario({**data, "mechanics": coop}))
    plain = simulate(parse_scenario({**data, "mechanics": {"partitions": {}}}))
    assert paused.timelines["r"].replicas[15] == 4  # 2 gone at 15 s
    lag = paused.timelines["r"].time_lag
    assert max(lag) == pytest.approx(8.0, abs=1.5)
    assert lag.index(max(lag)) in range(21, 24)
    assert max(plain.timelines["r"].time_lag) < 2.0


def test_commit_every_c_seconds_ages_the_time_lag_by_half_of_it() -> None:
    """Commits every 10 s: at a second's end the committed point is 0..9 s old, the oldest
    uncommitted event about as old: the time lag reads (10 - 1)/2 = 4.5 s older on average (the
    timeline samples whole seconds), and its lag holds about λ x that many events more."""
    plain = simulate(constant(20, 4, 4, {}, duration_s=600)).timelines["fixed"]
    committed = simulate(constant(20, 4, 4, {"commit": {"interval_s": 10}}, duration_s=600)).timelines[
        "fixed"
    ]
    shift = statistics.fmean(committed.time_lag[20:]) - statistics.fmean(plain.time_lag[20:])
    assert shift == pytest.approx(4.5, abs=0.15)
    assert max(committed.time_lag) == pytest.approx(9.0, abs=0.5)  # the second before a commit
    assert statistics.fmean(committed.unsettled[20:]) == pytest.approx(20 * 4.5, rel=0.1)
    assert plain.unsettled == plain.backlog


def test_member_timers_commit_on_each_members_phase_and_at_a_revoke() -> None:
    """Two partitions, one event a second on each (0.1 s of service). Replica A from 0 s commits at
    10, 20 ... s; B joins at 3 s (no pause) and takes partition 1, which A commits at the revoke
    (3 s); B commits at 13, 23 ... s. So at 12 s partition 0 is settled to 10 s and partition 1 to
    3 s; at 13 s partition 1 catches up to 13 s (one group timer would have settled both at 10 s)."""
    picks = itertools.cycle([0.25, 0.75])  # partition 0, partition 1, ...
    group = Partitions(Tally(5.0, 0.0, 40), lambda: 0.1, 1, [1.0, 1.0], lambda: next(picks), 0.0, False)
    group.add([3.0])
    oldest: dict[int, float | None] = {}
    for k in range(30):
        group.arrive([k + 0.0, k + 0.5])
        for at in group.joins(k, k + 1):
            group.serve(at)
            group.join(at)
        group.serve(k + 1.0)
        group.settle_members(k + 1.0, 10.0)
        oldest[k + 1] = group.oldest_unsettled()
    assert [p for p in range(2) if group.owners[p] is group.members[1]] == [1]
    assert oldest[3] == 0.0  # A's first commit is at 10 s
    assert oldest[10] == 3.5  # A committed partition 0 at 10 s; partition 1 only to the revoke at 3 s
    assert oldest[12] == 3.5  # partition 1: B's first event, not committed before 13 s
    assert oldest[13] == 10.0  # B committed to 13 s; partition 0 waits for A's 20 s commit
    assert oldest[20] == 13.5  # A at 20 s; partition 1 from B's 13 s commit on


def test_time_outside_by_the_time_lag_counts_the_seconds_over_the_objective() -> None:
    report = simulate(constant(20, 4, 4, {"commit": {"interval_s": 10}}, duration_s=600))
    timeline = report.timelines["fixed"]
    over = sum(1 for lag in timeline.time_lag if lag > 0.5)
    assert report.policies[0].time_outside_lag_s == over
    assert 500 < over < 600  # the committed lag is over 0.5 s but just after a commit
    assert report.policies[0].time_outside_s < 5  # the queue itself keeps the objective


def test_metric_delays_are_sample_and_hold_up_to_their_sum_old() -> None:
    delays = _Delays(MetricDelays(5, 15, 30), seed=1)
    seen = [delays.index(t) for t in range(0, 600)]
    assert all(0 <= t - i <= 5 + 15 + 30 for t, i in enumerate(seen))
    assert 10 < statistics.fmean(t - i for t, i in enumerate(seen) if t > 60) < 40
    changes = [t for t in range(1, 600) if seen[t] != seen[t - 1]]
    assert all(b - a == 30 for a, b in itertools.pairwise(changes))  # KEDA's poll
    assert _Delays(MetricDelays(5, 15, 30), seed=1).stages == delays.stages  # the same every policy


def test_metric_delay_shifts_the_first_scale_up() -> None:
    """The step at 200 s: the HPA scales up at its first evaluation after it; seeing the lag
    model's numbers only every 60 s (the exporter), it scales up later, by at most 60 s + one
    evaluation."""
    data = scenario(policies=[{"name": "r", "kind": "reactive", "min_replicas": 3, "max_replicas": 8}])
    firsts = []
    for mechanics in ({}, {"metrics": {"exporter_interval_s": 60}}):
        timeline = simulate(parse_scenario({**data, "mechanics": mechanics})).timelines["r"]
        firsts.append(next(t for t, r in zip(timeline.t, timeline.replicas, strict=True) if r > 3))
    plain, delayed = firsts
    assert 200 < plain <= 216
    assert plain < delayed <= plain + 60 + 15


# --------------------------------------------------------------------------------------------
# The assignment
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("partitions", [1, 5, 12, 24])
def test_assignment_is_balanced_and_sticky(partitions: int) -> None:
    owner = [-1] * partitions
    members: list[int] = []
    for joining in range(14):  # members join one by one ...
        before = owner
        members.append(joining)
        owner = assign(before, members)
        counts = [owner.count(m) for m in members]
        assert max(counts) - min(counts) <= 1 and sum(counts) == partitions
        moved = [p for p in range(partitions) if before[p] != owner[p] and before[p] >= 0]
        assert all(owner[p] == joining for p in moved)  # only the newcomer takes partitions
        assert len(moved) == (owner.count(joining) if joining else 0)
    while len(members) > 1:  # ... and leave
        gone = members.pop(len(members) // 2)
        before = owner
        owner = assign(before, members)
        counts = [owner.count(m) for m in members]
        assert max(counts) - min(counts) <= 1 and -1 not in owner
        assert {p for p in range(partitions) if before[p] != owner[p]} == {
            p for p in range(partitions) if before[p] == gone
        }


# --------------------------------------------------------------------------------------------
# The policy's view of the delays
# --------------------------------------------------------------------------------------------


def observation(**changes: Any) -> Observation:
    base: dict[str, Any] = {
        "now_ms": 60_000,
        "current_replicas": 4,
        "lag_events": 40,
        "arrival_rate": 20.0,
        "completion_rate": 20.0,
        "backlog_s": 1.5,
        "partitions": 12,
    }
    return Observation(**(base | changes))


def test_the_commit_interval_is_not_a_breach() -> None:
    """A committed time lag of 1.5 s with commits every 2 s says nothing about a 1 s objective: no
    burst; 3.5 s does. The lag rule discounts the finished events not committed yet (20/s x 2 s)."""
    config = ScalingConfig(objective_s=1.0, service_rate_per_replica=10, up_window_s=0, wait_quantile=None)
    committed = ScalingConfig(**{**config.__dict__, "measurement_lag_s": 2.0})
    state = PolicyState(breached=True)
    assert decide(config, state, observation())[0].by_burst == 6  # seen as a breach
    assert decide(committed, state, observation())[0].by_burst is None
    assert decide(committed, state, observation(backlog_s=3.5))[0].by_burst == 6
    assert decide(config, state, observation())[0].by_lag == 4  # 40 / (10 x 1)
    assert decide(committed, state, observation(lag_events=60))[0].by_lag == 2  # (60 - 40) / 10


def test_the_wait_rule_for_split_queues() -> None:
    """λ = 20, μ = 10, objective 1 s, at most 0.1 % late. Pooled (M/M/n): 3 replicas. Split, one
    event at a time each, over 20 partitions (the busiest replica an M/M/1 of its share): P(wait >
    1) = rho e^(-(10 - r)) is 0.5 e^-5 = 0.0034 at n = 4 (r = 5), 0.4 e^-6 = 0.00099 at n = 5: 5
    replicas. Over 12 partitions 5 replicas leave the busiest 3 of them (r = 5 again): 6."""
    pooled = ScalingConfig(objective_s=1.0, service_rate_per_replica=10, up_window_s=0)
    split = ScalingConfig(**{**pooled.__dict__, "lanes": 1})
    obs = observation(lag_events=0, backlog_s=0.0, partitions=20)
    assert decide(pooled, PolicyState(), obs)[0].by_arrival == 3  # ceil(20 / 8); Erlang C: 3 is enough
    assert decide(split, PolicyState(), obs)[0].by_arrival == 5
    assert 0.4 * math.exp(-6) <= 0.001 < 0.5 * math.exp(-5)
    assert decide(split, PolicyState(), observation(lag_events=0, backlog_s=0.0))[0].by_arrival == 6


def test_split_queues_size_the_busiest_replica() -> None:
    """200/s over 12 partitions at μ = 25/s with a 0.8 target: 10 replicas leave two of them 2
    partitions, 33.3/s, over μ; the arrival rule asks 12 (16.7/s each), where pooled it asks 10."""
    config = ScalingConfig(
        objective_s=60.0, service_rate_per_replica=25, max_replicas=12, up_window_s=0, wait_quantile=None
    )
    split = ScalingConfig(**{**config.__dict__, "lanes": 1})
    obs = observation(arrival_rate=200.0, completion_rate=200.0, lag_events=0, backlog_s=0.0)
    assert decide(config, PolicyState(), obs)[0].by_arrival == 10
    assert decide(split, PolicyState(), obs)[0].by_arrival == 12


# --------------------------------------------------------------------------------------------
# The scenario's fields and the CLI
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mechanics", "message"),
    [
        (
            {"rebalance": {"assignor": "range"}},
            "mechanics.rebalance.assignor: must be one of cooperative, eager",
        ),
        ({"rebalance": {"pause_s": -1}}, "mechanics.rebalance.pause_s: must be a number >= 0"),
        ({"rebalance": {"enabled": "yes"}}, "mechanics.rebalance.enabled: must be true or false"),
        ({"metrics": {"scrape_interval_s": "15s"}}, "mechanics.metrics.scrape_interval_s: must be a number"),
        ({"metrics": {"keda": 30}}, "mechanics.metrics.keda: unknown field"),
        (
            {"partitions": {"skew": "pareto"}},
            "mechanics.partitions.skew: must be one of uniform, zipf, replay",
        ),
        ({"partitions": {"order": "random"}}, "mechanics.partitions.order: must be one of oldest, fetch"),
        ({"partitions": {"skew": "zipf", "zipf_s": 0}}, "mechanics.partitions.zipf_s: must be a number > 0"),
        ({"commit": {"interval_s": 0}}, "mechanics.commit.interval_s: must be a number > 0"),
        ({"commit": {"timers": "broker"}}, "mechanics.commit.timers: must be one of member, group"),
        ({"offsets": {}}, "mechanics.offsets: unknown field"),
        ("on", "mechanics: must be a mapping"),
    ],
)
def test_mechanics_errors_name_the_field(mechanics: Any, message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(scenario(mechanics=mechanics))
    assert message in str(caught.value)


def test_partition_queues_need_the_partitions() -> None:
    with pytest.raises(ScenarioError, match=r"mechanics\.partitions: needs replicas\.partitions"):
        parse_scenario(scenario(replicas={"initial": 3}, mechanics={"partitions": {}}))


def test_cli_without_and_the_mechanisms_line(tmp_path: Path) -> None:
    path = tmp_path / "mech.yaml"
    path.write_text(yaml.safe_dump(scenario(mechanics=ALL_ON, duration_s=300)))
    runner = CliRunner()
    text = runner.invoke(app, ["simulate", str(path), "--without", "partitions,commit"])
    assert text.exit_code == 0, text.output
    assert "mechanisms: rebalance, metrics (off: partitions,commit)" in text.stdout
    out = json.loads(runner.invoke(app, ["simulate", str(path), "--without", "commit", "--json"]).stdout)
    assert out["mechanisms"]["commit"] is None and out["mechanisms"]["rebalance"]["pause_s"] == 3.0
    assert "time_outside_lag_s" in out["policies"][0]
    bad = runner.invoke(app, ["simulate", str(path), "--without", "lag"])
    assert bad.exit_code == 2 and "'lag' is not a mechanism" in bad.output


def test_the_shipped_partitioned_reading_step_has_every_mechanism() -> None:
    from consumers.ops.capacity.scenario import load_scenario

    s = load_scenario("reading-step-partitions")
    assert s.mechanics.on == MECHANISMS and s.partitions == 12
    report, timeline = simulate_policy(s.without("partitions"), s.policy("reactive"), seed=1)
    assert len(timeline.time_lag) == len(timeline.ready) == 3600 and report.time_outside_lag_s > 0


@pytest.mark.parametrize(
    ("fetch_order", "finishes"),
    [(False, {0: [3.0, 5.0], 1: [2.0, 4.0]}), (True, {0: [3.0, 4.0], 1: [2.0, 5.0]})],
)
def test_fetch_order_serves_a_partitions_fetched_batch_before_an_older_event_elsewhere(
    fetch_order: bool, finishes: dict[int, list[float]]
) -> None:
    """One replica on partitions 0 and 1: partition 1's event at 0 s takes 2 s; meanwhile 0.5 s
    (partition 0), 0.6 s (1) and 0.7 s (0) arrive, 1 s each. Oldest first: 0.5, 0.6, 0.7. Fetch
    order: at 2 s partition 1's batch (what had come by its fetch at 0 s) is done, so the next
    partition in turn, 0, is fetched with both its events (0.5 and 0.7), then partition 1's 0.6."""
    services = iter([2.0, 1.0, 1.0, 1.0])
    picks = iter([0.75, 0.25, 0.75, 0.25])  # partitions 1, 0, 1, 0
    group = Partitions(
        Tally(5.0, 0.0, 20),
        lambda: next(services),
        1,
        [0.5, 0.5],
        lambda: next(picks),
        0.0,
        False,
        fetch_order,
    )
    group.arrive([0.0, 0.5, 0.6, 0.7])
    group.serve(10.0)
    assert {p: [finish for _, finish in group.in_flight[p]] for p in (0, 1)} == finishes


def test_replayed_partitions_put_each_arrival_where_the_run_put_it() -> None:
    """`skew: replay`: arrival i on values[i] (then uniform ones), the same under every seed. All
    of 4 events on partition 1 of 2, one replica each: the second replica idles, the first holds a
    queue; spread over both, nobody waits."""
    data = scenario(
        service={"kind": "samples", "values_s": [5.0]},
        arrivals={"kind": "trace", "timestamps": [1.0, 1.1, 1.2, 1.3]},
        replicas={"initial": 2, "partitions": 2},
        duration_s=30,
        policies=[{"name": "two", "kind": "fixed", "replicas": 2}],
    )

    def lags(values: list[int], seed: int) -> list[float]:
        mech = {"partitions": {"skew": "replay", "values": values}}
        return simulate(parse_scenario({**data, "mechanics": mech}), seed=seed).timelines["two"].time_lag

    hot = lags([1, 1, 1, 1], 1)
    assert hot == lags([1, 1, 1, 1], 2)  # the seed no longer picks partitions
    assert max(hot) == pytest.approx(19.0, abs=1.0)  # the 4th (1.3 s) starts at 16 s, ends at 21 s
    assert max(lags([0, 1, 0, 1], 1)) == pytest.approx(10.0, abs=1.0)  # two per replica
    report = simulate(
        parse_scenario({**data, "mechanics": {"partitions": {"skew": "replay", "values": [1]}}})
    )
    want = {"skew": "replay", "zipf_s": 1.0, "order": "oldest", "replayed": 1}
    assert report.to_dict()["mechanisms"]["partitions"] == want
    with pytest.raises(
        ScenarioError, match=r"mechanics\.partitions\.values\[1\]: must be a partition number 0\.\.1"
    ):
        parse_scenario({**data, "mechanics": {"partitions": {"skew": "replay", "values": [0, 2]}}})


def test_samples_in_arrival_order_replay_a_run_event_by_event() -> None:
    """`order: arrival`: event i takes values_s[i] (wrapping round), under every policy and in both
    queues (the pool draws at the start, in arrival order; the partitions at the arrival)."""
    data = scenario(
        service={"kind": "samples", "values_s": [0.5, 0.25, 2.0], "order": "arrival"},
        arrivals={"kind": "trace", "timestamps": [1.0, 10.0, 20.0, 30.0, 40.0]},
        replicas={"initial": 1, "partitions": 1},
        policies=[{"name": "one", "kind": "fixed", "replicas": 1}],
    )
    s = parse_scenario(data)
    draw = s.service.sampler(__import__("random").Random(1))
    assert [draw() for _ in range(5)] == [0.5, 0.25, 2.0, 0.5, 0.25]
    variants: list[dict[str, Any]] = [{}, {"partitions": {}}]
    for mechanics in variants:
        timeline = simulate(parse_scenario({**data, "mechanics": mechanics})).timelines["one"]
        busy = [t for t, lag in zip(timeline.t, timeline.time_lag, strict=True) if lag > 0]
        assert busy == [21.0]  # only the third event (2 s from 20 s) is unfinished at a second's end
    with pytest.raises(ScenarioError, match=r"service\.order: must be one of random, arrival"):
        parse_scenario(scenario(service={"kind": "samples", "values_s": [1], "order": "sorted"}))
