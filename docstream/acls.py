"""Each principal's Kafka ACLs, derived from the declared topology: least privilege as data.

Pure, no Kafka: `plan(prefix)` gives every principal of `docstream.principals` the bindings its
code needs and nothing else (`consumers.ops.acls` writes them to a cluster; `docstream acls plan`
prints them; docs/security.md, "ACLs", explains each). A binding is an `Acl`: principal, resource
(TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID), name, pattern (LITERAL, PREFIXED), operation, ALLOW,
with `why` (not part of its identity) saying which code needs it.

What the code does, and so what each principal needs (Kafka's rules: READ, WRITE, DELETE and ALTER
imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS; `grants` applies them):

- a stage group (`docstream worker NAME`, consumers.runtime.Worker): subscribes its group to its
  inputs; a second consumer, group `<group>.retry`, is assigned its retry topic and commits there;
  one idempotent producer writes results, retries and dead letters. Idempotence needs WRITE on a
  topic only (KIP-679, Kafka 3.0+), no IDEMPOTENT_WRITE on the cluster; nothing in docstream sets a
  `transactional.id` (faust runs at_least_once), so no TRANSACTIONAL_ID grant exists;
- the warehouse sink: the same Worker over `group_inputs` (the result topics, analytics.rollups and
  the dead-letter topics it keeps), with its own retry and dead-letter topics and no result topic;
- analytics (faust, consumers/analytics): its group reads the sources and analytics.clock; it
  writes rollups, ticks and its dead letters; faust creates, reads and writes its own topics
  (`<app id>-rollup-state-changelog`, `<app id>-__assignor-__leader`), hence the PREFIXED grant on
  `<app id>-`; the read-back (readback.py) assigns partitions under `<app id>.read-back` and never
  commits: DESCRIBE (librdkafka looks up the coordinator of any configured group id);
- api: writes doc.uploaded (publisher, outbox relay); its tracker reads what status shows
  (`docstream.api.registry_updates.followed_topics`: uploads, every stage's completions, and the
  dead-letter and retry topics of `DEAD_LETTERED_GROUPS`), so it does read doc.ocr.done; admission's
  lag sampler describes the groups a document goes through and their committed offsets (DESCRIBE,
  never READ on a group: the API cannot join or commit for a worker's group);
- ops: the operators' commands (`docstream lag`, `exporter`, `dlq`, `replay`, `publish`,
  `topics describe`, `acls check`); the broadest principal, never a CLUSTER right, see `_ops`.

Group ids that never join a group still need DESCRIBE: the throwaway readers
(`docstream.kafka.ranges.reader_config`: `docstream-<name>-<uuid>`) are granted by their name's
prefix, and the lag monitor's reader by its fixed id. tests/unit/test_acls.py checks these names
against the code that makes them.

`admin` is the brokers' super user (`super.users`): it needs no binding and gets none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from docstream.errors import ConfigurationError
from docstream.principals import ADMIN, API, OPS, PRINCIPALS
from docstream.topology import (
    ANALYTICS,
    ANALYTICS_CLOCK,
    DEAD_LETTERED_GROUPS,
    DOC_UPLOADED,
    GROUPS,
    ROLLUPS,
    STAGES,
    GroupSpec,
    dead_letter_topic,
    declared_topics,
    group_id,
    group_inputs,
    retry_group_id,
    retry_topic,
)

CLUSTER_NAME = "kafka-cluster"  # the one name of Kafka's CLUSTER resource
READER_PREFIX = "docstream-"  # a throwaway reader's group id: docstream-<name>-<uuid> (reader_config)
LAG_MONITOR_GROUP = "docstream.lag-monitor"  # consumers.lag.reader.LAG_MONITOR_READER_GROUP
API_READERS = "api"  # the API's readers: api-probe, api-health, api-tracker, api-tracker-ends
OPS_READERS = ("dlq-reader", "replay-reader", "replay-probe", "results-reader")  # dlq, replay, results
SIDE = ".side."  # a side replay's group and retry topic: <group>.side.<name>-<run>
READ_BACK = ".read-back"  # analytics' read-back reader: <app id>.read-back (consumers.analytics.readback)
FAUST_SEPARATOR = "-"  # faust names its own topics <app id>-<name>


class Resource(StrEnum):
    TOPIC = "TOPIC"
    GROUP = "GROUP"
    CLUSTER = "CLUSTER"
    TRANSACTIONAL_ID = "TRANSACTIONAL_ID"


class Pattern(StrEnum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


class Operation(StrEnum):
    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DELETE = "DELETE"
    ALTER = "ALTER"
    DESCRIBE = "DESCRIBE"
    DESCRIBE_CONFIGS = "DESCRIBE_CONFIGS"
    ALTER_CONFIGS = "ALTER_CONFIGS"
    IDEMPOTENT_WRITE = "IDEMPOTENT_WRITE"
    CLUSTER_ACTION = "CLUSTER_ACTION"
    ALL = "ALL"


# Kafka's implications (org.apache.kafka.common.acl.AclOperation's docs): holding one of these
# grants DESCRIBE (or DESCRIBE_CONFIGS) on the same resource too.
IMPLIES_DESCRIBE = frozenset({Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER})
IMPLIES_DESCRIBE_CONFIGS = frozenset({Operation.ALTER_CONFIGS})


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW binding for the SCRAM user `principal` (Kafka's principal `User:<principal>`)."""

    principal: str
    resource: Resource
    name: str
    pattern: Pattern
    operation: Operation
    host: str = "*"
    why: str = field(default="", compare=False)

    def covers(self, resource: Resource, name: str, operation: Operation) -> bool:
        """Whether this binding allows `operation` on the resource `name`, as Kafka decides."""
        if self.resource != resource:
            return False
        named = self.name in (name, "*") if self.pattern == Pattern.LITERAL else name.startswith(self.name)
        return named and _implies(self.operation, operation)

    def as_dict(self) -> dict[str, str]:
        return {
            "principal": self.principal,
            "resource": self.resource.value,
            "name": self.name,
            "pattern": self.pattern.value,
            "operation": self.operation.value,
            "permission": "ALLOW",
            "host": self.host,
            "why": self.why,
        }


