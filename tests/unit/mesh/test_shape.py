"""Tests for danaus.geometry.Shape."""

from __future__ import annotations

import pickle

import pytest

from danaus.geometry import Extent, Point, Shape


@pytest.fixture
def shape() -> Shape:
    return Shape.from_sizes({"hosts": 2, "gpus": 4})


def test_from_sizes_is_row_major(shape: Shape) -> None:
    assert shape.labels == ("hosts", "gpus")
    assert shape.sizes == {"hosts": 2, "gpus": 4}
    assert shape.strides == {"hosts": 4, "gpus": 1}
    assert shape.offset == 0
    assert shape.ndim == 2
    assert len(shape) == 8
    assert shape.size("gpus") == 4
    assert shape.global_ranks() == list(range(8))
    assert shape == Shape(["hosts", "gpus"], [2, 4])


def test_no_dims_is_one_rank() -> None:
    empty = Shape((), ())
    assert len(empty) == 1
    assert empty.global_ranks() == [0]
    assert list(empty.points()) == [Point({}, {})]


def test_slice_int_drops_dim(shape: Shape) -> None:
    row = shape.slice(hosts=1)
    assert row.labels == ("gpus",)
    assert row.global_ranks() == [4, 5, 6, 7]
    assert shape.slice(hosts=1, gpus=2).global_ranks() == [6]
    assert shape.slice(hosts=1, gpus=2).ndim == 0


def test_slice_negative_int(shape: Shape) -> None:
    assert shape.slice(hosts=-1, gpus=-1).global_ranks() == [7]
    assert shape.slice(gpus=-4).global_ranks() == [0, 4]


def test_slice_ranges_and_steps(shape: Shape) -> None:
    assert shape.slice(gpus=slice(1, 3)).global_ranks() == [1, 2, 5, 6]
    assert shape.slice(gpus=slice(None, None, 2)).global_ranks() == [0, 2, 4, 6]
    assert shape.slice(gpus=slice(1, None, 2)).sizes == {"hosts": 2, "gpus": 2}
    assert shape.slice(gpus=slice(-2, None)).global_ranks() == [2, 3, 6, 7]
    assert shape.slice(gpus=slice(0, 100)).global_ranks() == list(range(8))
    assert shape.slice() == shape


def test_slice_of_slice_keeps_global_ranks(shape: Shape) -> None:
    odd = shape.slice(gpus=slice(1, None, 2))  # gpus 1, 3
    assert odd.global_ranks() == [1, 3, 5, 7]
    assert odd.slice(gpus=1).global_ranks() == [3, 7]
    assert odd.slice(hosts=1, gpus=0).global_ranks() == [5]
    mid = Shape.from_sizes({"x": 10}).slice(x=slice(2, 9))  # 2..8
    assert mid.slice(x=slice(1, None, 3)).global_ranks() == [3, 6]


def test_slice_errors(shape: Shape) -> None:
    with pytest.raises(ValueError, match=r"unknown dims \['nodes'\].*\['hosts', 'gpus'\]"):
        shape.slice(nodes=0)
    with pytest.raises(IndexError, match=r"index 4 is out of range for dim 'gpus' of size 4"):
        shape.slice(gpus=4)
    with pytest.raises(IndexError, match=r"index -3 .* 'hosts' of size 2"):
        shape.slice(hosts=-3)
    with pytest.raises(ValueError, match="only positive steps"):
        shape.slice(gpus=slice(None, None, -1))
    with pytest.raises(ValueError, match="only positive steps"):
        shape.slice(gpus=slice(None, None, 0))
    with pytest.raises(ValueError, match="selects nothing"):
        shape.slice(gpus=slice(2, 2))
    with pytest.raises(TypeError, match="int or a slice"):
        shape.slice(gpus=1.0)  # type: ignore[arg-type]


def test_split(shape: Shape) -> None:
    split = shape.split("gpus", {"nodes": 2, "local": 2})
    assert split.sizes == {"hosts": 2, "nodes": 2, "local": 2}
    assert split.global_ranks() == list(range(8))
    assert split.slice(local=1).global_ranks() == [1, 3, 5, 7]
    # Splitting a strided slice keeps its global ranks.
    evens = Shape.from_sizes({"x": 12}).slice(x=slice(None, None, 2))
    assert evens.split("x", {"a": 3, "b": 2}).global_ranks() == evens.global_ranks()
    assert shape.split("gpus", {"gpus": 4}) == shape


