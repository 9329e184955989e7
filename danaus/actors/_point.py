"""A rank written in named coordinates: ``{'hosts': 0/2, 'gpus': 1/4}``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping


class Point(Mapping[str, int]):
    """One position in a named, multi-dimensional extent.

    A ``Point`` maps each dimension name to a coordinate and also knows the size of
    every dimension, so ``str(point)`` reads like ``{'procs': 1/2}`` and
    ``point.rank`` is the row-major linear rank within the extent.
    """

    __slots__ = ("_coords", "_hash", "_sizes")

    def __init__(self, coords: Mapping[str, int], sizes: Mapping[str, int]) -> None:
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
        total = 1
        for s in sizes.values():
            total *= s
        if not 0 <= rank < total:
            raise ValueError(f"rank {rank} is outside an extent of {total}")
        coords: dict[str, int] = {}
        for dim in reversed(list(sizes)):
            rank, coords[dim] = divmod(rank, sizes[dim])
        return cls({d: coords[d] for d in sizes}, sizes)

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
    def extent(self) -> dict[str, int]:
        """Alias of :attr:`sizes` (Monarch's name)."""
        return dict(self._sizes)

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
