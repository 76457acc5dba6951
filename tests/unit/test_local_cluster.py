"""The local cluster's layout and replication rules, without starting a JVM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from docstream.errors import BrokerError
from docstream.settings import Settings
from infra.cluster import LocalCluster, for_settings
from infra.server_properties import min_insync, render_server_properties
from infra.topics import Replication


def properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_one_node_renders_as_the_single_broker_always_did() -> None:
    one = properties(render_server_properties(9092, 9093, Path("/d")))
    assert one["node.id"] == "1" and one["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert one["offsets.topic.replication.factor"] == "1" and "min.insync.replicas" not in one
    assert one["process.roles"] == "broker,controller"


def test_three_nodes_share_a_quorum_and_replicate_everything_three_times(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, brokers=3, broker_port=19092, controller_port=19093)
    assert cluster.ports == ((19092, 19093), (19094, 19095), (19096, 19097))
    assert cluster.bootstrap == "127.0.0.1:19092,127.0.0.1:19094,127.0.0.1:19096"
    assert [n.work_dir for n in cluster.nodes] == [tmp_path.resolve() / f"node-{i}" for i in (1, 2, 3)]
    rendered = [properties(n._properties()) for n in cluster.nodes]
    voters = "1@127.0.0.1:19093,2@127.0.0.1:19095,3@127.0.0.1:19097"
    for node_id, conf in enumerate(rendered, start=1):
        assert conf["node.id"] == str(node_id)
        assert conf["controller.quorum.voters"] == voters
        assert conf["process.roles"] == "broker,controller"
        assert conf["offsets.topic.replication.factor"] == "3"
        assert conf["transaction.state.log.min.isr"] == "2"
        assert conf["min.insync.replicas"] == "2" and conf["default.replication.factor"] == "3"
    assert {n.cluster_id for n in cluster.nodes} == {cluster.cluster_id}


def test_a_cluster_is_found_again_from_its_record(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, brokers=3, broker_port=29092, controller_port=29093)
    cluster.record()
    again = LocalCluster.recorded(tmp_path)
    assert again is not None
    assert (again.size, again.ports, again.cluster_id) == (3, cluster.ports, cluster.cluster_id)
    elsewhere = Settings(home=tmp_path / "elsewhere", bootstrap_servers=None)
    # the record lives in <home>/broker: Settings.bootstrap lists every node from it
    home = tmp_path / "home"
    (home / "broker").mkdir(parents=True)
    (home / "broker" / "cluster.json").write_text((tmp_path / "cluster.json").read_text())
    assert Settings(home=home, bootstrap_servers=None).bootstrap == cluster.bootstrap
    assert elsewhere.bootstrap == "127.0.0.1:9092"  # no record there: the one local broker
    LocalCluster(tmp_path, brokers=1).record()
    assert LocalCluster.recorded(tmp_path) is None, "a one-node cluster removes the record"


def test_settings_pick_the_recorded_cluster_unless_told_otherwise(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path, bootstrap_servers=None, local_broker_port=31092, local_controller_port=31093
    )
    assert for_settings(settings).size == 1
    LocalCluster(tmp_path / "broker", brokers=3, broker_port=31092, controller_port=31093).record()
    assert for_settings(settings).size == 3
    assert for_settings(settings, 1).size == 1  # not running: another size may be started


def test_bad_layouts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match="1 to 9 brokers"):
        LocalCluster(tmp_path, brokers=0)
    with pytest.raises(BrokerError, match="overlap"):
        LocalCluster(tmp_path, brokers=3, broker_port=9092, controller_port=9094)
    (tmp_path / "cluster.json").write_text(json.dumps({"ports": "nonsense"}))
    with pytest.raises(BrokerError, match="not a cluster record"):
        LocalCluster.recorded(tmp_path)


@pytest.mark.parametrize(
    ("brokers", "factor", "expected"),
    [
        (1, None, (1, 1)),
        (2, None, (2, 1)),
        (3, None, (3, 2)),
        (5, None, (3, 2)),
        (5, 5, (5, 2)),
        (1, 2, (2, 1)),
    ],
)
def test_replication_follows_the_brokers_up_to_three(
    brokers: int, factor: int | None, expected: tuple[int, int]
) -> None:
    chosen = Replication.for_brokers(brokers, factor)
    assert (chosen.factor, chosen.min_insync) == expected
    assert min_insync(chosen.factor) == chosen.min_insync
