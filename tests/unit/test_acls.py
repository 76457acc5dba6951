"""The ACL plan (docstream.acls): each principal's grant as a table, the properties least privilege
means, the names the plan shares with the code that uses them, the apply edge against a fake
AdminClient, and `docstream acls plan --json`."""

from __future__ import annotations

import ast
import concurrent.futures
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # no __all__
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from typer.testing import CliRunner

from consumers.analytics.app import DECLARED_TOPICS
from consumers.lag.reader import LAG_MONITOR_READER_GROUP
from consumers.ops import acls as cluster_acls
from consumers.warehouse.sink import SinkTopics
from docstream import acls
from docstream.acls import Acl, Operation, Pattern, Resource, grants, plan
from docstream.api.registry_updates import followed_topics
from docstream.api.service import GROUPS as API_WATCHED
from docstream.cli import app
from docstream.errors import ConfigurationError, KafkaConfigError
from docstream.principals import ADMIN, API, OPS, PRINCIPALS
from docstream.topology import (
    ANALYTICS,
    ANALYTICS_CLOCK,
    DOC_UPLOADED,
    ROLLUPS,
    STAGES,
    WAREHOUSE,
    dead_letter_topic,
    group_id,
    retry_group_id,
    retry_topic,
)

ROOT = Path(__file__).resolve().parents[2]
T, G = Resource.TOPIC, Resource.GROUP
L, P = Pattern.LITERAL, Pattern.PREFIXED
R, W, D = Operation.READ, Operation.WRITE, Operation.DESCRIBE
PLAN = plan()
EVERY = acls.bindings(PLAN)


def rows(principal: str, grant: acls.Plan = PLAN) -> set[tuple[Resource, Pattern, str, Operation]]:
    return {(a.resource, a.pattern, a.name, a.operation) for a in grant[principal]}


def may(principal: str, resource: Resource, name: str, operation: Operation) -> bool:
    return grants(EVERY, principal, resource, name, operation)


# -- each principal's grant, written out ----------------------------------------------------------


@pytest.mark.parametrize(
    ("principal", "expected"),
    [
        (
            "ocr",
            {
                (T, L, "doc.uploaded", R),
                (T, L, "docstream.ocr.retry", R),
                (T, L, "docstream.ocr.retry", W),
                (T, L, "docstream.ocr.dlq", W),
                (T, L, "doc.ocr.done", W),
                (G, L, "docstream.ocr", R),
                (G, L, "docstream.ocr.retry", R),
            },
        ),
        (
            "embeddings",
            {
                (T, L, "doc.uploaded", R),
                (T, L, "doc.ocr.done", R),
                (T, L, "docstream.embeddings.retry", R),
                (T, L, "docstream.embeddings.retry", W),
                (T, L, "docstream.embeddings.dlq", W),
                (T, L, "doc.embedded", W),
                (G, L, "docstream.embeddings", R),
                (G, L, "docstream.embeddings.retry", R),
            },
        ),
        (
            "thumbnails",
            {
                (T, L, "doc.uploaded", R),
                (T, L, "docstream.thumbnails.retry", R),
                (T, L, "docstream.thumbnails.retry", W),
                (T, L, "docstream.thumbnails.dlq", W),
                (T, L, "doc.thumbnailed", W),
                (G, L, "docstream.thumbnails", R),
                (G, L, "docstream.thumbnails.retry", R),
            },
        ),
        (
            "analytics",
            {
                *((T, L, t, R) for t in ("doc.uploaded", "doc.ocr.done", "doc.embedded", "doc.thumbnailed")),
                (T, L, "analytics.clock", R),
                (T, L, "analytics.clock", W),
                (T, L, "analytics.rollups", W),
                (T, L, "docstream.analytics.dlq", W),
                (T, P, "docstream.analytics-", Operation.CREATE),
                (T, P, "docstream.analytics-", R),
                (T, P, "docstream.analytics-", W),
                (G, L, "docstream.analytics", R),
                (G, L, "docstream.analytics.read-back", D),
            },
        ),
        (
            "warehouse",
            {
                *((T, L, t, R) for t in ("doc.uploaded", "doc.ocr.done", "doc.embedded", "doc.thumbnailed")),
                (T, L, "analytics.rollups", R),
                *((T, L, f"docstream.{g}.dlq", R) for g in ("ocr", "embeddings", "thumbnails", "analytics")),
                (T, L, "docstream.warehouse.retry", R),
                (T, L, "docstream.warehouse.retry", W),
                (T, L, "docstream.warehouse.dlq", W),
                (G, L, "docstream.warehouse", R),
                (G, L, "docstream.warehouse.retry", R),
            },
        ),
        (
            "api",
            {
                (T, L, "doc.uploaded", W),
                *((T, L, t, R) for t in ("doc.uploaded", "doc.ocr.done", "doc.embedded", "doc.thumbnailed")),
                *((T, L, f"docstream.{g}.dlq", R) for g in ("ocr", "embeddings", "thumbnails", "analytics")),
                *(
                    (T, L, f"docstream.{g}.retry", R)
                    for g in ("ocr", "embeddings", "thumbnails", "analytics")
                ),
                *((G, L, f"docstream.{g}", D) for g in ("ocr", "embeddings", "thumbnails", "analytics")),
                (G, L, "docstream.lag-monitor", D),
                (G, P, "docstream-api-", D),
            },
        ),
        ("admin", set()),
    ],
)
def test_each_principal_gets_its_grant(principal: str, expected: set[Any]) -> None:
    assert rows(principal) == expected


