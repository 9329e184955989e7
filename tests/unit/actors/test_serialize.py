"""Tests of danaus.actors._serialize: what travels as msgpack and what as pickle (plain
values, objects, call arguments), and the errors of what cannot travel. What travels out
of band (numpy arrays, bytes, tensors): test_serialize_oob.py; what both share:
serialize_kit.py."""

from __future__ import annotations

import enum
import pickle
import re
import threading
from typing import Any

import msgspec
import numpy as np
import pytest
import torch

from danaus.actors._serialize import dumps, dumps_args, loads
from danaus.errors import SerializationError

from .serialize_kit import BIG, WHAT, Point, assert_same, roundtrip, what

# ---------------------------------------------------------------- plain values


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -1,
        2**63 - 1,
        -(2**63),
        1.5,
        float("inf"),
        "",
        "héllo wörld",
        b"",
        b"\x00\xffbytes",
        [],
        [1, "a", [None, 2.5, [True]]],
        {},
        {"a": [1, 2], "b": {"c": b"x", "d": None}},
    ],
    ids=repr,
)
def test_plain_values_travel_unpickled_and_keep_their_types(value: object) -> None:
    out, pickled, parts, raw = roundtrip(value)

    assert pickled is False
    assert parts == []
    # The header holds msgpack of the value itself: any msgpack reader can decode it.
    assert_same(msgspec.msgpack.decode(raw), value)
    assert_same(out, value)


def test_plain_value_does_not_call_what() -> None:
    def boom() -> str:
        raise AssertionError("what() is only for error messages")

    raw, pickled, parts = dumps({"x": [1, 2, 3]}, boom)

    assert pickled is False
    assert loads(raw, pickled, parts, boom) == {"x": [1, 2, 3]}


class Color(enum.IntEnum):
    RED = 1


@pytest.mark.parametrize(
    "value",
    [
        (1, 2, "three"),
        {1, 2, 3},
        frozenset({"a"}),
        2**64,
        -(2**63) - 1,
        {1: "int key"},
        {"nested": (1, 2)},
        [1, (2, 3)],
        bytearray(b"abc"),
        b"x" * 5000,
        Color.RED,
        1 + 2j,
    ],
    ids=repr,
)
def test_values_msgpack_would_change_are_pickled_and_keep_their_types(value: object) -> None:
    out, pickled, _, _ = roundtrip(value)

    assert pickled is True
    assert_same(out, value)


def test_deeply_nested_list_is_pickled_and_round_trips() -> None:
    value: list[Any] = [1]
    for _ in range(20):
        value = [value]

    out, pickled, _, _ = roundtrip(value)

    assert pickled is True
    assert out == value


# ---------------------------------------------------------------- objects


def test_module_level_class_instance_round_trips() -> None:
    out, pickled, parts, _ = roundtrip({"p": Point(1, 2), "t": (Point(3, 4),)})

    assert pickled is True
    assert parts == []
    assert type(out["p"]) is Point
    assert out == {"p": Point(1, 2), "t": (Point(3, 4),)}


def test_lambda_round_trips_via_cloudpickle() -> None:
    offset = 10
    fn = lambda x: x + offset  # noqa: E731

    out, pickled, _, _ = roundtrip(fn)

    assert pickled is True
    assert callable(out)
    assert out(5) == 15


def test_class_defined_in_a_function_round_trips_via_cloudpickle() -> None:
    class Local:
        def __init__(self, v: int) -> None:
            self.v = v

        def double(self) -> int:
            return 2 * self.v

    # Plain pickle cannot store a class defined in a function.
    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(Local(3))

    out, pickled, _, _ = roundtrip(Local(21))

    assert pickled is True
    assert type(out).__name__ == "Local"
    assert out.v == 21
    assert out.double() == 42


