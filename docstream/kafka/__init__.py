"""The Kafka edge: every Kafka client docstream builds, and every librdkafka error it translates.

config.py      librdkafka configuration dictionaries from the settings (connection, producer,
               consumer, watched)
clients.py     Consumer, Producer and AdminClient, built from settings or a connection dict
errors.py      `code(exc)` and the one translation of KafkaException into docstream.errors
connection.py  `ConnectionWatch`: librdkafka's logs and errors in, one outage line out
ranges.py      the bounded range reader: fixed [start, end) offset ranges, no group, no commits

Part of the shared core: it imports docstream's settings and errors, never the consumers,
producers, infra or the CLI.
"""