def test_ops_writes_only_uploads_retries_and_a_side_replays_outputs() -> None:
    writes = {(a.pattern, a.name) for a in PLAN[OPS] if a.operation == W}
    assert writes == {
        (L, DOC_UPLOADED),
        *((L, retry_topic(group_id(g))) for g in ("ocr", "embeddings", "thumbnails", "warehouse")),
        *((L, s.result_topic) for s in STAGES),
        *((L, dead_letter_topic(group_id(s.name))) for s in STAGES),
        *((P, f"docstream.{s.name}.side.") for s in STAGES),
    }


def test_every_principal_of_the_registry_has_a_plan_in_its_order() -> None:
    assert tuple(PLAN) == PRINCIPALS


# -- least privilege -------------------------------------------------------------------------------


def test_no_principal_has_a_cluster_right_or_a_transactional_id() -> None:
    assert not [a for a in EVERY if a.resource in (Resource.CLUSTER, Resource.TRANSACTIONAL_ID)]


def test_create_only_under_fausts_prefix_and_a_side_replays() -> None:
    creates = {(a.principal, a.pattern, a.name) for a in EVERY if a.operation == Operation.CREATE}
    assert creates == {("analytics", P, "docstream.analytics-")} | {
        (OPS, P, f"docstream.{s.name}.side.") for s in STAGES
    }


def test_no_principal_alters_or_deletes_anything_declared() -> None:
    risky = {Operation.ALTER, Operation.ALTER_CONFIGS, Operation.ALL}
    assert not [a for a in EVERY if a.operation in risky]
    deletes = {(a.principal, a.pattern) for a in EVERY if a.operation == Operation.DELETE}
    assert deletes == {(OPS, P)}  # only a side replay's own group and retry topic


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_a_stage_writes_its_own_result_topic_only(stage: Any) -> None:
    for other in STAGES:
        assert may(stage.name, T, other.result_topic, W) == (other is stage)
    assert not may(stage.name, T, DOC_UPLOADED, W)
    assert not may(stage.name, T, ROLLUPS, W)


