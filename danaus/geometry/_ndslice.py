"""Monarch's ndslice in Python: :class:`NDSlice`, a strided set of flat ranks with no dim
names, :class:`Region`, one with names (what an ``Extent`` or a mesh covers), and
:class:`Selection`, an expression that picks ranks out of one.

A :class:`~danaus.Shape` is an ``NDSlice`` with a name per dim (``shape.ndslice``), and
``Shape(labels, ndslice)`` builds one as Monarch's does.

A selection is written in Monarch's compact syntax and evaluated against a slice::

    >>> s = NDSlice.new_row_major([2, 3])          # ranks 0..5 as 2 x 3
    >>> Selection.from_string("1, 0:2").eval(s)    # row 1, columns 0 and 1
    [3, 4]
    >>> Selection.from_string("0 | 1,2").eval(s)   # row 0, and the point (1, 2)
    [0, 1, 2, 5]

The grammar (Monarch's): ``|`` is union, ``&`` intersection (binds tighter), ``,``
descends into the next dim, and a term is ``*`` (every index of this dim), ``?`` (one
index, chosen at random), ``N`` (that index), ``start:end:step`` (each part optional) or
a parenthesised expression. A chain shorter than the slice's dims selects everything in
the dims it leaves out.
"""

from __future__ import annotations

import itertools
import operator
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias, overload

if TYPE_CHECKING:
    from ._shape import Shape

__all__ = ["NDSlice", "Region", "Selection"]

_Slice: TypeAlias = "slice[int | None, int | None, int | None]"


