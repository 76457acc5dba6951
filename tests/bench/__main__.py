"""`python -m tests.bench` (`make bench`): run every benchmark on one broker, print the ratios.

The broker is the cluster in KAFKA_BOOTSTRAP_SERVERS when set, otherwise a LocalBroker started
on free loopback ports in a temporary directory (and stopped afterwards).

Each row prints its target and whether it is met: `TARGET_RATIO` for a ratio against a raw
baseline (raw confluent-kafka, a bare model), the row's own target where it sets one (the
key-ordered speedups), none for a comparison with a peer library (the issue sets no number).
docs/benchmarks.md holds the table of one full run, the machine and what each row measures.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from infra.broker import LocalBroker, free_port

# Each module has run(bootstrap: str, n: int) -> one row or a list of rows, each a dict with name,
# raw_eps, ours_eps, ratio and optionally baseline (what raw_eps measures), target (None: no
# target set) and the row's other figures; `unit` (default "/s") names what raw_eps and ours_eps
# measure when they are not rates (a latency row: "ms p99", its ratio baseline / ours).
BENCHMARKS = [
    "tests.bench.publisher_bench",
    "tests.bench.consumer_bench",
    "tests.bench.keyorder_bench",
    "tests.bench.embeddings_bench",
    "tests.bench.embeddings_pipeline_bench",
    "tests.bench.ocr_pipeline_bench",
    "tests.bench.e2e_pipeline_bench",
    "tests.bench.lag_bench",
    "tests.bench.api_bench",
    "tests.bench.api_replicas_bench",
    "tests.bench.search_bench",
]
TARGET_RATIO = 0.85
MAIN_KEYS = ("name", "baseline", "raw_eps", "ours_eps", "ratio", "target", "met", "unit", "objective")


@contextmanager
def _bootstrap() -> Iterator[str]:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        return
    with tempfile.TemporaryDirectory(prefix="docstream-bench-") as work:
        broker = LocalBroker(Path(work) / "broker", broker_port=free_port(), controller_port=free_port())
        broker.fetch_jars()
        broker.start(timeout=90)
        try:
            yield broker.bootstrap
        finally:
            broker.stop(timeout=30)


def _with_target(row: dict[str, Any]) -> dict[str, Any]:
    """The row with `target` (TARGET_RATIO unless the row set its own, None for none) and `met`.
    A row judged against an absolute objective instead of a ratio (search's p95 in ms) sets
    `target` None, its own `met` and the `objective` the target column shows."""
    target = row.get("target", TARGET_RATIO)
    # a fast run that broke key order, or left work undone (incomplete), meets nothing
    correct = row.get("order_violations", 0) == 0 and not row.get("incomplete")
    met = None if target is None else bool(row["ratio"] >= target and correct)
    return {**row, "target": target, "met": row.get("met", met)}


def _rows(result: dict[str, Any] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [_with_target(r) for r in (result if isinstance(result, list) else [result])]


def _ratio_cell(ratio: float, met: bool | None) -> str:
    if met is None:
        return f"{ratio:.3f}"
    style = "green" if met else "red"
    return f"[{style}]{ratio:.3f}[/{style}]"


def _met_cell(met: bool | None) -> str:
    return "-" if met is None else ("[green]yes[/green]" if met else "[red]no[/red]")


def _table(results: list[dict[str, Any]]) -> Table:
    table = Table(
        "benchmark",
        "baseline is",
        "baseline",
        "ours",
        "ratio",
        "target",
        "met",
        "more",
        show_lines=True,
        title=f"docstream vs its baselines and peers (target ratio >= {TARGET_RATIO} vs raw)",
    )
    for result in results:
        more = "\n".join(f"{k}={v}" for k, v in result.items() if k not in MAIN_KEYS)
        target = result["target"]
        table.add_row(
            result["name"],
            result.get("baseline", "raw confluent-kafka"),
            f"{result['raw_eps']:,} {result.get('unit', '/s')}",
            f"{result['ours_eps']:,} {result.get('unit', '/s')}",
            _ratio_cell(result["ratio"], result["met"]),
            result.get("objective", "-") if target is None else f">= {target:g}",
            _met_cell(result["met"]),
            more,
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    parser.add_argument("-n", "--events", type=int, default=100_000, help="events per run (default 100000)")
    parser.add_argument("--only", action="append", help="run only benchmarks whose module name contains this")
    parser.add_argument("--json", action="store_true", help="print one JSON document to stdout")
    parser.add_argument("--json-out", type=Path, help="also write the rows as JSON to this file")
    parser.add_argument("--min-ratio", type=float, help="exit 1 when a ratio vs a raw baseline is below this")
    args = parser.parse_args(argv)
    selected = [m for m in BENCHMARKS if not args.only or any(o in m for o in args.only)]
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    with _bootstrap() as bootstrap:
        for name in selected:
            results.extend(_rows(importlib.import_module(name).run(bootstrap, args.events)))
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")
    if args.json:
        sys.stdout.write(json.dumps(results, indent=2) + "\n")
    else:
        console = Console(width=max(160, Console().width))
        console.print(_table(results))
        console.print(f"{len(results)} rows in {time.perf_counter() - started:.0f} s")
    too_slow = args.min_ratio is not None and any(
        r["ratio"] < args.min_ratio for r in results if r["target"] == TARGET_RATIO
    )
    return 1 if too_slow else 0


if __name__ == "__main__":
    sys.exit(main())