def _implies(held: Operation, wanted: Operation) -> bool:
    if held in (wanted, Operation.ALL):
        return True
    if wanted == Operation.DESCRIBE:
        return held in IMPLIES_DESCRIBE
    return wanted == Operation.DESCRIBE_CONFIGS and held in IMPLIES_DESCRIBE_CONFIGS


Plan = dict[str, tuple[Acl, ...]]  # principal -> its bindings, every principal of PRINCIPALS


def plan(prefix: str = "docstream.") -> Plan:
    """Every principal's bindings for groups named with `prefix` (settings.group_prefix)."""
    out: Plan = {ADMIN: ()}
    for spec in GROUPS:
        out[spec.name] = _group(spec, prefix)
    out[API] = _api(prefix)
    out[OPS] = _ops(prefix)
    return {name: out[name] for name in PRINCIPALS}


def bindings(grants: Mapping[str, Iterable[Acl]]) -> list[Acl]:
    """Every binding of a plan, principal by principal."""
    return [acl for acls in grants.values() for acl in acls]


def for_principal(grants: Plan, name: str) -> Plan:
    """The plan of one principal; a ConfigurationError naming the choices otherwise."""
    if name not in grants:
        raise ConfigurationError(f"unknown principal {name!r}: choose one of {', '.join(grants)}")
    return {name: grants[name]}


def grants(acls: Iterable[Acl], principal: str, resource: Resource, name: str, operation: Operation) -> bool:
    """Whether `principal` may do `operation` on `name` under `acls` (no DENY bindings exist here)."""
    return any(a.principal == principal and a.covers(resource, name, operation) for a in acls)


def granted_topics(acls: Iterable[Acl]) -> set[str]:
    """The literal topic names the bindings name (a principal sees these in the cluster's metadata)."""
    return {a.name for a in acls if a.resource == Resource.TOPIC and a.pattern == Pattern.LITERAL}


def declared_topic_names(prefix: str = "docstream.") -> set[str]:
    return {spec.name for spec in declared_topics(prefix=prefix)}