def test_split_errors(shape: Shape) -> None:
    with pytest.raises(ValueError, match=r"size 4 into \{'a': 3, 'b': 2\}.*not 6"):
        shape.split("gpus", {"a": 3, "b": 2})
    with pytest.raises(ValueError, match="already name dims"):
        shape.split("gpus", {"hosts": 2, "b": 2})
    with pytest.raises(ValueError, match="unknown dim 'nope'"):
        shape.split("nope", {"a": 1})
    with pytest.raises(ValueError, match="at least one new dim"):
        shape.split("gpus", {})


def test_flatten(shape: Shape) -> None:
    flat = shape.flatten("ranks")
    assert flat == Shape.from_sizes({"ranks": 8})
    assert shape.slice(hosts=1).flatten("r").global_ranks() == [4, 5, 6, 7]
    assert shape.slice(gpus=slice(None, None, 2)).slice(hosts=0).flatten("r").strides == {"r": 2}
    # Size-1 dims do not get in the way.
    one = shape.slice(hosts=slice(1, 2), gpus=slice(1, 3))
    assert one.flatten("r").global_ranks() == [5, 6]
    # Every other rank across hosts is evenly spaced too.
    assert shape.slice(gpus=slice(None, None, 2)).global_ranks() == [0, 2, 4, 6]
    assert shape.slice(gpus=slice(None, None, 2)).flatten("r").global_ranks() == [0, 2, 4, 6]


def test_flatten_not_evenly_spaced(shape: Shape) -> None:
    corner = shape.slice(gpus=slice(0, 2))  # ranks 0, 1, 4, 5
    with pytest.raises(ValueError, match="not evenly spaced"):
        corner.flatten("r")


def test_rename(shape: Shape) -> None:
    renamed = shape.rename(gpus="procs")
    assert renamed.labels == ("hosts", "procs")
    assert renamed.global_ranks() == shape.global_ranks()
    with pytest.raises(ValueError, match=r"unknown dims \['x'\]"):
        shape.rename(x="y")
    with pytest.raises(ValueError, match="unique"):
        shape.rename(gpus="hosts")


def test_points_and_ranks(shape: Shape) -> None:
    sub = shape.slice(gpus=slice(1, 3))
    points = list(sub.points())
    assert [str(p) for p in points] == [
        "{'hosts': 0/2, 'gpus': 0/2}",
        "{'hosts': 0/2, 'gpus': 1/2}",
        "{'hosts': 1/2, 'gpus': 0/2}",
        "{'hosts': 1/2, 'gpus': 1/2}",
    ]
    assert [sub.global_rank(p) for p in points] == sub.global_ranks() == [1, 2, 5, 6]
    assert [sub.local_rank(p) for p in points] == [0, 1, 2, 3]
    assert sub.point_of(2) == points[2]
    assert sub.global_rank({"gpus": 1, "hosts": 1}) == 6
    assert [sub.index_of_global(g) for g in [1, 2, 5, 6]] == [0, 1, 2, 3]


def test_index_of_global_outside() -> None:
    sub = Shape.from_sizes({"hosts": 3, "gpus": 4}).slice(hosts=slice(1, None), gpus=slice(1, 3))
    assert sub.global_ranks() == [5, 6, 9, 10]
    for outside in [-1, 0, 4, 7, 8, 11, 13, 100]:
        with pytest.raises(ValueError, match=f"global rank {outside} is not in"):
            sub.index_of_global(outside)


def test_rank_errors(shape: Shape) -> None:
    with pytest.raises(ValueError, match=r"missing \['gpus'\], unknown \['x'\]"):
        shape.global_rank({"hosts": 0, "x": 1})
    with pytest.raises(IndexError, match="gpus=4 is out of range"):
        shape.local_rank({"hosts": 0, "gpus": 4})
    with pytest.raises(IndexError, match="local rank 8 is out of range"):
        shape.point_of(8)
    with pytest.raises(ValueError, match="unknown dim 'x'"):
        shape.size("x")


def test_constructor_errors() -> None:
    with pytest.raises(ValueError, match="unique"):
        Shape(["a", "a"], [1, 2])
    with pytest.raises(ValueError, match="at least 1"):
        Shape(["a"], [0])
    with pytest.raises(ValueError, match="2 labels"):
        Shape(["a", "b"], [1])
    with pytest.raises(TypeError, match="not the string"):
        Shape("ab", [1, 2])
    with pytest.raises(ValueError, match="overlap"):
        Shape(["a", "b"], [2, 2], strides=[1, 1])


