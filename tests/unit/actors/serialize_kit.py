"""What the serialization tests share: a round trip as a receiver makes it, a check of
equal values of the same types all the way down, and a class importable at module level."""

from __future__ import annotations

from typing import Any

from danaus.actors._serialize import dumps, loads

WHAT = "arguments of Foo.bar"

#: Larger than the default ``config.oob_threshold`` (64 KiB), so it travels out of band.
BIG = 1 << 20


def what() -> str:
    return WHAT


def roundtrip(obj: object) -> tuple[Any, bool, list[Any], bytes]:
    """dumps + loads as a receiver would: parts arrive as fresh, writable bytearrays.

    Returns (value, pickled, parts, msgpack header payload).
    """
    raw, pickled, parts = dumps(obj, what)
    received = [bytearray(p) for p in parts]
    return loads(bytes(raw), pickled, received, what), pickled, parts, bytes(raw)


def assert_same(a: object, b: object) -> None:
    """Equal, and of the same type all the way down (``True == 1`` is not enough)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, list):
        assert isinstance(b, list)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert isinstance(b, dict)
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    else:
        assert a == b


class Point:
    """A class at module level: importable, so plain pickle stores a reference."""

    def __init__(self, x: Any, y: Any) -> None:
        self.x = x
        self.y = y

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    __hash__ = None  # type: ignore[assignment]
