"""The floors of the house, read from its import statements (ast, nothing imported).

docs/architecture.md ("Layout and layers") draws them; this file is their rule book:

- every module of the tree stands on one floor of `FLOORS`, and imports only from its own floor
  or the floors below it (at any depth in the file: a function-level import counts too);
- the SDK (`producers`) needs only the core and the contracts, so that loading it loads neither
  FastAPI nor anything of `consumers`; nothing below the CLI imports the CLI;
- no two modules import each other, directly or round a longer cycle;
- the list of stages is written out only in the registry, `docstream.topology`;
- a module over 400 lines says in its docstring why it is one thing ("Why one module:");
- the modules that say they stay light load no heavy dependency.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from docstream.topology import STAGE_NAMES

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("docstream", "producers", "consumers", "schemas", "infra")

# From the bottom up. A module stands on the floor of the longest prefix that names it.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("docstream",)),
    ("contracts", ("schemas",)),
    ("runtime and models", ("consumers.runtime", "consumers.lag", "producers", "infra")),
    ("stages and sink", ("consumers",)),
    ("operators' tools", ("consumers.ops",)),
    ("doors", ("docstream.cli", "docstream.api")),
)
LONG_MODULE_LINES = 400
WHY_ONE_MODULE = "Why one module:"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _sources() -> dict[str, Path]:
    """module name -> its file, for every module of the tree (tests and bench not included)."""
    return {_module(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


@cache
def _tree(module: str) -> ast.Module:
    path = _sources()[module]
    return ast.parse(path.read_text(), str(path))


def _resolve(name: str) -> str:
    """The module of the tree that an imported name lives in (`a.b.Thing` -> `a.b`)."""
    while name and name not in _sources():
        name = name.rpartition(".")[0]
    return name


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of the tree it imports (at any depth in the file)."""
    graph: dict[str, set[str]] = {}
    for module in _sources():
        imported: set[str] = set()
        for node in ast.walk(_tree(module)):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported |= {f"{node.module}.{alias.name}" for alias in node.names}
        resolved = {_resolve(name) for name in imported if name.split(".")[0] in PACKAGES}
        graph[module] = resolved - {"", module}
    return graph


def floor_of(module: str) -> int:
    """The index in FLOORS of the floor a module stands on."""
    best: tuple[int, int] | None = None  # (length of the prefix, floor)
    for index, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), index)
    if best is None:
        raise LookupError(f"{module} stands on no floor: add its package to FLOORS")
    return best[1]


def _in(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_graph_sees_the_tree() -> None:
    graph = import_graph()
    assert "docstream.cli" in graph and "consumers.runtime.loop" in graph and "docstream.api.app" in graph
    assert "docstream.settings" in graph["docstream.cli.run"]
    assert "consumers.lag.snapshot" in graph["docstream.api.admission"]


@pytest.mark.parametrize(
    ("module", "floor"),
    [
        ("docstream.settings", "core"),
        ("docstream.kafka.clients", "core"),
        ("schemas.codec", "contracts"),
        ("consumers.runtime.loop", "runtime and models"),
        ("consumers.lag.model", "runtime and models"),
        ("producers.publisher", "runtime and models"),
        ("infra.topics", "runtime and models"),
        ("consumers.ocr.worker", "stages and sink"),
        ("consumers.warehouse.sink", "stages and sink"),
        ("consumers.stage", "stages and sink"),
        ("consumers.ops.replay.plan", "operators' tools"),
        ("docstream.api.app", "doors"),
        ("docstream.cli.run", "doors"),
    ],
)
def test_a_module_stands_on_the_floor_of_its_longest_prefix(module: str, floor: str) -> None:
    assert FLOORS[floor_of(module)][0] == floor


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a floor above its own, described."""
    return sorted(
        f"{module} ({FLOORS[floor_of(module)][0]}) imports {target} ({FLOORS[floor_of(target)][0]})"
        for module, targets in graph.items()
        for target in targets
        if floor_of(target) > floor_of(module)
    )


def test_nothing_imports_from_a_higher_floor() -> None:
    assert upward_imports(import_graph()) == []


def test_the_floor_rule_catches_an_upward_import() -> None:
    """The rule above can fail: the lag model importing an operator's tool would be caught."""
    assert floor_of("consumers.ops.exporter") > floor_of("consumers.lag.model")
    assert floor_of("docstream.cli") > floor_of("consumers.ops.chaos.runner")
    assert floor_of("docstream.api.watch") > floor_of("consumers.lag.monitor")
    graph = {
        "consumers.lag.model": {"consumers.ops.exporter", "docstream.settings"},
        "docstream.cli": {"schemas"},
    }
    assert upward_imports(graph) == [
        "consumers.lag.model (runtime and models) imports consumers.ops.exporter (operators' tools)"
    ]


def test_nothing_below_the_cli_imports_it() -> None:
    """The HTTP API sits on the doors' floor too, and the CLI runs it; the API never runs the CLI."""
    graph = import_graph()
    importers = sorted(
        m
        for m, targets in graph.items()
        if not _in(m, "docstream.cli")
        for t in targets
        if _in(t, "docstream.cli")
    )
    assert importers == []


def test_the_sdk_imports_only_the_core_and_the_contracts() -> None:
    graph = import_graph()
    beyond = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if _in(module, "producers")
        for target in targets
        if not _in(target, "producers", "schemas") and (not _in(target, "docstream") or floor_of(target) != 0)
    )
    assert beyond == []