def test_ocr_cannot_write_doc_embedded_nor_join_another_group() -> None:
    assert not may("ocr", T, "doc.embedded", W)
    assert not may("ocr", G, "docstream.embeddings", R)
    assert not may("ocr", T, "docstream.embeddings.retry", W)


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_every_topic_a_stage_reads_is_granted(stage: Any) -> None:
    """What the runtime Worker of `consumers.groups.build_worker` consumes: the stage's topics, its
    retry topic (assigned to the `<group>.retry` consumer), and commits on both groups."""
    gid = group_id(stage.name)
    for topic in [*stage.topics, retry_topic(gid)]:
        assert may(stage.name, T, topic, R), topic
    for group in (gid, retry_group_id(gid)):
        assert may(stage.name, G, group, R), group
    for topic in (retry_topic(gid), dead_letter_topic(gid), stage.result_topic):
        assert may(stage.name, T, topic, W), topic


def test_the_sink_reads_what_it_declares_and_writes_no_event() -> None:
    for topic in [*SinkTopics.declared().all, retry_topic(group_id(WAREHOUSE))]:
        assert may(WAREHOUSE, T, topic, R), topic
    writes = {a.name for a in PLAN[WAREHOUSE] if a.operation == W}
    assert writes == {retry_topic(group_id(WAREHOUSE)), dead_letter_topic(group_id(WAREHOUSE))}


def test_analytics_reads_its_sources_and_writes_its_outputs() -> None:
    """The topics of consumers.analytics.app (its sources and clock read, its rollups written) and
    faust's own: the changelog and the assignor's leader topic, named after the app id."""
    for role, topic in DECLARED_TOPICS.items():
        assert may(ANALYTICS, T, topic, W if role == "rollups" else R), (role, topic)
    assert may(ANALYTICS, T, ANALYTICS_CLOCK, W)
    for internal in ("docstream.analytics-rollup-state-changelog", "docstream.analytics-__assignor-__leader"):
        for operation in (Operation.CREATE, R, W, D):
            assert may(ANALYTICS, T, internal, operation)
    assert not may(ANALYTICS, T, "docstream.analyticsX", Operation.CREATE)  # the prefix ends with '-'


def test_the_api_reads_what_status_shows_and_may_not_consume_for_a_group() -> None:
    """Status needs doc.ocr.done (a stage's completion is what status shows), so the API reads it;
    it describes the groups it samples but may not join or commit for any of them."""
    reads = {a.name for a in PLAN[API] if a.resource == T and a.operation == R}
    assert reads == set(followed_topics())
    assert may(API, T, "doc.ocr.done", R)
    assert {a.name for a in PLAN[API] if a.resource == T and a.operation == W} == {DOC_UPLOADED}
    assert not [a for a in PLAN[API] if a.resource == G and a.operation != D]
    described = {a.name for a in PLAN[API] if a.resource == G and a.pattern == L}
    assert described == {*(group_id(g) for g in API_WATCHED), LAG_MONITOR_READER_GROUP}
    assert not may(API, T, ROLLUPS, R) and not may(API, G, "docstream.ocr", R)


def test_ops_may_not_move_the_analytics_offsets_nor_write_its_retry_topic() -> None:
    """Replay refuses the analytics group (its windows live in faust tables) and analytics has no
    retry path (docs/dead-letters.md): the grant says the same."""
    assert may(OPS, G, group_id(ANALYTICS), D)
    assert not may(OPS, G, group_id(ANALYTICS), R)
    assert not may(OPS, T, retry_topic(group_id(ANALYTICS)), W)


def test_no_binding_is_implied_by_another_of_the_same_principal() -> None:
    for principal, bindings in PLAN.items():
        for a in bindings:
            for b in bindings:
                same = (a.resource, a.name, a.pattern) == (b.resource, b.name, b.pattern)
                assert not (same and a != b and acls._implies(b.operation, a.operation)), (principal, a, b)


def test_the_group_prefix_names_every_group_and_its_topics() -> None:
    acme = plan("acme.")
    assert (G, L, "acme.ocr", R) in rows("ocr", acme)
    assert (T, L, "acme.ocr.retry", W) in rows("ocr", acme)
    assert (T, P, "acme.analytics-", Operation.CREATE) in rows("analytics", acme)
    assert (T, L, "acme.ocr.dlq", R) in rows(WAREHOUSE, acme)
    fixed = {LAG_MONITOR_READER_GROUP}  # the code names it without the prefix
    named = {a.name for a in acls.bindings(acme) if a.name.startswith("docstream.")}
    assert named <= fixed


