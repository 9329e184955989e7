"""Tests of danaus.actors._serialize out of band: large numpy arrays, bytes and torch tensors
travel as parts of their own, small ones in band, and tensors keep their dtype, shape,
values, grad and type. Plain values, objects and call arguments: test_serialize.py; what
both share: serialize_kit.py."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from danaus.actors._serialize import dumps
from danaus.config import config

from .serialize_kit import BIG, Point, assert_same, roundtrip, what

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
