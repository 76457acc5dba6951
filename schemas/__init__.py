"""docstream's event schemas and the code that reads and writes them.

One folder per event type, one Avro schema file per version (`doc_uploaded/v2.avsc` is version 2
of `doc.uploaded`). The modules:

- `catalog`: loads every shipped schema once, with its CRC-64-AVRO fingerprint.
- `codec`: turns events into bytes and back (Avro single-object encoding by default).
- `events`: the typed, frozen value of each event type (`DocUploaded`, `DocOcrDone` ...), with
  `from_record` / `to_record`; generated from the latest schemas by `generate`
  (`python -m schemas.generate`; a unit test fails when the two differ).
- `registry`: the same through a Confluent Schema Registry (imported only when one is configured).
- `wire`: what the two wire formats share: the headers, and a record written (compiled or checked).
- `compat`: the registry's compatibility rules, as a pure function (`docstream schemas check`).
- `avro`: schema parsing and the validity checks fastavro leaves out.
- `guard`: the record checks fastavro's writer leaves out (compiled once per schema).

Importing this package imports nothing else: pick the module you need.
"""