# -- the names the plan shares with the code ------------------------------------------------------


READER_CALLS = {"reader_config": 1, "read_topic": 2}  # docstream.kafka.ranges: the position of `name`


def _reader_names() -> dict[str, str]:
    """Every reader name given as a literal to docstream.kafka.ranges in the tree -> its module."""
    found: dict[str, str] = {}
    for path in [*(ROOT / "docstream").rglob("*.py"), *(ROOT / "consumers").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            called = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if called in READER_CALLS:
                for arg in node.args[READER_CALLS[called] : READER_CALLS[called] + 1]:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        found[arg.value] = str(path.relative_to(ROOT))
    return found


# The principal that runs each throwaway reader (None: only inside `docstream up` / demo, one process
# for everything, which connects as the super user or to a broker without ACLs).
READERS = {
    "api-probe": API,
    "api-health": API,
    "api-tracker": API,
    "api-tracker-ends": API,
    "dlq-reader": OPS,
    "replay-reader": OPS,
    "results-reader": OPS,  # the stage results an operator reads (consumers.ops.pipeline.stage_results)
}


def test_every_throwaway_reader_of_the_code_is_known_and_granted() -> None:
    """A reader joins no group but librdkafka still looks its group's coordinator up (FindCoordinator
    needs DESCRIBE): each reader name in the code must be granted to the principal that runs it."""
    assert set(_reader_names()) == set(READERS), _reader_names()
    for name, principal in READERS.items():
        group = f"docstream-{name}-0123abcd"
        holders = {p for p in PLAN if grants(EVERY, p, G, group, D)}
        assert holders == ({principal} if principal else set()), name


def test_the_fixed_group_ids_are_the_codes() -> None:
    assert acls.LAG_MONITOR_GROUP == LAG_MONITOR_READER_GROUP
    offsets = (ROOT / "consumers/ops/replay/offsets.py").read_text()
    assert '"group.id": f"docstream-replay-probe-{' in offsets
    readback = (ROOT / "consumers/analytics/readback.py").read_text()
    assert '"group.id": f"{self._group}.read-back"' in readback
    side = (ROOT / "consumers/ops/replay/side.py").read_text()
    assert 'side_group = f"{live}.side.{plan.side}-' in side


def test_nothing_in_the_code_sets_a_transactional_id() -> None:
    """Hence no TRANSACTIONAL_ID grant: idempotent producers need WRITE on their topics only."""
    pattern = re.compile(r"transactional[._]id")
    offenders = [
        str(p.relative_to(ROOT))
        for package in ("docstream", "consumers", "producers", "infra")
        for p in (ROOT / package).rglob("*.py")
        if pattern.search(p.read_text()) and p.name != "acls.py"
    ]
    assert offenders == []


# -- Kafka's matching rules, as `grants` applies them -----------------------------------------------


@pytest.mark.parametrize(
    ("binding", "asked", "allowed"),
    [
        (Acl("u", T, "a.b", L, R), (T, "a.b", R), True),
        (Acl("u", T, "a.b", L, R), (T, "a.b", D), True),  # READ implies DESCRIBE
        (Acl("u", T, "a.b", L, R), (T, "a.b", W), False),
        (Acl("u", T, "a.b", L, R), (T, "a.bc", R), False),  # a literal is exact
        (Acl("u", T, "a.", P, W), (T, "a.bc", W), True),
        (Acl("u", T, "a.", P, W), (T, "b.a.", W), False),
        (Acl("u", T, "*", L, R), (T, "anything", R), True),
        (Acl("u", T, "a", L, Operation.ALTER_CONFIGS), (T, "a", Operation.DESCRIBE_CONFIGS), True),
        (Acl("u", T, "a", L, D), (T, "a", R), False),
        (Acl("u", G, "a", L, R), (T, "a", R), False),  # another resource type
        (Acl("u", T, "a", L, Operation.ALL), (T, "a", Operation.CREATE), True),
    ],
)
def test_a_binding_covers_what_kafka_would_allow(binding: Acl, asked: tuple[Any, ...], allowed: bool) -> None:
    assert binding.covers(*asked) is allowed
    assert grants([binding], "someone else", *asked) is False


def test_an_unknown_principal_is_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="unknown principal 'nobody': choose one of admin, ocr"):
        acls.for_principal(PLAN, "nobody")


