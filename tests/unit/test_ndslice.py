"""NDSlice and Selection (Monarch's ndslice), and Shape(labels, ndslice)."""

from __future__ import annotations

import pickle

import pytest

from danaus import NDSlice, Selection, Shape


def test_a_slice_maps_positions_coordinates_and_ranks_both_ways() -> None:
    s = NDSlice(offset=1, sizes=[2, 3], strides=[4, 1])  # rows 1..3 and 5..7
    assert list(s) == [1, 2, 3, 5, 6, 7]
    assert len(s) == 6 and s.ndim == 2
    assert (s.offset, s.sizes, s.strides) == (1, [2, 3], [4, 1])
    for i, rank in enumerate(s):
        assert s.get(i) == rank == s[i]
        assert s.index(rank) == i
        assert s.nditem(s.coordinates(rank)) == rank
    assert s[-1] == 7 and s[1:4] == (2, 3, 5)
    assert 4 not in s and 5 in s
    with pytest.raises(ValueError, match="rank 4 is not in"):
        s.index(4)
    with pytest.raises(ValueError, match="rank 0 is not in"):
        s.coordinates(0)
    with pytest.raises(IndexError, match="out of bounds"):
        s.nditem([2, 0])
    with pytest.raises(IndexError, match="out of range"):
        s.get(6)


def test_row_major_from_list_equality_hash_and_pickle() -> None:
    s = NDSlice.new_row_major([2, 3])
    assert s == NDSlice(offset=0, sizes=[2, 3], strides=[3, 1])
    assert hash(s) == hash(NDSlice(offset=0, sizes=[2, 3], strides=[3, 1]))
    assert pickle.loads(pickle.dumps(s)) == s
    assert repr(s) == "NDSlice(offset=0, sizes=[2, 3], strides=[3, 1])"
    runs = NDSlice.from_list([0, 1, 2, 6, 8, 10, 11])
    assert [list(r) for r in runs] == [[0, 1, 2], [6, 8, 10], [11]]
    assert NDSlice.from_list([]) == []


def test_bad_slices_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="2 sizes"):
        NDSlice(offset=0, sizes=[2, 3], strides=[1])
    with pytest.raises(ValueError, match="must not be negative"):
        NDSlice(offset=-1, sizes=[2], strides=[1])


def test_a_shape_is_labels_over_an_ndslice() -> None:
    nd = NDSlice(offset=2, sizes=[2, 2], strides=[4, 1])
    shape = Shape(["hosts", "gpus"], nd)
    assert shape.global_ranks() == [2, 3, 6, 7] == list(nd)
    assert shape.ndslice == nd
    assert Shape.from_sizes({"a": 2, "b": 3}).ndslice == NDSlice.new_row_major([2, 3])
    with pytest.raises(TypeError, match="no strides or offset"):
        Shape(["a"], NDSlice(offset=0, sizes=[2], strides=[1]), offset=1)


@pytest.mark.parametrize(
    ("text", "ranks"),
    [
        ("*", [0, 1, 2, 3, 4, 5]),
        ("1", [3, 4, 5]),  # a short chain: every index of the dims it leaves out
        ("1,0:2", [3, 4]),
        ("*,2", [2, 5]),
        ("0 | 1,2", [0, 1, 2, 5]),  # | at the top: row 0, and the point (1, 2)
        ("*,(0|2)", [0, 2, 3, 5]),  # parenthesised: a union within dim 1
        ("*,0:3:2 & *,1:", [2, 5]),
        ("::2", [0, 1, 2]),
        ("0:9", [0, 1, 2, 3, 4, 5]),  # an end past the size stops at the size
        ("5", []),
    ],
)
def test_selections_pick_monarchs_ranks(text: str, ranks: list[int]) -> None:
    s = NDSlice.new_row_major([2, 3])
    assert Selection.from_string(text).eval(s) == ranks
    assert Selection.from_string(text).eval(Shape.from_sizes({"h": 2, "g": 3})) == ranks


def test_any_picks_one_rank_and_all_every_rank() -> None:
    s = NDSlice.new_row_major([3, 4, 5])
    for _ in range(20):
        (one,) = Selection.any().eval(s)
        assert one in s
    assert Selection.all().eval(s) == list(s)
    assert Selection.from_string("?").eval(NDSlice.new_row_major([4]))[0] in range(4)


@pytest.mark.parametrize("bad", ["", "1,", "(1", "a", "1:2:0", "1 2", ")", "1|", "\u00e9"])
def test_text_that_is_not_a_selection_raises_value_error_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match="not a selection"):
        Selection.from_string(bad)


def test_selections_compare_print_and_pickle() -> None:
    a = Selection.from_string("*, 0:2")
    assert a == Selection.from_string("*,0:2")
    assert "0:2" in repr(a)
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(TypeError, match="takes a str"):
        Selection.from_string(b"*")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="NDSlice or a Shape"):
        a.eval([0, 1])


def test_an_extent_and_a_shape_have_their_region() -> None:
    from danaus import Extent

    region = Extent(["hosts", "gpus"], [2, 3]).region
    assert region.labels == ["hosts", "gpus"]
    assert region.slice() == NDSlice.new_row_major([2, 3])
    assert region.point_of_base_rank(4) == {"hosts": 1, "gpus": 1}
    assert region.as_shape() == Shape.from_sizes({"hosts": 2, "gpus": 3})
    sliced = Shape.from_sizes({"hosts": 2, "gpus": 3}).slice(gpus=slice(1, 3))
    assert sliced.region.slice() == NDSlice(offset=1, sizes=[2, 2], strides=[3, 1])
    assert sliced.region.as_shape() == sliced
    assert pickle.loads(pickle.dumps(region)) == region
    with pytest.raises(ValueError, match="rank 9 is not in"):
        region.point_of_base_rank(9)
