"""Tests for danaus.mesh._value_mesh.ValueMesh."""

from __future__ import annotations

import pickle

import pytest

from danaus.geometry import Point, Shape
from danaus.mesh._value_mesh import ValueMesh


@pytest.fixture
def mesh() -> ValueMesh[int]:
    # The value at each point is its global rank, so slices are easy to check.
    return ValueMesh(Shape.from_sizes({"hosts": 2, "gpus": 4}), range(8))


def test_basics(mesh: ValueMesh[int]) -> None:
    assert len(mesh) == 8
    assert mesh.sizes == {"hosts": 2, "gpus": 4}
    assert mesh.size("hosts") == 2
    assert mesh.shape == Shape.from_sizes({"hosts": 2, "gpus": 4})
    assert mesh.values() == list(range(8))


def test_wrong_number_of_values() -> None:
    with pytest.raises(ValueError, match="has 4 ranks but 3 values"):
        ValueMesh(Shape.from_sizes({"gpus": 4}), [1, 2, 3])


def test_item(mesh: ValueMesh[int]) -> None:
    assert mesh.item(hosts=1, gpus=2) == 6
    assert mesh.item(hosts=-1, gpus=-1) == 7
    assert mesh.slice(hosts=1, gpus=3).item() == 7
    assert mesh.slice(hosts=slice(1, 2), gpus=slice(0, 1)).item() == 4
    # Dims of size 1 may be left out.
    assert mesh.slice(hosts=slice(0, 1)).item(gpus=1) == 1


def test_item_errors(mesh: ValueMesh[int]) -> None:
    with pytest.raises(ValueError, match=r"missing \{'hosts': 2, 'gpus': 4\}"):
        mesh.item()
    with pytest.raises(ValueError, match=r"missing \{'gpus': 4\}"):
        mesh.item(hosts=0)
    with pytest.raises(ValueError, match=r"unknown dims \['x'\]"):
        mesh.item(hosts=0, gpus=0, x=0)
    with pytest.raises(IndexError, match="out of range for dim 'gpus'"):
        mesh.item(hosts=0, gpus=4)
    with pytest.raises(TypeError, match="use slice"):
        mesh.item(hosts=0, gpus=slice(0, 1))  # type: ignore[arg-type]


def test_items_and_iter(mesh: ValueMesh[int]) -> None:
    items = list(mesh.items())
    assert items == list(mesh)
    assert items[5] == (Point({"hosts": 1, "gpus": 1}, {"hosts": 2, "gpus": 4}), 5)
    assert [p.rank for p, _ in items] == list(range(8))


def test_slice(mesh: ValueMesh[int]) -> None:
    col = mesh.slice(gpus=slice(1, None, 2))
    assert col.sizes == {"hosts": 2, "gpus": 2}
    assert col.values() == [1, 3, 5, 7]
    assert col.shape.global_ranks() == [1, 3, 5, 7]
    # Points are local to the slice.
    assert [str(p) for p, _ in col][-1] == "{'hosts': 1/2, 'gpus': 1/2}"
    assert col.slice(hosts=1).values() == [5, 7]
    assert col.slice(hosts=1).shape.global_ranks() == [5, 7]
    assert col.item(hosts=1, gpus=0) == 5


def test_slice_of_sliced_shape() -> None:
    # Values on a shape that is itself a slice: slicing goes by local position.
    shape = Shape.from_sizes({"x": 10}).slice(x=slice(3, None, 2))  # ranks 3, 5, 7, 9
    mesh = ValueMesh(shape, "abcd")
    sub = mesh.slice(x=slice(1, 3))
    assert sub.values() == ["b", "c"]
    assert sub.shape.global_ranks() == [5, 7]


def test_from_ranks() -> None:
    shape = Shape.from_sizes({"procs": 3})
    mesh = ValueMesh.from_ranks(shape, {2: "c", 0: "a", 1: "b"})
    assert mesh.values() == ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"missing \[1\], unexpected \[5\]"):
        ValueMesh.from_ranks(shape, {0: "a", 2: "c", 5: "x"})


def test_repr_small_meshes_one_line_per_point_as_monarch() -> None:
    shape = Shape.from_sizes({"hosts": 2, "gpus": 2})
    assert repr(ValueMesh(shape, [0, 1, 2, "three"])) == (
        "ValueMesh({hosts: 2, gpus: 2}):\n"
        "  {'hosts': 0/2, 'gpus': 0/2}: 0\n"
        "  {'hosts': 0/2, 'gpus': 1/2}: 1\n"
        "  {'hosts': 1/2, 'gpus': 0/2}: 2\n"
        "  {'hosts': 1/2, 'gpus': 1/2}: 'three'"
    )
    one = ValueMesh(Shape((), ()), ["x"])
    assert repr(one) == "ValueMesh({}):\n  {}: 'x'"
    wide = ValueMesh(Shape.from_sizes({"r": 1}), ["y" * 100])
    assert repr(wide) == "ValueMesh({r: 1}):\n  {'r': 0/1}: '" + "y" * 36 + "..."
    multiline = repr(ValueMesh(Shape.from_sizes({"r": 1}), [_Multiline()]))
    assert multiline.splitlines()[1] == "  {'r': 0/1}: line one line two"


def test_repr_large_meshes_on_one_line() -> None:
    long = ValueMesh(Shape.from_sizes({"r": 100}), range(100))
    assert repr(long) == "ValueMesh({r: 100}, [0, 1, 2, ..., 97, 98, 99])"
    grid = ValueMesh(Shape.from_sizes({"a": 2, "b": 9}), range(18))
    assert repr(grid) == (
        "ValueMesh({a: 2, b: 9}, [[0, 1, 2, ..., 6, 7, 8], [9, 10, 11, ..., 15, 16, 17]])"
    )


class _Multiline:
    def __repr__(self) -> str:
        return "line one\nline two"


def test_equality_and_pickle(mesh: ValueMesh[int]) -> None:
    sub = mesh.slice(gpus=slice(1, 3))
    back = pickle.loads(pickle.dumps(sub))
    assert back == sub
    assert back.shape.global_ranks() == [1, 2, 5, 6]
    assert hash(back) == hash(sub)
    assert sub != ValueMesh(Shape.from_sizes({"hosts": 2, "gpus": 2}), [1, 2, 5, 6])
    assert sub != ValueMesh(sub.shape, [0, 0, 0, 0])