# -- the apply edge against a fake AdminClient ---------------------------------------------------------


def _done(value: Any = None, error: BaseException | None = None) -> concurrent.futures.Future[Any]:
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)
    return future


class FakeAdmin:
    """The three ACL calls of an AdminClient over a list of bindings (confluent_kafka's own types)."""

    def __init__(self, existing: list[AclBinding] | None = None, error: int | None = None) -> None:
        self.bindings = list(existing or [])
        self.error = error
        self.calls: list[str] = []

    def _failure(self) -> BaseException | None:
        return KafkaException(ConfluentKafkaError(self.error)) if self.error is not None else None

    def describe_acls(self, _filter: Any, request_timeout: float) -> concurrent.futures.Future[Any]:
        self.calls.append("describe")
        return _done(list(self.bindings), self._failure())

    def create_acls(self, bindings: list[AclBinding], request_timeout: float) -> dict[Any, Any]:
        self.calls.append("create")
        self.bindings += bindings
        return {b: _done() for b in bindings}

    def delete_acls(self, filters: list[Any], request_timeout: float) -> dict[Any, Any]:
        self.calls.append("delete")
        keys = [_key(f) for f in filters]
        self.bindings = [b for b in self.bindings if _key(b) not in keys]
        return {f: _done([]) for f in filters}

    def list_topics(self, timeout: float) -> Any:
        return type("Metadata", (), {"topics": dict.fromkeys(["doc.uploaded", "doc.ocr.done"])})()


def _key(b: Any) -> tuple[Any, ...]:
    return (b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type)


def _binding(principal: str, name: str, operation: AclOperation, permission: Any = None) -> AclBinding:
    return AclBinding(
        ResourceType.TOPIC,
        name,
        ResourcePatternType.LITERAL,
        principal,
        "*",
        operation,
        permission or AclPermissionType.ALLOW,
    )


OCR_PLAN = {"ocr": PLAN["ocr"]}


def test_apply_creates_what_is_missing_and_a_second_run_creates_nothing() -> None:
    admin = FakeAdmin()
    first = cluster_acls.apply({}, PLAN["ocr"], admin=admin)
    assert set(first.created) == set(PLAN["ocr"]) and first.present == () and first.removed == ()
    second = cluster_acls.apply({}, PLAN["ocr"], admin=admin)
    assert second.created == () and set(second.present) == set(PLAN["ocr"])
    assert admin.calls == ["describe", "create", "describe"]


def test_a_dry_run_changes_nothing() -> None:
    admin = FakeAdmin()
    report = cluster_acls.apply({}, PLAN["ocr"], dry_run=True, prune=True, admin=admin)
    assert report.dry_run and len(report.created) == len(PLAN["ocr"])
    assert admin.calls == ["describe"] and admin.bindings == []


def test_prune_removes_only_the_managed_principals_extra_allow_bindings() -> None:
    stray = _binding("User:ocr", "doc.embedded", AclOperation.WRITE)
    others = [
        _binding("User:someone", "doc.embedded", AclOperation.WRITE),  # not a managed principal
        _binding("User:ocr", "doc.embedded", AclOperation.READ, AclPermissionType.DENY),  # a DENY
    ]
    admin = FakeAdmin([stray, *others])
    kept = cluster_acls.apply({}, PLAN["ocr"], admin=admin)
    assert kept.removed == () and stray in admin.bindings  # without prune nothing goes
    report = cluster_acls.apply({}, PLAN["ocr"], prune=True, principals=list(PRINCIPALS), admin=admin)
    assert [(a.principal, a.name, a.operation) for a in report.removed] == [("ocr", "doc.embedded", W)]
    assert stray not in admin.bindings and all(b in admin.bindings for b in others)


