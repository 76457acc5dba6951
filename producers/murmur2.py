"""Kafka's Java key hash and partition choice, in pure Python.

A port of `org.apache.kafka.common.utils.Utils.murmur2` (MurmurHash2, seed 0x9747b28c,
signed 32-bit results) and of the Java producer's keyed partition choice,
`toPositive(murmur2(key)) % partitions`. librdkafka's `murmur2_random` partitioner computes
the same thing; this module lets tools and tests predict a key's partition without a broker
(for instance to find which partition, and so which worker, owns a document).
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK = 0xFFFFFFFF


def _to_signed(value: int) -> int:
    """A 32-bit pattern read as Java reads an `int`."""
    return value - (1 << 32) if value & 0x80000000 else value


def _mix_tail(h: int, tail: bytes) -> int:
    """The Java switch on `length % 4` (with its fall-through) for the last 0-3 bytes."""
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * _M) & _MASK
    return h


def murmur2(data: bytes) -> int:
    """Java's `Utils.murmur2(data)`: a signed 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    body = length - length % 4
    for i in range(0, body, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> _R
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    h = _mix_tail(h, data[body:])
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return _to_signed(h)


def to_positive(value: int) -> int:
    """Java's `Utils.toPositive`: clear the sign bit (not `abs`, which overflows for MIN_VALUE)."""
    return value & 0x7FFFFFFF


def java_partition(key: bytes, partitions: int) -> int:
    """The partition a Java producer (and librdkafka's murmur2_random) picks for a non-null key."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return to_positive(murmur2(key)) % partitions
