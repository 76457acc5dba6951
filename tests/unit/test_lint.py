"""The tree stays clean: ruff (lint and format) and mypy strict over the source and the tests,
with the pinned versions, as `make lint` runs them. In `make test`, so that CI holds it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREE = ["docstream", "producers", "consumers", "schemas", "infra", "tests"]


@pytest.mark.parametrize(
    "argv",
    [
        ["ruff", "check", *TREE],
        ["ruff", "format", "--check", *TREE],
        ["mypy"],  # strict; the files are listed in pyproject.toml
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
)
def test_the_tree_is_clean(argv: list[str], tmp_path: Path) -> None:
    extra = ["--cache-dir", str(tmp_path / "cache")] if argv[0] == "mypy" else ["--no-cache"]
    done = subprocess.run([sys.executable, "-m", *argv, *extra], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