def markdown(grants: Plan) -> str:
    """The plan as Markdown tables, one per principal (docs/security.md carries this text)."""
    out: list[str] = []
    for principal, acls in grants.items():
        if not acls:
            out += [f"**{principal}**: the brokers' super user (`super.users`), no binding.", ""]
            continue
        out += [f"**{principal}** (`User:{principal}`, {len(acls)} bindings)", ""]
        out += ["| resource | pattern | name | operation | why |", "|---|---|---|---|---|"]
        out += [f"| {a.resource} | {a.pattern} | `{a.name}` | {a.operation} | {a.why} |" for a in acls]
        out.append("")
    return "\n".join(out)


# -- the principals ------------------------------------------------------------------------------


class _Grant:
    """Collects one principal's bindings; the same binding asked twice keeps both reasons."""

    def __init__(self, principal: str) -> None:
        self.principal = principal
        self._why: dict[Acl, list[str]] = {}

    def add(
        self,
        resource: Resource,
        names: Iterable[str],
        operations: Iterable[Operation],
        why: str,
        pattern: Pattern = Pattern.LITERAL,
    ) -> None:
        for name in names:
            for operation in operations:
                reasons = self._why.setdefault(Acl(self.principal, resource, name, pattern, operation), [])
                if why not in reasons:
                    reasons.append(why)

    def acls(self) -> tuple[Acl, ...]:
        """The bindings, without those another binding on the same resource implies (DESCRIBE
        beside READ ...): their reasons go to the binding that implies them."""
        why = {acl: list(reasons) for acl, reasons in self._why.items()}
        for acl in list(why):
            stronger = [
                other
                for other in why
                if other != acl
                and (other.resource, other.name, other.pattern) == (acl.resource, acl.name, acl.pattern)
                and _implies(other.operation, acl.operation)
            ]
            if stronger:
                why[stronger[0]] += [r for r in why.pop(acl) if r not in why[stronger[0]]]
        made = (
            Acl(a.principal, a.resource, a.name, a.pattern, a.operation, a.host, "; ".join(w))
            for a, w in why.items()
        )
        return tuple(sorted(made, key=_order))


def _order(acl: Acl) -> tuple[int, str, str, int]:
    return (
        list(Resource).index(acl.resource),
        acl.name,
        acl.pattern.value,
        list(Operation).index(acl.operation),
    )


R, W = Operation.READ, Operation.WRITE


def _group(spec: GroupSpec, prefix: str) -> tuple[Acl, ...]:
    """A worker group's grant: the runtime Worker's (stages, the sink) or faust's (analytics)."""
    gid = group_id(spec.name, prefix)
    grant = _Grant(spec.name)
    grant.add(Resource.TOPIC, group_inputs(spec, prefix), [R], "consumes its inputs")
    if spec.name == ANALYTICS:
        _analytics(grant, gid)
        return grant.acls()
    grant.add(
        Resource.TOPIC, [retry_topic(gid)], [R, W], "its retries: produced on failure, consumed when due"
    )
    grant.add(Resource.TOPIC, [dead_letter_topic(gid)], [W], "dead-letters what fails for good")
    grant.add(Resource.GROUP, [gid], [R], "joins its group and commits its offsets")
    grant.add(Resource.GROUP, [retry_group_id(gid)], [R], "commits its retry topic's offsets")
    results = [s.result_topic for s in STAGES if s.name == spec.name]
    grant.add(Resource.TOPIC, results, [W], "emits its completion events")
    return grant.acls()


def _analytics(grant: _Grant, gid: str) -> None:
    grant.add(
        Resource.TOPIC, [ANALYTICS_CLOCK], [R, W], "its idle ticks: produced when idle, folded in order"
    )
    grant.add(Resource.TOPIC, [ROLLUPS], [W], "emits the closed windows' rollups")
    grant.add(Resource.TOPIC, [dead_letter_topic(gid)], [W], "dead-letters what it cannot fold")
    grant.add(
        Resource.GROUP, [gid], [R], "faust's consumer group: joins, commits; idle check reads its offsets"
    )
    grant.add(Resource.GROUP, [gid + READ_BACK], [Operation.DESCRIBE], "read-back reader: assign() only")
    grant.add(
        Resource.TOPIC,
        [gid + FAUST_SEPARATOR],
        [Operation.CREATE, R, W],
        "faust's own topics (table changelog, assignor leader): created, read and written by faust",
        Pattern.PREFIXED,
    )


def _reader_group(name: str) -> str:
    return f"{READER_PREFIX}{name}-"


