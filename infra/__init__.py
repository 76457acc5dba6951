"""Infrastructure as code: the local Kafka broker (`infra.broker`) and the topics (`infra.topics`).

Nothing here runs in a worker's hot path; these modules are driven by `docstream broker ...`,
`docstream topics ...` and the test fixtures.
"""
