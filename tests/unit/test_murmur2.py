"""producers.murmur2 reproduces Java's Utils.murmur2 and the keyed partition choice."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from producers.murmur2 import java_partition, murmur2, to_positive

# (key, Utils.murmur2(key)): Kafka's own UtilsTest vectors, plus empty and odd-length keys,
# all checked against kafka-clients 4.1.1 by tests/integration/test_partitioning_java.py.
JAVA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
    (b"", 275646681),
]


@pytest.mark.parametrize(("key", "expected"), JAVA_VECTORS)
def test_murmur2_matches_java_vectors(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@pytest.mark.parametrize(
    ("key", "partitions", "expected"),
    [(b"21", 12, 0), (b"foobar", 12, 6), (b"a-little-bit-long-string", 12, 8), (b"abc", 12, 3), (b"", 12, 9)],
)
def test_java_partition_matches_java_vectors(key: bytes, partitions: int, expected: int) -> None:
    assert java_partition(key, partitions) == expected


def test_to_positive_clears_the_sign_bit_like_java() -> None:
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(2**31)) == 0  # where abs() would overflow in Java
    assert to_positive(12345) == 12345


def test_java_partition_rejects_no_partitions() -> None:
    with pytest.raises(ValueError, match="partitions"):
        java_partition(b"k", 0)


@given(st.binary(max_size=64))
def test_murmur2_is_a_signed_32_bit_int(key: bytes) -> None:
    assert -(2**31) <= murmur2(key) < 2**31


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_java_partition_is_in_range_and_deterministic(key: bytes, partitions: int) -> None:
    partition = java_partition(key, partitions)
    assert 0 <= partition < partitions
    assert java_partition(bytes(key), partitions) == partition


@given(st.binary(max_size=64))
def test_one_partition_takes_every_key(key: bytes) -> None:
    assert java_partition(key, 1) == 0