class NDSlice:
    """Ranks ``offset + sum(coord[i] * strides[i])`` for every ``coord`` within
    ``sizes``, in row-major order of the coordinates (Monarch's ``NDSlice``).

    Raises ``ValueError`` for sizes or strides that are negative or of different
    lengths, or a negative offset.
    """

    __slots__ = ("_offset", "_sizes", "_strides")

    def __init__(self, *, offset: int, sizes: Sequence[int], strides: Sequence[int]) -> None:
        sizes_t = tuple(operator.index(s) for s in sizes)
        strides_t = tuple(operator.index(s) for s in strides)
        offset = operator.index(offset)
        if len(sizes_t) != len(strides_t):
            raise ValueError(
                f"NDSlice: {len(sizes_t)} sizes {list(sizes_t)} but {len(strides_t)} "
                f"strides {list(strides_t)}"
            )
        if any(s < 0 for s in sizes_t) or any(s < 0 for s in strides_t) or offset < 0:
            raise ValueError(
                f"NDSlice: offset, sizes and strides must not be negative (offset={offset}, "
                f"sizes={list(sizes_t)}, strides={list(strides_t)})"
            )
        self._offset, self._sizes, self._strides = offset, sizes_t, strides_t

    @staticmethod
    def new_row_major(sizes: Sequence[int]) -> NDSlice:
        """A contiguous slice of ``sizes``, from rank 0, last dim fastest."""
        strides: list[int] = []
        step = 1
        for size in reversed(sizes):
            strides.append(step)
            step *= operator.index(size)
        return NDSlice(offset=0, sizes=list(sizes), strides=strides[::-1])

    @staticmethod
    def from_list(ranks: Sequence[int]) -> list[NDSlice]:
        """One-dimensional slices that together hold ``ranks``, in order: each run of
        ranks with one step between them becomes one slice."""
        out: list[NDSlice] = []
        items = [operator.index(r) for r in ranks]
        i = 0
        while i < len(items):
            start = items[i]
            if i + 1 == len(items):
                out.append(NDSlice(offset=start, sizes=[1], strides=[1]))
                break
            step = items[i + 1] - start
            if step <= 0:
                out.append(NDSlice(offset=start, sizes=[1], strides=[1]))
                i += 1
                continue
            j = i + 1
            while j + 1 < len(items) and items[j + 1] - items[j] == step:
                j += 1
            out.append(NDSlice(offset=start, sizes=[j - i + 1], strides=[step]))
            i = j + 1
        return out

    @property
    def ndim(self) -> int:
        return len(self._sizes)

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def sizes(self) -> list[int]:
        return list(self._sizes)

    @property
    def strides(self) -> list[int]:
        return list(self._strides)

    def get(self, index: int) -> int:
        """The rank at row-major position ``index`` (the inverse of :meth:`index`)."""
        n = len(self)
        if not 0 <= index < n:
            raise IndexError(f"index {index} is out of range for {self!r} of {n} ranks")
        rank = self._offset
        for size, stride in zip(reversed(self._sizes), reversed(self._strides), strict=True):
            index, c = divmod(index, size)
            rank += c * stride
        return rank

    def nditem(self, coordinates: Sequence[int]) -> int:
        """The rank at ``coordinates``; ``IndexError`` when they are out of bounds."""
        if len(coordinates) != self.ndim:
            raise IndexError(
                f"{len(coordinates)} coordinates {list(coordinates)} for {self!r} of "
                f"{self.ndim} dims"
            )
        rank = self._offset
        for c, size, stride in zip(coordinates, self._sizes, self._strides, strict=True):
            if not 0 <= c < size:
                raise IndexError(f"coordinate {c} is out of bounds for a dim of size {size}")
            rank += c * stride
        return rank

    def coordinates(self, value: int) -> list[int]:
        """The coordinates of rank ``value``; ``ValueError`` when it is not in the slice."""
        return _coords_of(self, value)

    def index(self, value: int) -> int:
        """The row-major position of rank ``value`` (the inverse of :meth:`get`);
        ``ValueError`` when it is not in the slice."""
        pos = 0
        for c, size in zip(_coords_of(self, value), self._sizes, strict=True):
            pos = pos * size + c
        return pos

    def __len__(self) -> int:
        n = 1
        for s in self._sizes:
            n *= s
        return n

    def __iter__(self) -> Iterator[int]:
        for coords in itertools.product(*(range(s) for s in self._sizes)):
            yield self._offset + sum(c * st for c, st in zip(coords, self._strides, strict=True))

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: _Slice) -> tuple[int, ...]: ...
    def __getitem__(self, i: int | _Slice) -> int | tuple[int, ...]:
        if isinstance(i, slice):
            return tuple(self.get(j) for j in range(*i.indices(len(self))))
        j = operator.index(i)
        return self.get(j + len(self) if j < 0 else j)

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        try:
            _coords_of(self, value)
        except ValueError:
            return False
        return True

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NDSlice):
            return NotImplemented
        return (self._offset, self._sizes, self._strides) == (
            other._offset,
            other._sizes,
            other._strides,
        )

    def __hash__(self) -> int:
        return hash((self._offset, self._sizes, self._strides))

    def __repr__(self) -> str:
        return (
            f"NDSlice(offset={self._offset}, sizes={list(self._sizes)}, "
            f"strides={list(self._strides)})"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (_make, (self._offset, self._sizes, self._strides))


def _make(offset: int, sizes: tuple[int, ...], strides: tuple[int, ...]) -> NDSlice:
    return NDSlice(offset=offset, sizes=sizes, strides=strides)


class Region:
    """Named dims over an :class:`NDSlice` of a possibly larger rank space (Monarch's
    ``Region``): what ``extent.region`` and a mesh's ``region`` cover."""

    __slots__ = ("_labels", "_slice")

    def __init__(self, labels: Sequence[str], slice: NDSlice) -> None:
        labels_t = tuple(labels)
        if len(labels_t) != slice.ndim:
            raise ValueError(f"{len(labels_t)} labels {list(labels_t)} for {slice!r}")
        if len(set(labels_t)) != len(labels_t):
            raise ValueError(f"dim names must be unique, got {list(labels_t)}")
        self._labels, self._slice = labels_t, slice

    @property
    def labels(self) -> list[str]:
        return list(self._labels)

    def slice(self) -> NDSlice:
        return self._slice

    def point_of_base_rank(self, rank: int) -> dict[str, int]:
        """The coordinates, by dim name, of the base rank ``rank`` (``ValueError`` when
        the region does not hold it)."""
        return dict(zip(self._labels, self._slice.coordinates(rank), strict=True))

    def as_shape(self) -> Shape:
        """This region as a :class:`~danaus.Shape`."""
        from ._shape import Shape  # (it is built on this module)

        return Shape.from_region(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Region):
            return NotImplemented
        return (self._labels, self._slice) == (other._labels, other._slice)

    def __hash__(self) -> int:
        return hash((self._labels, self._slice))

    def __repr__(self) -> str:
        return f"Region({list(self._labels)}, {self._slice!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (Region, (self._labels, self._slice))


def _coords_of(s: NDSlice, value: int) -> list[int]:
    # Any layout (strides need not nest): search dims largest stride first, backtracking
    # where a smaller choice leaves a reachable rest. Slices here have a handful of dims.
    order = sorted(range(s.ndim), key=lambda d: -s.strides[d])
    coords = [0] * s.ndim

    def solve(k: int, rest: int) -> bool:
        if k == len(order):
            return rest == 0
        d = order[k]
        size, stride = s.sizes[d], s.strides[d]
        if stride == 0:
            coords[d] = 0
            return size > 0 and solve(k + 1, rest)
        hi = min(size - 1, rest // stride)
        for c in range(hi, -1, -1):
            coords[d] = c
            if solve(k + 1, rest - c * stride):
                return True
        return False

    if value >= s.offset and len(s) and solve(0, value - s.offset):
        return coords
    raise ValueError(f"rank {value} is not in {s!r}")


# -- selections ----------------------------------------------------------------------


@dataclass(frozen=True)
class _All:
    rest: _Node


@dataclass(frozen=True)
class _Any:
    rest: _Node


@dataclass(frozen=True)
class _Range:
    start: int
    end: int | None
    step: int
    rest: _Node


@dataclass(frozen=True)
class _Union:
    left: _Node
    right: _Node


@dataclass(frozen=True)
class _Inter:
    left: _Node
    right: _Node


@dataclass(frozen=True)
class _True:
    pass


@dataclass(frozen=True)
class _AnyEvery:
    """``?`` in every dim, however many the slice has (``Selection.any()``)."""


_Node = _All | _Any | _Range | _Union | _Inter | _True | _AnyEvery

_TOKEN = re.compile(r"\s*(\d+|[*?:,|&()])")


class Selection:
    """A selection expression over the dims of a mesh (Monarch's ``Selection``): build it
    with :meth:`from_string`, :meth:`all` or :meth:`any`, evaluate it with :meth:`eval`.
    """

    __slots__ = ("_node", "_text")

    def __init__(self, node: _Node, text: str) -> None:
        self._node, self._text = node, text

    @classmethod
    def from_string(cls, s: str) -> Selection:
        """Parse ``s``; ``ValueError`` naming the position where it stops making sense."""
        if not isinstance(s, str):
            raise TypeError(f"Selection.from_string takes a str, not {type(s).__name__}")
        return cls(_Parser(s).parse(), s.strip())

    @classmethod
    def all(cls) -> Selection:
        """Every rank (``*`` in every dim)."""
        return cls(_All(_True()), "*")

    @classmethod
    def any(cls) -> Selection:
        """One rank, chosen at random (``?`` in every dim)."""
        return cls(_AnyEvery(), "?")

    def eval(self, where: NDSlice | object) -> list[int]:
        """The ranks of ``where`` (an :class:`NDSlice`, or anything with an ``ndslice``,
        such as a :class:`~danaus.Shape`) that this selection picks, sorted."""
        s = where if isinstance(where, NDSlice) else getattr(where, "ndslice", None)
        if not isinstance(s, NDSlice):
            raise TypeError(f"Selection.eval takes an NDSlice or a Shape, not {where!r}")
        return sorted(_select(self._node, s, 0, s.offset))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Selection):
            return NotImplemented
        return self._node == other._node

    def __hash__(self) -> int:
        return hash(self._node)

    def __repr__(self) -> str:
        return f"Selection({self._text!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (Selection.from_string, (self._text,))


def _select(node: _Node, s: NDSlice, dim: int, base: int) -> set[int]:
    """The ranks ``node`` picks among those reachable from ``base`` at ``dim``."""
    if dim >= s.ndim:
        return {base}
    if isinstance(node, _True):
        rest = NDSlice(offset=base, sizes=s.sizes[dim:], strides=s.strides[dim:])
        return set(rest)
    if isinstance(node, _Union):
        return _select(node.left, s, dim, base) | _select(node.right, s, dim, base)
    if isinstance(node, _Inter):
        return _select(node.left, s, dim, base) & _select(node.right, s, dim, base)
    size, stride = s.sizes[dim], s.strides[dim]
    if isinstance(node, _AnyEvery):
        return _select(node, s, dim + 1, base + random.randrange(size) * stride) if size else set()
    if isinstance(node, _All):
        picks: Sequence[int] = range(size)
    elif isinstance(node, _Any):
        picks = [random.randrange(size)] if size else []
    else:
        picks = range(node.start, size if node.end is None else min(node.end, size), node.step)
    out: set[int] = set()
    for i in picks:
        out |= _select(node.rest, s, dim + 1, base + i * stride)
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[int, str]] = []
        pos = 0
        stripped = text.rstrip()
        while pos < len(stripped):
            m = _TOKEN.match(stripped, pos)
            if m is None:
                raise ValueError(
                    f"not a selection: {text!r}: unexpected {stripped[pos:].strip()[:1]!r} at "
                    f"position {pos}"
                )
            self.tokens.append((m.start(1), m.group(1)))
            pos = m.end()
        self.i = 0

    def parse(self) -> _Node:
        if not self.tokens:
            raise ValueError("not a selection: the text is empty")
        node = self.union()
        if self.i < len(self.tokens):
            pos, tok = self.tokens[self.i]
            raise ValueError(f"not a selection: {self.text!r}: unexpected {tok!r} at {pos}")
        return node

    def peek(self) -> str | None:
        return self.tokens[self.i][1] if self.i < len(self.tokens) else None

    def take(self) -> str:
        if self.i >= len(self.tokens):
            raise ValueError(f"not a selection: {self.text!r} ends too soon")
        tok = self.tokens[self.i][1]
        self.i += 1
        return tok

    def union(self) -> _Node:
        node = self.inter()
        while self.peek() == "|":
            self.take()
            node = _Union(node, self.inter())
        return node

    def inter(self) -> _Node:
        node = self.chain()
        while self.peek() == "&":
            self.take()
            node = _Inter(node, self.chain())
        return node

    def chain(self) -> _Node:
        groups = [self.group()]
        while self.peek() == ",":
            self.take()
            groups.append(self.group())
        node: _Node = _True()
        for g in reversed(groups):
            node = g(node)
        return node

    def group(self) -> _Group:
        tok = self.peek()
        if tok == "*":
            self.take()
            return _All
        if tok == "?":
            self.take()
            return _Any
        if tok == "(":
            self.take()
            inner = self.union()
            if self.take() != ")":
                raise ValueError(f"not a selection: {self.text!r}: a '(' is not closed")
            return _Nested(inner)
        if tok is not None and (tok.isdigit() or tok == ":"):
            start = int(self.take()) if tok.isdigit() else 0
            if self.peek() != ":":
                return _Ranged(start, start + 1, 1)
            self.take()
            end = int(self.take()) if (self.peek() or "").isdigit() else None
            step = 1
            if self.peek() == ":":
                self.take()
                step = int(self.take())
                if step < 1:
                    raise ValueError(f"not a selection: {self.text!r}: a step must be at least 1")
            return _Ranged(start, end, step)
        where = self.tokens[self.i][0] if self.i < len(self.tokens) else len(self.text)
        raise ValueError(
            f"not a selection: {self.text!r}: expected *, ?, a number, a range or '(' at {where}"
        )


class _Ranged:
    def __init__(self, start: int, end: int | None, step: int) -> None:
        self.start, self.end, self.step = start, end, step

    def __call__(self, rest: _Node) -> _Node:
        return _Range(self.start, self.end, self.step, rest)


class _Nested:
    """A parenthesised expression in a chain: it applies at this dim, and what follows
    in the chain applies after each of its branches."""

    def __init__(self, inner: _Node) -> None:
        self.inner = inner

    def __call__(self, rest: _Node) -> _Node:
        return _then(self.inner, rest)


def _then(node: _Node, rest: _Node) -> _Node:
    if isinstance(rest, _True):
        return node
    if isinstance(node, _True | _AnyEvery):
        return rest if isinstance(node, _True) else node
    if isinstance(node, _Union):
        return _Union(_then(node.left, rest), _then(node.right, rest))
    if isinstance(node, _Inter):
        return _Inter(_then(node.left, rest), _then(node.right, rest))
    if isinstance(node, _Range):
        return _Range(node.start, node.end, node.step, _then(node.rest, rest))
    return type(node)(_then(node.rest, rest))


_Group = type[_All] | type[_Any] | _Ranged | _Nested
