"""Infrastructure as code: the local Kafka broker (`infra.broker`) and the topics (`infra.topics`).

The broker stands on `infra.server_properties` (its rendered config), `infra.jars` (its jars from
Maven Central) and `infra.processes` (the JVM spawned, found by pid, signalled); `infra.cluster`
runs one or more of them.

Nothing here runs in a worker's hot path; these modules are driven by `docstream broker ...`,
`docstream topics ...` and the test fixtures.
"""