def test_the_bindings_written_are_kafkas_names_for_them() -> None:
    admin = FakeAdmin()
    cluster_acls.apply({}, PLAN["analytics"], admin=admin)
    written = {(b.restype, b.name, b.resource_pattern_type, b.principal, b.operation) for b in admin.bindings}
    assert (
        ResourceType.TOPIC,
        "docstream.analytics-",
        ResourcePatternType.PREFIXED,
        "User:analytics",
        AclOperation.CREATE,
    ) in written
    assert all(b.permission_type == AclPermissionType.ALLOW and b.host == "*" for b in admin.bindings)


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (ConfluentKafkaError.SECURITY_DISABLED, "the broker has no authorizer \\(SECURITY_DISABLED\\)"),
        (
            ConfluentKafkaError.CLUSTER_AUTHORIZATION_FAILED,
            "refused for principal User:ocr \\(CLUSTER_AUTHORIZATION_FAILED\\): ACLs are managed by the "
            "super user `admin`: set DOCSTREAM_SASL_USERNAME=admin",
        ),
    ],
)
def test_kafkas_refusals_are_clear_configuration_errors(error: int, message: str) -> None:
    with pytest.raises(KafkaConfigError, match=message):
        cluster_acls.apply({"sasl.username": "ocr"}, PLAN["ocr"], admin=FakeAdmin(error=error))


def test_check_names_the_granted_topics_the_principal_cannot_see() -> None:
    missing = cluster_acls.check({}, PLAN["ocr"], admin=FakeAdmin())
    assert missing == ["docstream.ocr.dlq", "docstream.ocr.retry"]


# -- the command -------------------------------------------------------------------------------------

runner = CliRunner()


def test_plan_json_is_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCSTREAM_GROUP_PREFIX", "acme.")
    result = runner.invoke(app, ["acls", "plan", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["group_prefix"] == "acme."
    assert set(document["principals"]) == set(PRINCIPALS)
    assert document["principals"][ADMIN] == []
    assert document["principals"]["ocr"] == [a.as_dict() for a in plan("acme.")["ocr"]]
    assert {"principal": "ocr", "name": "acme.ocr", "operation": "READ"}.items() <= next(
        row for row in document["principals"]["ocr"] if row["resource"] == "GROUP"
    ).items()


def test_plan_of_one_principal_and_of_an_unknown_one() -> None:
    one = runner.invoke(app, ["acls", "plan", "--principal", "api", "--json"])
    assert one.exit_code == 0 and list(json.loads(one.stdout)["principals"]) == ["api"]
    table = runner.invoke(app, ["acls", "plan", "-p", "ocr"])
    assert table.exit_code == 0 and "docstream.ocr.retry" in table.output and "User:ocr" in table.output
    unknown = runner.invoke(app, ["acls", "plan", "--principal", "nobody"])
    assert unknown.exit_code == 2 and "unknown principal 'nobody'" in unknown.output


def test_check_without_a_principal_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DOCSTREAM_SASL_USERNAME", "KAFKA_SASL_USERNAME"):
        monkeypatch.delenv(name, raising=False)
    result = runner.invoke(app, ["acls", "check"])
    assert result.exit_code == 2 and "DOCSTREAM_SASL_USERNAME" in result.output


def test_the_plan_loads_no_kafka_client() -> None:
    """docstream.acls is pure: the CLI's `plan` and the docs need no librdkafka."""
    code = "import sys, docstream.acls; print('confluent_kafka' in sys.modules)"
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "False"


def test_the_security_page_carries_the_plan_as_generated() -> None:
    """docs/security.md, "ACLs": the tables are `docstream acls plan --markdown`'s, unedited."""
    page = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    assert "## ACLs" in page
    assert acls.markdown(plan()) in page
