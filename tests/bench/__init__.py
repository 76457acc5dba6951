"""Throughput benchmarks: docstream's hot paths against raw confluent-kafka, side by side.

Each module has `run(bootstrap: str, n: int) -> dict` returning at least `name`, `raw_eps`,
`ours_eps` and `ratio`; `python -m tests.bench` (`make bench`) runs them all on one broker.
Not collected by pytest (the file names do not match test_*.py).
"""
