"""Producers: the SDK upstream services use to publish documents and events.

- `producers.publisher`: `Publisher`, the durable keyed producer (and `publish_document`);
- `producers.events`: builds the `doc.uploaded` record (ids, trace context, content type);
- `producers.murmur2`: predicts a key's partition exactly as a Java producer picks it.

Nothing is imported here, so that the pure modules load without confluent-kafka.
"""
