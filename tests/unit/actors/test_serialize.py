"""Tests of danaus.actors._serialize: what travels as msgpack, as pickle, and out of band."""

from __future__ import annotations

import enum
import pickle
import re
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pytest
import torch

from danaus.actors._serialize import dumps, dumps_args, loads
from danaus.config import config
from danaus.errors import SerializationError

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


class Point:
    """A class at module level: importable, so plain pickle stores a reference."""

    def __init__(self, x: Any, y: Any) -> None:
        self.x = x
        self.y = y

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    __hash__ = None  # type: ignore[assignment]


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


# ---------------------------------------------------------------- out of band: numpy, bytes


def test_large_numpy_array_travels_out_of_band() -> None:
    arr = np.arange(BIG // 8, dtype=np.float64).reshape(256, -1)

    out, pickled, parts, raw = roundtrip(arr)

    assert pickled is True
    assert len(parts) == 1
    assert memoryview(parts[0]).nbytes == arr.nbytes
    assert len(raw) < 1024  # the pickle holds no copy of the data
    assert out.dtype == arr.dtype
    assert out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)
    out[0, 0] = -1.0  # the receiver's array is writable
    assert out[0, 0] == -1.0


def test_small_numpy_array_travels_in_band() -> None:
    arr = np.arange(10, dtype=np.int32)

    out, pickled, parts, _ = roundtrip(arr)

    assert pickled is True
    assert parts == []
    np.testing.assert_array_equal(out, arr)
    assert out.dtype == np.int32


def test_oob_threshold_setting_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    arr = np.arange(1024, dtype=np.uint8)  # 1 KiB: in band by default
    assert len(dumps(arr, what)[2]) == 0

    monkeypatch.setattr(config, "oob_threshold", 512)
    out, _, parts, _ = roundtrip(arr)

    assert len(parts) == 1
    np.testing.assert_array_equal(out, arr)


