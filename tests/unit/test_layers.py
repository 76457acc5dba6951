"""The layers of the tree, read from its import statements (ast, nothing imported): the shared
core and the contract sit below everything, the CLI above everything; and the modules that say
they stay light do not load heavy dependencies when imported."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("docstream", "producers", "consumers", "schemas", "infra")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the docstream-tree modules it imports (at any depth in the file)."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name, imported = _module(path), set()
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    imported |= {alias.name for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    imported |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            graph[name] = {m for m in imported if m.split(".")[0] in PACKAGES}
    return graph


def _in(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _violations(below: tuple[str, ...], above: tuple[str, ...], exempt: tuple[str, ...] = ()) -> list[str]:
    return sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if _in(module, *below) and not _in(module, *exempt)
        for target in targets
        if _in(target, *above)
    )


def test_the_graph_sees_the_tree() -> None:
    graph = import_graph()
    assert "docstream.cli" in graph and "consumers.runtime.loop" in graph
    assert any(_in(m, "docstream.settings") for m in graph["docstream.cli.run"])


def test_nothing_below_the_cli_imports_it() -> None:
    assert _violations(PACKAGES, ("docstream.cli",), exempt=("docstream.cli",)) == []


def test_the_shared_core_and_the_contract_import_no_layer_above_them() -> None:
    above = ("consumers", "producers", "infra")
    assert _violations(("docstream", "schemas"), above, exempt=("docstream.cli",)) == []


@pytest.mark.parametrize(
    ("module", "heavy"),
    [
        ("producers.events", ("fsspec",)),  # "pure functions, no I/O"
        ("consumers.ocr.worker", ("rapidocr", "cv2", "onnxruntime")),  # the engine loads them, not the stage
        ("docstream.topology", ("confluent_kafka",)),  # pure data
        ("consumers.ops.hpa", ("confluent_kafka",)),  # pure
    ],
)
def test_light_modules_load_no_heavy_dependency(module: str, heavy: tuple[str, ...]) -> None:
    code = f"import sys, {module}; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    argv = [sys.executable, "-c", code]
    loaded = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "", f"importing {module} loaded {loaded.stdout.strip()}"


def test_admin_clients_are_built_in_one_place() -> None:
    """docstream.kafka.clients builds every AdminClient (from settings or a connection dict)."""
    building = sorted(
        _module(path)
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "AdminClient"
    )
    assert building == ["docstream.kafka.clients"]


def test_no_module_keeps_its_own_librdkafka_code_helper() -> None:
    """`docstream.kafka.errors.code` reads an exception's librdkafka code; no copies of it."""
    copies = sorted(
        _module(path)
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.FunctionDef)
        and node.name in {"_code", "_translate", "_translated"}
        and "kafka" in (ast.get_source_segment(path.read_text(), node) or "").lower()
    )
    assert copies == []


def test_the_lag_model_imports_no_kafka_client() -> None:
    """The lag model's pure modules (model.py, estimator.py, snapshot.py, targets.py) import no
    Kafka client: neither they nor what they import loads confluent_kafka (importing them through
    their package loads the reader too, so their imports are checked); of the package they import
    only each other."""
    pure = ("model", "estimator", "snapshot", "targets")
    paths = [ROOT / "consumers" / "ops" / "lag" / f"{name}.py" for name in pure]
    modules = {
        node.module
        for path in paths
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES
    }
    within = {m for m in modules if m.startswith("consumers.ops.lag")}
    assert within <= {f"consumers.ops.lag.{name}" for name in pure}
    outside = modules - within
    code = f"import sys; import {', '.join(sorted(outside))}; print('confluent_kafka' in sys.modules)"
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "False"
    assert not any("confluent_kafka" in path.read_text() for path in paths)


def test_every_test_module_has_a_name_of_its_own() -> None:
    """pytest imports test modules by basename (no packages under tests/): two `test_x.py` in
    different folders stop the whole run at collection."""
    names = [path.name for path in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