def test_loading_the_sdk_loads_neither_fastapi_nor_the_consumers() -> None:
    """What upstream services import: the publisher, the event builder and the partitioner."""
    code = (
        "import sys, producers, producers.publisher, producers.events, producers.murmur2, producers.batch;"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('fastapi', 'starlette', 'uvicorn', 'consumers', 'infra'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == ""


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_modules_import_each_other() -> None:
    assert _cycles(import_graph()) == []


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert sorted(_cycles(graph)) == [["a", "b", "c"], ["d", "e"]]


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions (prose, not lists)."""
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, owners)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def stage_lists(tree: ast.Module, names: tuple[str, ...] = STAGE_NAMES) -> list[int]:
    """The lines where two or more stage names are written out together: a tuple, list, set or
    dict's keys of string constants, or a string (help text, a title) naming them, docstrings
    aside."""
    prose = _docstrings(tree)
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.expr):
            continue
        elements: list[ast.expr | None] = []
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            elements = list(node.elts)
        elif isinstance(node, ast.Dict):
            elements = list(node.keys)
        written = {e.value for e in elements if isinstance(e, ast.Constant) and e.value in names}
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            written = set(re.findall(r"[a-z]+", node.value)) & set(names)
        if len(written) >= 2:
            lines.append(node.lineno)
    return sorted(set(lines))


def test_the_stage_list_is_written_only_in_the_registry() -> None:
    """Everything else derives the stages from docstream.topology (STAGES, STAGE_NAMES)."""
    assert len(STAGE_NAMES) >= 2  # else the check below checks nothing
    written = sorted(
        f"{_sources()[module].relative_to(ROOT)}:{line}"
        for module in _sources()
        if module != "docstream.topology"
        for line in stage_lists(_tree(module))
    )
    assert written == []


@pytest.mark.parametrize(
    "code",
    [
        'STAGES = ("ocr", "embeddings", "thumbnails")',
        'for name in ["ocr", "thumbnails", "sink"]: pass',
        'OCR, EMBEDDINGS = "ocr", "embeddings"',
        'per_stage = {"ocr": 1, "embeddings": 2}',
        'help_text = "one of ocr, embeddings or thumbnails"',
    ],
)
def test_the_stage_list_check_finds_a_list_written_out(code: str) -> None:
    assert stage_lists(ast.parse(code)) == [1]


@pytest.mark.parametrize(
    "code",
    [
        'def f():\n    """ocr, embeddings and thumbnails, in prose."""',
        'OCR = "ocr"',
        'name = "thumbnails" if x else "ocr-ish"',
    ],
)
def test_the_stage_list_check_passes_prose_and_single_names(code: str) -> None:
    assert stage_lists(ast.parse(code)) == []


def test_a_long_module_says_why_it_is_one_thing() -> None:
    long_and_silent = sorted(
        f"{path.relative_to(ROOT)} ({lines} lines)"
        for module, path in _sources().items()
        if (lines := len(path.read_text().splitlines())) > LONG_MODULE_LINES
        and WHY_ONE_MODULE not in (ast.get_docstring(_tree(module)) or "")
    )
    assert long_and_silent == []


@pytest.mark.parametrize(
    ("module", "heavy"),
    [
        ("producers.events", ("fsspec",)),  # "pure functions, no I/O"
        ("consumers.ocr.worker", ("rapidocr", "cv2", "onnxruntime")),  # the engine loads them, not the stage
        ("docstream.topology", ("confluent_kafka",)),  # pure data
        ("docstream.idempotency", ("confluent_kafka", "schemas")),  # pure: the core's own
        ("consumers.lag.hpa", ("confluent_kafka",)),  # pure
        ("consumers.lag.scaling", ("confluent_kafka",)),  # pure
        ("consumers.lag.queueing", ("confluent_kafka",)),  # pure
        ("consumers.lag.plan", ("confluent_kafka",)),  # pure
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
        module
        for module in _sources()
        for node in ast.walk(_tree(module))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "AdminClient"
    )
    assert building == ["docstream.kafka.clients"]


def test_no_module_keeps_its_own_librdkafka_code_helper() -> None:
    """`docstream.kafka.errors.code` reads an exception's librdkafka code; no copies of it."""
    copies = sorted(
        module
        for module, path in _sources().items()
        for node in ast.walk(_tree(module))
        if isinstance(node, ast.FunctionDef)
        and node.name in {"_code", "_translate", "_translated"}
        and "kafka" in (ast.get_source_segment(path.read_text(), node) or "").lower()
    )
    assert copies == []


def test_the_lag_model_imports_no_kafka_client() -> None:
    """The lag model's pure modules import no Kafka client: neither they nor what they import
    loads confluent_kafka (importing them through their package loads the reader too, so their
    imports are checked); of the package they import only each other."""
    pure = ("model", "estimator", "snapshot", "targets", "health", "scaling", "hpa", "queueing", "plan")
    paths = [ROOT / "consumers" / "lag" / f"{name}.py" for name in pure]
    modules = {
        node.module
        for path in paths
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES
    }
    within = {m for m in modules if m.startswith("consumers.lag")}
    assert within <= {f"consumers.lag.{name}" for name in pure}
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
