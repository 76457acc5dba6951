"""The principals of a secured cluster: one SCRAM user per declared group, the API, the operators'
tools and the administrator. Pure data, derived from `docstream.topology`.

A secured local broker (`docstream broker start --secure`) creates these users when it formats its
storage; `docstream acls plan` gives each the Kafka ACLs of its grant. A process authenticates as
one of them (DOCSTREAM_SASL_USERNAME / DOCSTREAM_SASL_PASSWORD): a worker as its group's user, the
sink as `warehouse`, the ingest API as `api`, an operator's command as `ops`. `admin` is the
brokers' own principal and the only super user: it creates topics and writes ACLs.
"""

from __future__ import annotations

from docstream.topology import GROUPS

ADMIN = "admin"
API = "api"
OPS = "ops"
GROUP_PRINCIPALS: tuple[str, ...] = tuple(spec.name for spec in GROUPS)
PRINCIPALS: tuple[str, ...] = (ADMIN, *GROUP_PRINCIPALS, API, OPS)


def kafka_principal(user: str) -> str:
    """The principal Kafka's authorizer sees for a SCRAM user (`ocr` -> `User:ocr`)."""
    return f"User:{user}"