def test_function_and_class_from_main_travel_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``__main__`` defines cannot be found by name in a proc: it must travel by value."""
    import __main__

    def triple(x: int) -> int:
        return 3 * x

    class Box:
        def __init__(self, v: int) -> None:
            self.v = v

    for obj, name in ((triple, "danaus_test_triple"), (Box, "DanausTestBox")):
        obj.__module__ = "__main__"
        obj.__qualname__ = name
        monkeypatch.setattr(__main__, name, obj, raising=False)
    raw, pickled, parts = dumps((triple, Box(5)), what)
    # The receiving process's __main__ has neither: a by-reference pickle fails to load.
    monkeypatch.delattr(__main__, "danaus_test_triple")
    monkeypatch.delattr(__main__, "DanausTestBox")

    fn, box = loads(raw, pickled, [bytearray(p) for p in parts], what)

    assert pickled is True
    assert fn(7) == 21
    assert type(box).__qualname__ == "DanausTestBox"
    assert box.v == 5


def test_unpicklable_object_raises_serialization_error_naming_what() -> None:
    with pytest.raises(SerializationError, match=re.escape(WHAT)) as info:
        dumps((1, threading.Lock()), what)

    assert "lock" in str(info.value)
    # Also a TypeError, so code that catches pickling's TypeError keeps working.
    assert isinstance(info.value, TypeError)


def test_unpicklable_object_next_to_a_large_array_raises_serialization_error() -> None:
    with pytest.raises(SerializationError, match=re.escape(WHAT)):
        dumps((np.zeros(BIG, dtype=np.uint8), threading.Lock()), what)


@pytest.mark.parametrize(
    ("raw", "pickled"),
    [
        (msgspec.msgpack.encode(b"this is not a pickle"), True),
        (msgspec.msgpack.encode(pickle.dumps({"a": 1}, protocol=5)[:-3]), True),
        (b"\xc1", False),  # 0xc1 is never valid msgpack
        (b"", False),
        (msgspec.msgpack.encode("a str, not pickle bytes"), True),
    ],
    ids=["garbage-pickle", "truncated-pickle", "bad-msgpack", "empty", "str-as-pickle"],
)
def test_corrupt_payload_raises_serialization_error_naming_what(raw: bytes, pickled: bool) -> None:
    with pytest.raises(SerializationError, match=re.escape(WHAT)):
        loads(raw, pickled, [], what)


def test_missing_out_of_band_part_raises_serialization_error() -> None:
    raw, pickled, parts = dumps(np.arange(BIG // 8, dtype=np.float64), what)
    assert len(parts) == 1

    with pytest.raises(SerializationError, match=re.escape(WHAT)):
        loads(raw, pickled, [], what)


# ---------------------------------------------------------------- call arguments


def roundtrip_args(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, bool, list[Any], bytes]:
    raw, pickled, parts = dumps_args(args, kwargs, what)
    value = loads(bytes(raw), pickled, [bytearray(p) for p in parts], what)
    return value, pickled, parts, bytes(raw)


def call_with(value: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What the receiving actor does with the decoded arguments."""
    args, kwargs = value

    def endpoint(*a: Any, **k: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return a, k

    return endpoint(*args, **kwargs)


def test_plain_arguments_travel_unpickled() -> None:
    def boom() -> str:
        raise AssertionError("what() is only for error messages")

    raw, pickled, parts = dumps_args((1, "a", [2.5, None], {"x": b"y"}), {"k": True}, boom)

    assert pickled is False
    assert parts == []
    args, kwargs = call_with(loads(raw, pickled, parts, boom))
    assert_same(list(args), [1, "a", [2.5, None], {"x": b"y"}])
    assert_same(kwargs, {"k": True})


def test_no_arguments_travel_unpickled() -> None:
    value, pickled, parts, _ = roundtrip_args((), {})

    assert pickled is False
    assert parts == []
    assert call_with(value) == ((), {})


@pytest.mark.parametrize(
    "arg",
    [(1, 2), {1, 2}, 2**64, -(2**63) - 1, Point(1, 2), b"x" * 5000],
    ids=repr,
)
def test_non_plain_arguments_are_pickled_and_keep_their_types(arg: Any) -> None:
    value, pickled, _, _ = roundtrip_args((1, arg), {"kw": arg})

    assert pickled is True
    args, kwargs = call_with(value)
    assert type(args[1]) is type(arg)
    assert args == (1, arg)
    assert kwargs == {"kw": arg}


def test_large_bytes_and_tensor_arguments_travel_out_of_band() -> None:
    blob = bytes(range(256)) * (BIG // 256)
    t = torch.arange(BIG // 4, dtype=torch.float32)

    value, pickled, parts, raw = roundtrip_args((blob,), {"t": t})

    assert pickled is True
    assert len(parts) == 2
    assert len(raw) < 1024
    args, kwargs = call_with(value)
    assert type(args[0]) is bytes
    assert args[0] == blob
    assert torch.equal(kwargs["t"], t)


def test_unpicklable_argument_raises_serialization_error_naming_what() -> None:
    with pytest.raises(SerializationError, match=re.escape(WHAT)):
        dumps_args((1,), {"lock": threading.Lock()}, what)