def test_equality_hash_and_repr(shape: Shape) -> None:
    assert repr(shape) == "Shape({'hosts': 2, 'gpus': 4})"
    assert repr(shape.slice(hosts=1)) == "Shape({'gpus': 4}, strides=(1,), offset=4)"
    # The stride of a size-1 dim does not matter.
    assert shape.slice(hosts=slice(0, 1)) == Shape.from_sizes({"hosts": 1, "gpus": 4})
    assert hash(shape.slice(hosts=slice(0, 1))) == hash(Shape.from_sizes({"hosts": 1, "gpus": 4}))
    assert shape.slice(hosts=1) != Shape.from_sizes({"gpus": 4})
    assert shape != shape.rename(gpus="procs")
    assert len({shape, Shape.from_sizes({"hosts": 2, "gpus": 4})}) == 1


def test_immutable_and_pickles(shape: Shape) -> None:
    with pytest.raises(AttributeError, match="immutable"):
        shape._sizes = (1,)
    sub = shape.slice(gpus=slice(1, None, 2))
    back = pickle.loads(pickle.dumps(sub))
    assert back == sub
    assert back.global_ranks() == [1, 3, 5, 7]


def test_split_monarch_keywords_infer_one_size_per_dim() -> None:
    # The cases of Monarch's test_device_mesh.py test_mesh_reshape.
    mesh = Shape.from_sizes({"host": 60, "gpu": 24})
    dm2 = mesh.split(host=("dp", "pp"), gpu=("tp",), pp=4)
    assert dm2.labels == ("dp", "pp", "tp")
    assert dm2.sizes == {"dp": 15, "pp": 4, "tp": 24}
    assert dm2.strides == {"dp": 4 * 24, "pp": 24, "tp": 1}
    assert dm2.global_ranks() == mesh.global_ranks()
    assert list(mesh.split(host=("dp", "pp"), gpu=("tp",), dp=4).sizes.values()) == [4, 15, 24]
    assert list(mesh.split(host=("dp", "pp"), dp=60).sizes.values()) == [60, 1, 24]
    assert list(mesh.split(host=("dp", "pp"), pp=60).sizes.values()) == [1, 60, 24]
    assert mesh.split(host=("dp",)).labels == ("dp", "gpu")  # a rename
    # A strided slice keeps its global ranks.
    evens = Shape.from_sizes({"x": 12}).slice(x=slice(None, None, 2))
    assert evens.split(x=("a", "b"), b=2).global_ranks() == evens.global_ranks()


def test_split_monarch_keywords_errors() -> None:
    mesh = Shape.from_sizes({"host": 60, "gpu": 24})
    with pytest.raises(ValueError, match="Cannot infer"):
        mesh.split(host=("dp", "pp"))
    with pytest.raises(ValueError, match=r"unused size constraints: \('ddp',\)"):
        mesh.split(host=("dp", "pp"), pp=4, ddp=3)
    with pytest.raises(ValueError, match="Duplicate dimension name 'pp'"):
        mesh.split(host=("dp", "pp"), gpu=("pp",), dp=3)
    with pytest.raises(ValueError, match="evenly divided"):
        mesh.split(host=("dp", "pp"), dp=7)
    with pytest.raises(ValueError, match="sequence of new dim names for dim 'host'"):
        mesh.split(host="dp")
    with pytest.raises(ValueError, match="'pp' is not a dim"):
        mesh.split(pp="4")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not both"):
        mesh.split("host", {"a": 60}, gpu=("b",))


def test_size_of_several_dims_and_extent(shape: Shape) -> None:
    assert shape.size(["hosts", "gpus"]) == 8
    assert shape.size(("gpus",)) == 4
    assert shape.size() == 8
    with pytest.raises(ValueError, match="unknown dim 'nodes'"):
        shape.size(["hosts", "nodes"])
    extent = shape.extent
    assert extent.labels == ["hosts", "gpus"]
    assert extent.sizes == [2, 4]
    assert extent.nelements == 8
    assert extent["gpus"] == 4 and dict(extent) == {"hosts": 2, "gpus": 4}
    assert str(extent) == "{hosts: 2, gpus: 4}"
    assert extent == Extent(["hosts", "gpus"], [2, 4]) != Extent(["gpus", "hosts"], [4, 2])
    assert pickle.loads(pickle.dumps(extent)) == extent
    with pytest.raises(KeyError, match="'nodes' not found"):
        extent["nodes"]
    with pytest.raises(ValueError, match="sizes must be at least 1, got a=0"):
        Extent(["a"], [0])


def test_point_from_a_rank_and_an_extent() -> None:
    extent = Extent(["label0", "label1"], [3, 4])
    p = Point(11, extent)
    assert str(p) == "{'label0': 2/3, 'label1': 3/4}"
    assert p.rank == 11 and p.extent == extent and p.size("label1") == 4
