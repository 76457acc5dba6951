"""`python -m tests.bench` (`make bench`): run every benchmark on one broker, print the ratios.

The broker is the cluster in KAFKA_BOOTSTRAP_SERVERS when set, otherwise a LocalBroker started
on free loopback ports in a temporary directory (and stopped afterwards).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from infra.broker import LocalBroker, free_port

# Each module has run(bootstrap: str, n: int) -> dict with name, raw_eps, ours_eps, ratio.
BENCHMARKS = [
    "tests.bench.publisher_bench",
    "tests.bench.consumer_bench",
    "tests.bench.embeddings_bench",
    "tests.bench.embeddings_pipeline_bench",
    "tests.bench.ocr_pipeline_bench",
    "tests.bench.lag_bench",
]
TARGET_RATIO = 0.85
MAIN_KEYS = ("name", "raw_eps", "ours_eps", "ratio")


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


def _ratio_cell(ratio: float) -> str:
    style = "green" if ratio >= TARGET_RATIO else "red"
    return f"[{style}]{ratio:.3f}[/{style}]"


def _table(results: list[dict[str, Any]]) -> Table:
    table = Table(
        "benchmark",
        "raw events/s",
        "ours events/s",
        "ratio",
        "more",
        show_lines=True,
        title=f"docstream vs raw confluent-kafka (target ratio >= {TARGET_RATIO})",
    )
    for result in results:
        more = "\n".join(f"{k}={v}" for k, v in result.items() if k not in MAIN_KEYS)
        table.add_row(
            result["name"],
            f"{result['raw_eps']:,}",
            f"{result['ours_eps']:,}",
            _ratio_cell(result["ratio"]),
            more,
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    parser.add_argument("-n", "--events", type=int, default=100_000, help="events per run (default 100000)")
    parser.add_argument("--only", action="append", help="run only benchmarks whose module name contains this")
    parser.add_argument("--json", action="store_true", help="print one JSON document to stdout")
    parser.add_argument("--min-ratio", type=float, help="exit 1 when a ratio is below this")
    args = parser.parse_args(argv)
    selected = [m for m in BENCHMARKS if not args.only or any(o in m for o in args.only)]
    results: list[dict[str, Any]] = []
    with _bootstrap() as bootstrap:
        for name in selected:
            results.append(importlib.import_module(name).run(bootstrap, args.events))
    if args.json:
        sys.stdout.write(json.dumps(results, indent=2) + "\n")
    else:
        Console(width=max(160, Console().width)).print(_table(results))
    too_slow = args.min_ratio is not None and any(r["ratio"] < args.min_ratio for r in results)
    return 1 if too_slow else 0


if __name__ == "__main__":
    sys.exit(main())
