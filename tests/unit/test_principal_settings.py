"""On the local secured cluster a process runs as its own principal (`infra.cluster.principal_settings`):
`docstream up` and `demo` give each group, the sink, analytics and the API its own user, and a
command given no credentials connects as `ops`; any other cluster keeps the settings' own."""

from __future__ import annotations

from pathlib import Path

import pytest

from docstream.kafka.config import connection_config
from docstream.principals import PRINCIPALS
from docstream.settings import Settings
from infra.cluster import principal_settings
from infra.security import BrokerMaterial


@pytest.fixture(scope="module")
def secured_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A home whose local broker was formatted secured: its users file and CA (openssl), no JVM."""
    home = tmp_path_factory.mktemp("home")
    passwords = BrokerMaterial(home / "broker" / "tls").ensure(PRINCIPALS)
    (home / "broker" / "formatted").write_text("secure\n")
    return home, passwords


@pytest.mark.parametrize("user", ["ocr", "warehouse", "api", "ops", "admin"])
def test_each_process_of_the_local_secured_cluster_gets_its_own_principal(
    secured_home: tuple[Path, dict[str, str]], user: str
) -> None:
    home, passwords = secured_home
    s = Settings(home=home, local_broker_port=29492, group_prefix="x.", topic_partitions=5)
    mine = principal_settings(s, user)
    conf = connection_config(mine)
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert (conf["sasl.username"], conf["sasl.password"]) == (user, passwords[user])
    assert conf["ssl.ca.location"] == str(home / "broker" / "tls" / "ca.pem")
    assert conf["bootstrap.servers"] == "127.0.0.1:29492"
    assert (mine.group_prefix, mine.topic_partitions, mine.home) == ("x.", 5, home)  # the rest kept


def test_a_plain_local_broker_and_any_other_cluster_keep_the_settings_own(
    secured_home: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    home, _ = secured_home
    plain = Settings(home=tmp_path)
    (tmp_path / "broker").mkdir()
    (tmp_path / "broker" / "formatted").write_text("plain\n")
    assert principal_settings(plain, "ocr") is plain
    elsewhere = Settings(home=home, bootstrap_servers="kafka.example:9093", sasl_username="ops")
    assert principal_settings(elsewhere, "ocr") is elsewhere