def _api(prefix: str) -> tuple[Acl, ...]:
    grant = _Grant(API)
    watched = [*(s.name for s in STAGES), ANALYTICS]  # docstream.api.service.GROUPS
    followed = [DOC_UPLOADED, *(s.result_topic for s in STAGES)]
    for g in DEAD_LETTERED_GROUPS:
        followed += [dead_letter_topic(group_id(g, prefix)), retry_topic(group_id(g, prefix))]
    grant.add(Resource.TOPIC, [DOC_UPLOADED], [W], "publishes uploads (publisher, outbox relay)")
    grant.add(Resource.TOPIC, followed, [R], "the tracker follows what a document's status shows")
    grant.add(
        Resource.GROUP,
        [group_id(g, prefix) for g in watched],
        [Operation.DESCRIBE],
        "admission's lag sampler: the group's state and committed offsets",
    )
    grant.add(Resource.GROUP, [LAG_MONITOR_GROUP], [Operation.DESCRIBE], "the lag sampler's record reader")
    grant.add(
        Resource.GROUP,
        [_reader_group(API_READERS)],
        [Operation.DESCRIBE],
        "the tracker's and the sampler's readers: assign() only, nothing committed",
        Pattern.PREFIXED,
    )
    return grant.acls()


def _ops(prefix: str) -> tuple[Acl, ...]:
    """The operators' commands. Broad by nature (it reads every docstream topic), narrow where it
    writes: uploads, the retry topics of the groups that read theirs, a stage's completions and
    dead letters during a side replay, and offsets of docstream's own groups (never analytics')."""
    grant = _Grant(OPS)
    ids = {spec.name: group_id(spec.name, prefix) for spec in GROUPS}
    runtime_groups = [spec for spec in GROUPS if spec.name != ANALYTICS]  # the runtime Worker's
    declared = sorted(declared_topic_names(prefix))
    why = "`docstream topics describe`, `docstream acls check`"
    grant.add(Resource.TOPIC, declared, [Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS], why)
    for spec in GROUPS:
        grant.add(
            Resource.TOPIC, group_inputs(spec, prefix), [R], "lag: dates the record at a committed offset"
        )
        grant.add(
            Resource.GROUP, [ids[spec.name]], [Operation.DESCRIBE], "lag: the group's state and offsets"
        )
        grant.add(Resource.TOPIC, [dead_letter_topic(ids[spec.name])], [R], "`docstream dlq list|show`")
        grant.add(Resource.TOPIC, [retry_topic(ids[spec.name])], [R], "`docstream dlq`: redrive status")
    grant.add(Resource.GROUP, [LAG_MONITOR_GROUP], [Operation.DESCRIBE], "lag: the record reader")
    grant.add(Resource.TOPIC, [DOC_UPLOADED], [W], "`docstream publish`: an operator's uploads")
    for spec in runtime_groups:
        gid = ids[spec.name]
        grant.add(Resource.TOPIC, [retry_topic(gid)], [W], "`docstream dlq redrive`")
        grant.add(
            Resource.GROUP, [gid], [R], "`docstream replay --execute`: moves the offsets of a stopped group"
        )
        grant.add(
            Resource.GROUP, [retry_group_id(gid)], [Operation.DESCRIBE], "replay: checks it has no members"
        )
    for stage in STAGES:
        gid, side = ids[stage.name], ids[stage.name] + SIDE
        why = "`docstream replay --side`: the stage's worker under its own group"
        grant.add(Resource.TOPIC, [stage.result_topic, dead_letter_topic(gid)], [W], why)
        grant.add(Resource.GROUP, [side], [R, Operation.DELETE], why + "; deleted after", Pattern.PREFIXED)
        grant.add(
            Resource.TOPIC,
            [side],
            [Operation.CREATE, R, W, Operation.DELETE, Operation.DESCRIBE_CONFIGS],
            why + ": the run's retry topic, created and deleted",
            Pattern.PREFIXED,
        )
    readers = [_reader_group(name) for name in OPS_READERS]
    grant.add(
        Resource.GROUP,
        readers,
        [Operation.DESCRIBE],
        "dlq, replay and results readers: assign() only",
        Pattern.PREFIXED,
    )
    return grant.acls()