def test_several_large_values_keep_their_order() -> None:
    a = np.full(BIG, 1, dtype=np.uint8)
    b = torch.full((BIG // 4,), 2.0)
    c = np.full(BIG // 2, 3, dtype=np.int16)

    out, _, parts, raw = roundtrip({"a": a, "b": b, "c": c})

    assert len(parts) == 3
    assert len(raw) < 2048
    np.testing.assert_array_equal(out["a"], a)
    assert torch.equal(out["b"], b)
    np.testing.assert_array_equal(out["c"], c)


def test_large_bytes_in_args_tuple_travel_out_of_band() -> None:
    big = bytes(range(256)) * (BIG // 256)
    other = b"\x07" * (BIG // 2)
    args = ((1, big), {"blob": other, "small": b"s"})

    out, pickled, parts, raw = roundtrip(args)

    assert pickled is True
    assert len(parts) == 2
    assert sorted(memoryview(p).nbytes for p in parts) == [len(other), len(big)]
    assert len(raw) < 1024
    assert_same(out, args)


def test_large_bytes_alone_travel_out_of_band() -> None:
    big = b"\x01\x02" * (BIG // 2)

    out, _, parts, raw = roundtrip(big)

    assert len(parts) == 1
    assert len(raw) < 1024
    assert type(out) is bytes
    assert out == big


def test_large_bytes_in_a_list_travel_out_of_band() -> None:
    value = [b"\x05" * BIG, b"\x06" * BIG]

    out, _, parts, raw = roundtrip(value)

    assert out == value
    assert len(parts) == 2
    assert len(raw) < 1024


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


# ---------------------------------------------------------------- torch


def assert_same_tensor(out: Any, t: torch.Tensor) -> None:
    assert type(out) is type(t)
    assert out.dtype == t.dtype
    assert out.shape == t.shape
    assert out.requires_grad == t.requires_grad
    assert torch.equal(out.detach(), t.detach())


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.int64,
        torch.uint8,
        torch.bool,
        torch.complex64,
    ],
    ids=str,
)
def test_large_cpu_tensor_travels_out_of_band(dtype: torch.dtype) -> None:
    t = (torch.arange(BIG // 2) % 7).to(dtype).reshape(64, -1)
    assert t.numel() * t.element_size() >= config.oob_threshold

    out, pickled, parts, raw = roundtrip(t)

    assert pickled is True
    assert len(parts) == 1
    assert memoryview(parts[0]).nbytes == t.numel() * t.element_size()
    assert len(raw) < 1024
    assert_same_tensor(out, t)


def test_small_tensor_travels_in_band() -> None:
    t = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)

    out, pickled, parts, _ = roundtrip(t)

    assert pickled is True
    assert parts == []
    assert_same_tensor(out, t)


def test_bf16_values_are_bit_exact() -> None:
    t = torch.randn(BIG // 2, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)

    out, _, _, _ = roundtrip(t)

    assert out.dtype == torch.bfloat16
    assert torch.equal(out.view(torch.int16), t.view(torch.int16))


@pytest.mark.parametrize("size", [8, BIG // 4], ids=["small", "large"])
def test_non_contiguous_tensor_keeps_shape_and_values(size: int) -> None:
    base = torch.arange(size * 4, dtype=torch.float32).reshape(-1, 8)
    t = base.t()[:, ::2]
    assert not t.is_contiguous()

    out, _, _, _ = roundtrip(t)

    assert_same_tensor(out, t)


def test_contiguous_slice_sends_only_its_own_bytes() -> None:
    base = torch.arange(BIG // 2, dtype=torch.float32)
    t = base[1000 : 1000 + BIG // 8]

    out, _, parts, _ = roundtrip(t)

    assert memoryview(parts[0]).nbytes == t.numel() * 4
    assert_same_tensor(out, t)


@pytest.mark.parametrize("shape", [(0,), (0, 3), (4, 0, 2)], ids=str)
def test_empty_tensor_keeps_shape_and_dtype(shape: tuple[int, ...]) -> None:
    t = torch.empty(shape, dtype=torch.bfloat16)

    out, _, parts, _ = roundtrip(t)

    assert parts == []
    assert_same_tensor(out, t)


def test_zero_dim_tensor_round_trips() -> None:
    t = torch.tensor(3.5, dtype=torch.float64)

    out, _, _, _ = roundtrip(t)

    assert_same_tensor(out, t)
    assert out.item() == 3.5


@pytest.mark.parametrize("requires_grad", [True, False])
@pytest.mark.parametrize("size", [3, BIG // 4], ids=["small", "large"])
def test_parameter_keeps_type_and_requires_grad(requires_grad: bool, size: int) -> None:
    p = torch.nn.Parameter(torch.linspace(0, 1, size), requires_grad=requires_grad)

    out, _, _, _ = roundtrip(p)

    assert isinstance(out, torch.nn.Parameter)
    assert_same_tensor(out, p)
    assert out.is_leaf


def test_tensor_requiring_grad_arrives_as_leaf_requiring_grad() -> None:
    t = torch.ones(4, requires_grad=True) * 2  # not a leaf: has a grad_fn

    out, _, _, _ = roundtrip(t)

    assert type(out) is torch.Tensor
    assert out.requires_grad
    assert out.is_leaf
    assert torch.equal(out.detach(), t.detach())


def test_received_tensor_is_independent_of_sender_tensor() -> None:
    t = torch.zeros(BIG // 4)

    out, _, _, _ = roundtrip(t)
    t[0] = 1.0

    assert out[0].item() == 0.0


def test_tensors_inside_user_objects_go_out_of_band() -> None:
    p = Point(torch.ones(BIG // 4), 2)

    out, _, parts, raw = roundtrip(p)

    assert len(parts) == 1
    assert len(raw) < 1024
    assert torch.equal(out.x, p.x)
    assert out.y == 2


def test_module_with_parameters_round_trips() -> None:
    layer = torch.nn.Linear(512, 256)

    out, _, parts, _ = roundtrip(layer)

    assert type(out) is torch.nn.Linear
    assert len(parts) == 1  # the weight: 512 KiB; the bias is small
    assert isinstance(out.weight, torch.nn.Parameter)
    assert torch.equal(out.weight, layer.weight)
    assert torch.equal(out.bias, layer.bias)


def test_conjugate_view_tensor_round_trips() -> None:
    t = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj()
    pickle.dumps(t)  # plain pickle accepts it

    out, _, _, _ = roundtrip(t)

    assert torch.equal(out.resolve_conj(), t.resolve_conj())


def test_lambda_next_to_large_tensor_keeps_tensor_out_of_band() -> None:
    """The cloudpickle fallback still sends large buffers out of band."""
    t = torch.arange(BIG // 4, dtype=torch.float32)
    scale: Callable[[int], int] = lambda x: 2 * x  # noqa: E731

    out, _, parts, raw = roundtrip((scale, t))

    assert len(parts) == 1
    assert len(raw) < 16 << 10
    assert out[0](4) == 8
    assert torch.equal(out[1], t)
