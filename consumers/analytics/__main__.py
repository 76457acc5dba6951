"""`python -m consumers.analytics worker -l info`: run the analytics faust worker.

Settings come from the environment (DOCSTREAM_* / KAFKA_BOOTSTRAP_SERVERS, docstream.settings);
the faust app id is the analytics group id (`docstream.analytics` by default). The topics it reads
and analytics.rollups must exist (`docstream topics`); faust creates only its internal topics.
It connects as every docstream client does: DOCSTREAM_SECURITY_PROTOCOL, DOCSTREAM_SASL_* and
DOCSTREAM_SSL_* reach faust as its broker credentials (consumers.analytics.credentials).
"""

from __future__ import annotations

from consumers.analytics.app import make_app
from docstream.kafka.config import connection_config
from docstream.settings import load_settings
from docstream.topology import ANALYTICS, dead_letter_topic, group_id
from docstream.validation import Limits
from infra.topics import cluster_replication
from schemas.codec import make_codec


def main() -> None:
    settings = load_settings()
    connection = connection_config(settings)
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
        datadir=str(settings.home / "analytics"),
        # its changelog topics replicated as docstream's own (one per broker up to 3, or the setting)
        replication_factor=cluster_replication(connection, settings.replication_factor).factor,
    )
    app.main()  # faust's command line: `worker`, `-l info`, ...


if __name__ == "__main__":
    main()
