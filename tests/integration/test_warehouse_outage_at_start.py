"""A warehouse that is unreachable when the sink starts (chDB; the outage is docstream.faults'
switch, which fails every insert and DDL statement as an unreachable server does): the sink's
schema step waits with backoff, says so once when it finds the warehouse away and once when it
answers, and then applies every migration, each recorded once. Before, the sink exited and a
chaos run caught the outage between a migration's statements and its record: the restarted sink
found the migration's view existing and could not start again."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.warehouse.store import MIGRATIONS_TABLE, Warehouse
from docstream import faults
from docstream.cli.warehouse import DDL_DIR
from docstream.errors import TransientError


def test_the_schema_step_waits_for_the_warehouse_and_then_applies_every_migration_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    switches = tmp_path / "switches"
    switches.mkdir()
    monkeypatch.setattr(faults, "_switches", str(switches))
    (switches / faults.WAREHOUSE_DOWN).touch()
    said: list[str] = []
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 7:  # the warehouse comes back after the seventh wait
            (switches / faults.WAREHOUSE_DOWN).unlink()

    with Warehouse(f"chdb://{tmp_path / 'warehouse'}") as warehouse:
        with pytest.raises(TransientError, match="unreachable"):
            warehouse.migrate(DDL_DIR)  # the outage fails DDL too, before anything is applied
        applied = warehouse.migrate_when_reachable(DDL_DIR, say=said.append, sleep=sleep)
        assert applied == sorted(p.name for p in DDL_DIR.glob("[0-9]*.sql"))
        _, rows = warehouse.query(f"SELECT name, count() FROM {MIGRATIONS_TABLE} GROUP BY name")
        assert sorted(rows) == [(name, 1) for name in applied]
        assert warehouse.migrate_when_reachable(DDL_DIR, say=said.append, sleep=sleep) == []
    assert slept == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0], "backoff doubling from 0.5 s, capped at 10 s"
    assert len(said) == 2, said
    assert "unreachable at start" in said[0] and "answers again" in said[1]
