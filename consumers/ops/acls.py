"""A plan's ACLs on a cluster: `apply` creates the missing bindings, reports those already there and,
with `prune`, removes the managed principals' bindings the plan does not hold; `check` says which
topics of a grant the connected principal cannot see.

The Kafka edge of `docstream.acls` (the plan itself is pure data there). The AdminClient's
CreateAcls, DescribeAcls and DeleteAcls need the super user (`admin`) or ALTER / DESCRIBE on the
cluster, which no other principal holds. `apply` is idempotent: the cluster's bindings are read
first, and a second run creates nothing. Only ALLOW bindings of the managed principals (by default
those the plan names) are ever removed; anyone else's, and every DENY, are left alone.

Kafka's errors are translated here: a broker without an authorizer (SECURITY_DISABLED) and a
principal that may not manage ACLs (CLUSTER_AUTHORIZATION_FAILED) are `KafkaConfigError`s that say
what to change; anything else goes through `docstream.kafka.errors.translate`. A broker without an
authorizer answers DescribeAcls with an empty list (Kafka 4.1), so a dry run there reports every
binding as one to create; only the CreateAcls of a real run meets SECURITY_DISABLED.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # no __all__
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from docstream.acls import Acl, Operation, Pattern, Resource, granted_topics
from docstream.errors import KafkaConfigError, KafkaError
from docstream.kafka import clients
from docstream.kafka.errors import code, translate
from docstream.principals import ADMIN, kafka_principal

TIMEOUT_S = 30.0
USER = "User:"
ANY_NAME: Any = None  # a filter's "any" for a string field (confluent_kafka's stubs say str, it takes None)
# confluent_kafka names Kafka's CLUSTER resource BROKER (its resource name is kafka-cluster).
_TYPES = {
    Resource.TOPIC: ResourceType.TOPIC,
    Resource.GROUP: ResourceType.GROUP,
    Resource.CLUSTER: ResourceType.BROKER,
    Resource.TRANSACTIONAL_ID: ResourceType.TRANSACTIONAL_ID,
}
_RESOURCES = {kafka: ours for ours, kafka in _TYPES.items()}


@dataclass(frozen=True)
class ApplyReport:
    """What `apply` did (or, in a dry run, would do)."""

    created: tuple[Acl, ...]
    present: tuple[Acl, ...]
    removed: tuple[Acl, ...]  # only with prune
    dry_run: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "created": [a.as_dict() for a in self.created],
            "present": [a.as_dict() for a in self.present],
            "removed": [a.as_dict() for a in self.removed],
        }


def apply(
    connection: Mapping[str, Any],
    acls: Iterable[Acl],
    dry_run: bool = False,
    prune: bool = False,
    *,
    principals: Iterable[str] | None = None,
    timeout: float = TIMEOUT_S,
    admin: Any = None,
) -> ApplyReport:
    """Make the cluster hold `acls`: create the missing ones; with `prune`, delete the ALLOW
    bindings of `principals` (default: the principals `acls` name) that `acls` does not hold.
    `admin`: an AdminClient to use (default: one built from `connection`)."""
    wanted = {_identity(a): a for a in acls}
    managed = set(principals) if principals is not None else {a.principal for a in wanted.values()}
    admin = admin if admin is not None else clients.admin_client(dict(connection))
    existing = {_identity(a): a for a in _current(admin, connection, timeout) if a.principal in managed}
    created = tuple(a for key, a in wanted.items() if key not in existing)
    present = tuple(a for key, a in wanted.items() if key in existing)
    removed = tuple(a for key, a in existing.items() if key not in wanted) if prune else ()
    if not dry_run:
        _create(admin, connection, created, timeout)
        _delete(admin, connection, removed, timeout)
    return ApplyReport(created, present, removed, dry_run)


def check(
    connection: Mapping[str, Any], acls: Iterable[Acl], *, timeout: float = TIMEOUT_S, admin: Any = None
) -> list[str]:
    """The topics the bindings name that the connected principal does not see in the cluster's
    metadata (a topic not created yet, or a grant not applied yet): empty when all is in place."""
    admin = admin if admin is not None else clients.admin_client(dict(connection))
    try:
        visible = set(admin.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise _acl_error(exc, "reading the cluster's topics", connection) from exc
    return sorted(granted_topics(acls) - visible)


# -- the cluster's bindings -----------------------------------------------------------------------


def _identity(acl: Acl) -> tuple[str, Resource, str, Pattern, Operation, str]:
    return (acl.principal, acl.resource, acl.name, acl.pattern, acl.operation, acl.host)


def _current(admin: Any, connection: Mapping[str, Any], timeout: float) -> list[Acl]:
    """Every ALLOW binding of a `User:` principal on the cluster, as an `Acl` (others are skipped)."""
    every = AclBindingFilter(
        ResourceType.ANY,
        ANY_NAME,
        ResourcePatternType.ANY,
        ANY_NAME,
        ANY_NAME,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    try:
        found = admin.describe_acls(every, request_timeout=timeout).result(timeout=timeout)
    except KafkaException as exc:
        raise _acl_error(exc, "reading the cluster's ACLs", connection) from exc
    except concurrent.futures.TimeoutError as exc:
        raise KafkaError("reading the cluster's ACLs: no answer in time", retriable=True) from exc
    return [acl for acl in map(_from_binding, found) if acl is not None]


def _from_binding(binding: Any) -> Acl | None:
    """An `AclBinding` as an `Acl` (its fields are the enums; confluent_kafka types them wider)."""
    if binding.permission_type != AclPermissionType.ALLOW or not binding.principal.startswith(USER):
        return None
    try:
        return Acl(
            binding.principal.removeprefix(USER),
            _RESOURCES[binding.restype],
            binding.name,
            Pattern(binding.resource_pattern_type.name),
            Operation(binding.operation.name),
            binding.host,
        )
    except (KeyError, ValueError):  # a kind docstream never writes: not ours to manage
        return None


def _binding(acl: Acl) -> AclBinding:
    return AclBinding(
        _TYPES[acl.resource],
        acl.name,
        ResourcePatternType[acl.pattern.value],
        kafka_principal(acl.principal),
        acl.host,
        AclOperation[acl.operation.value],
        AclPermissionType.ALLOW,
    )


def _filter(acl: Acl) -> AclBindingFilter:
    exact = _binding(acl)
    return AclBindingFilter(
        exact.restype,
        exact.name,
        exact.resource_pattern_type,
        exact.principal,
        exact.host,
        exact.operation,
        exact.permission_type,
    )


def _create(admin: Any, connection: Mapping[str, Any], acls: tuple[Acl, ...], timeout: float) -> None:
    if acls:
        futures = admin.create_acls([_binding(a) for a in acls], request_timeout=timeout)
        _wait(futures.values(), "creating ACLs", connection, timeout)


def _delete(admin: Any, connection: Mapping[str, Any], acls: tuple[Acl, ...], timeout: float) -> None:
    if acls:
        futures = admin.delete_acls([_filter(a) for a in acls], request_timeout=timeout)
        _wait(futures.values(), "deleting ACLs", connection, timeout)


def _wait(futures: Iterable[Any], doing: str, connection: Mapping[str, Any], timeout: float) -> None:
    for future in futures:
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            raise _acl_error(exc, doing, connection) from exc
        except concurrent.futures.TimeoutError as exc:
            raise KafkaError(f"{doing}: no answer in time", retriable=True) from exc


def _acl_error(exc: KafkaException, doing: str, connection: Mapping[str, Any]) -> KafkaError:
    """A clear word for the two refusals an operator meets, librdkafka's otherwise."""
    found = code(exc)
    if found == ConfluentKafkaError.SECURITY_DISABLED:
        return KafkaConfigError(
            f"{doing}: the broker has no authorizer (SECURITY_DISABLED), so it keeps no ACLs: run the "
            "brokers with authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer "
            "(a secured local broker does, docs/security.md)"
        )
    if found == ConfluentKafkaError.CLUSTER_AUTHORIZATION_FAILED:
        user = connection.get("sasl.username") or "ANONYMOUS (no SASL user set)"
        return KafkaConfigError(
            f"{doing}: refused for principal User:{user} (CLUSTER_AUTHORIZATION_FAILED): ACLs are "
            f"managed by the super user `{ADMIN}`: set DOCSTREAM_SASL_USERNAME={ADMIN} and its "
            "DOCSTREAM_SASL_PASSWORD"
        )
    return translate(exc, doing)
