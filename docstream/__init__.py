"""docstream's shared core: settings, errors, the topic topology, Kafka client config,
the blob store and idempotency keys. Producers and consumers both import from here."""

__version__ = "0.1.0"
