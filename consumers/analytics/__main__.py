"""`python -m consumers.analytics worker -l info`: run the analytics faust worker.

Settings come from the environment (DOCSTREAM_* / KAFKA_BOOTSTRAP_SERVERS, docstream.settings);
the faust app id is the analytics group id (`docstream.analytics` by default). The topics it reads
and analytics.rollups must exist (`docstream topics`); faust creates only its internal topics.
It connects as every docstream client does: DOCSTREAM_SECURITY_PROTOCOL, DOCSTREAM_SASL_* and
DOCSTREAM_SSL_* reach faust as its broker credentials (consumers.analytics.credentials).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

from consumers.analytics.app import make_app
from docstream.errors import DocstreamError
from docstream.kafka.clients import check_credentials
from docstream.kafka.config import connection_config
from docstream.settings import load_settings
from docstream.topology import ANALYTICS, dead_letter_topic, group_id
from docstream.validation import Limits
from infra.topics import cluster_replication
from schemas.codec import make_codec

RETRY_S = 5.0
logger = logging.getLogger("docstream.analytics")


def main() -> None:
    settings = load_settings()
    connection = connection_config(settings)
    await_cluster(connection)
    app = make_app(
        group_id(ANALYTICS, settings.group_prefix),
        connection,
        partitions=settings.topic_partitions,
        codec=make_codec(settings.schema_registry_url),
        grace_ms=settings.analytics.grace_ms,
        lateness_ms=settings.analytics.lateness_ms,
        window_sizes_ms=settings.analytics.window_sizes_ms,
        limits=Limits.from_settings(settings),
        dead_letters=dead_letter_topic(group_id(ANALYTICS, settings.group_prefix)),
        idle_ms=settings.analytics.idle_ms,
        session_timeout_s=settings.runtime.session_timeout_ms / 1000,  # as every group's members
        commit_interval_s=settings.runtime.commit_interval_ms / 1000,  # as every group commits
        datadir=str(settings.home / "analytics"),
        # its changelog topics replicated as docstream's own (one per broker up to 3, or the setting)
        replication_factor=cluster_replication(connection, settings.replication_factor).factor,
    )
    app.main()  # faust's command line: `worker`, `-l info`, ...


def await_cluster(connection: Mapping[str, Any]) -> None:
    """Until the cluster answers and takes the credentials (`check_credentials`): a worker started
    before its broker, or with a password the broker does not know yet, waits instead of dying
    in faust's start-up. One line when it cannot connect, saying what to fix; one when it can."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s"))
    logger.addHandler(handler)  # faust sets the process's logging up only once it runs
    logger.setLevel(logging.INFO)
    logger.propagate = False
    waiting_since = None
    try:
        while True:
            try:
                check_credentials(connection)
                break
            except DocstreamError as exc:
                if waiting_since is None:
                    waiting_since = time.monotonic()
                    logger.error(
                        "cannot connect to Kafka: %s; retrying every %.0f s, quiet until it works",
                        exc,
                        RETRY_S,
                    )
                time.sleep(RETRY_S)
        if waiting_since is not None:
            logger.info("connected to Kafka after %.0f s", time.monotonic() - waiting_since)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


if __name__ == "__main__":
    main()
