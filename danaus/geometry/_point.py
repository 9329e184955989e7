"""A rank written in named coordinates: ``{'hosts': 0/2, 'gpus': 1/4}``, and the
:class:`Extent` it lies in."""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from ._ndslice import NDSlice
from ._ndslice import Region as NDRegion


class Strided(Protocol):
    """Named dims laid over flat ranks (``offset + sum(coord * stride)``): what a message's
    region says on the wire (``danaus.actors``'s ``Region``)."""

    @property
    def labels(self) -> Sequence[str]: ...
    @property
    def sizes(self) -> Sequence[int]: ...
    @property
    def strides(self) -> Sequence[int]: ...
    @property
    def offset(self) -> int: ...


class Extent(Mapping[str, int]):
    """Named dimension sizes, outermost first: ``{hosts: 2, gpus: 4}`` (Monarch's ``Extent``).

    A read-only mapping from dim name to size, with ``labels`` and ``sizes`` as lists
    and ``nelements``, the number of points.

    Args:
        labels: The dim names, unique.
        sizes: The size of each dim, at least 1.

    Raises:
        ValueError: The labels and sizes differ in number, a label repeats, or a size is
            below 1.
    """

    __slots__ = ("_labels", "_sizes")

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        if isinstance(labels, str):
            raise TypeError(f"labels must be a sequence of dim names, not the string {labels!r}")
        labels_t = tuple(labels)
        sizes_t = tuple(operator.index(s) for s in sizes)
        if len(labels_t) != len(sizes_t):
            raise ValueError(
                f"{len(labels_t)} labels {labels_t} but {len(sizes_t)} sizes {sizes_t}"
            )
        if len(set(labels_t)) != len(labels_t):
            raise ValueError(f"dim names must be unique, got {labels_t}")
        bad = [f"{lb}={sz}" for lb, sz in zip(labels_t, sizes_t, strict=True) if sz < 1]
        if bad:
            raise ValueError(f"sizes must be at least 1, got {', '.join(bad)}")
        self._labels = labels_t
        self._sizes = sizes_t

    @property
    def labels(self) -> list[str]:
        """The dim names, outermost first."""
        return list(self._labels)

    @property
    def sizes(self) -> list[int]:
        """The size of each dim, outermost first."""
        return list(self._sizes)

    @property
    def region(self) -> NDRegion:
        """These dims over ranks ``0 .. nelements - 1``, row-major (Monarch's)."""
        return NDRegion(self._labels, NDSlice.new_row_major(self._sizes))

    @property
    def nelements(self) -> int:
        """The number of points (1 for an extent with no dims)."""
        n = 1
        for s in self._sizes:
            n *= s
        return n

    def __getitem__(self, label: str) -> int:
        try:
            return self._sizes[self._labels.index(label)]
        except ValueError:
            raise KeyError(
                f"dimension {label!r} not found; the dims are {list(self._labels)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Extent):
            return self._labels == other._labels and self._sizes == other._sizes
        if isinstance(other, Mapping):
            return dict(self) == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._labels, self._sizes))

    def __str__(self) -> str:
        return (
            "{"
            + ", ".join(f"{lb}: {sz}" for lb, sz in zip(self._labels, self._sizes, strict=True))
            + "}"
        )

    def __repr__(self) -> str:
        return f"Extent({list(self._labels)}, {list(self._sizes)})"

    def __reduce__(self) -> tuple[type[Extent], tuple[tuple[str, ...], tuple[int, ...]]]:
        return (Extent, (self._labels, self._sizes))


class Point(Mapping[str, int]):
    """One position in a named, multi-dimensional extent.

    A ``Point`` maps each dimension name to a coordinate and also knows the size of
    every dimension, so ``str(point)`` reads like ``{'procs': 1/2}`` and
    ``point.rank`` is the row-major linear rank within the extent. As in Monarch,
    ``Point(rank, extent)`` also makes one from a linear rank.
    """

    __slots__ = ("_coords", "_hash", "_sizes")

    _coords: dict[str, int]

    def __init__(self, where: Mapping[str, int] | int, sizes: Mapping[str, int]) -> None:
        coords: Mapping[str, int] = (
            where if isinstance(where, Mapping) else _coords_of(operator.index(where), sizes)
        )
        if list(coords) != list(sizes):
            raise ValueError(f"coords {dict(coords)} and sizes {dict(sizes)} name different dims")
        for dim, c in coords.items():
            if not 0 <= c < sizes[dim]:
                raise ValueError(f"coordinate {dim}={c} is outside 0..{sizes[dim] - 1}")
        self._coords = dict(coords)
        self._sizes = dict(sizes)
        self._hash: int | None = None

    @classmethod
    def from_rank(cls, rank: int, sizes: Mapping[str, int]) -> Point:
        """The point at row-major ``rank`` in an extent of ``sizes``."""
        return cls(_coords_of(rank, sizes), sizes)

    @property
    def rank(self) -> int:
        """Row-major linear rank of this point within its extent."""
        r = 0
        for dim, size in self._sizes.items():
            r = r * size + self._coords[dim]
        return r

    @property
    def sizes(self) -> dict[str, int]:
        """The size of each dimension of the extent this point lies in."""
        return dict(self._sizes)

    @property
    def extent(self) -> Extent:
        """The :class:`Extent` this point lies in (Monarch's name; a mapping like :attr:`sizes`)."""
        return Extent(tuple(self._sizes), tuple(self._sizes.values()))

    def size(self, dim: str) -> int:
        """The size of dimension ``dim`` of the extent (Monarch's ``Point.size``)."""
        return self._sizes[dim]

    def __getitem__(self, dim: str) -> int:
        return self._coords[dim]

    def __iter__(self) -> Iterator[str]:
        return iter(self._coords)

    def __len__(self) -> int:
        return len(self._coords)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Point):
            return self._coords == other._coords and self._sizes == other._sizes
        if isinstance(other, Mapping):
            return self._coords == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((tuple(self._coords.items()), tuple(self._sizes.values())))
        return self._hash

    def __str__(self) -> str:
        inner = ", ".join(f"{d!r}: {c}/{self._sizes[d]}" for d, c in self._coords.items())
        return "{" + inner + "}"

    def __repr__(self) -> str:
        return f"Point({self})"

    def __reduce__(self) -> tuple[type[Point], tuple[dict[str, int], dict[str, int]]]:
        return (Point, (self._coords, self._sizes))


def _coords_of(rank: int, sizes: Mapping[str, int]) -> dict[str, int]:
    total = 1
    for s in sizes.values():
        total *= s
    if not 0 <= rank < total:
        raise ValueError(f"rank {rank} is outside an extent of {total}")
    coords: dict[str, int] = {}
    for dim in reversed(list(sizes)):
        rank, coords[dim] = divmod(rank, sizes[dim])
    return {d: coords[d] for d in sizes}


def point_in_region(global_rank: int, region: Strided) -> Point | None:
    """Where ``global_rank`` lies in ``region`` (local, row-major coordinates), or ``None``
    when it is not one of its ranks. Dims of a region never overlap (sorted by stride,
    each steps past what the smaller ones reach), so greedy division finds the point."""
    rest = global_rank - region.offset
    if rest < 0:
        return None
    n = len(region.labels)
    coords = [0] * n
    for i in sorted(range(n), key=lambda j: -region.strides[j]):
        if region.sizes[i] > 1:
            coords[i], rest = divmod(rest, region.strides[i])
            if coords[i] >= region.sizes[i]:
                return None
    if rest:
        return None
    return Point(
        dict(zip(region.labels, coords, strict=True)),
        dict(zip(region.labels, region.sizes, strict=True)),
    )
