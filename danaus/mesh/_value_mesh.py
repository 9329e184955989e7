"""Values laid out on a :class:`Shape`, one per rank: what a mesh-wide call returns."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

from danaus.geometry import Point, Shape, Shaped

T = TypeVar("T")

_EDGE = 3  # repr shows this many items at each end of a longer dim, with "..." between
_VALUE_WIDTH = 40  # repr cuts each value's repr to this many characters
_LINES = 16  # a mesh of at most this many points shows one line per point, as Monarch's


def _short_repr(value: object) -> str:
    text = repr(value)
    if "\n" in text:  # e.g. a tensor: keep the mesh repr on one line
        text = " ".join(line.strip() for line in text.splitlines())
    if len(text) > _VALUE_WIDTH:
        text = text[: _VALUE_WIDTH - 3] + "..."
    return text


class ValueMesh(Shaped, Generic[T]):
    """One value per rank of a :class:`Shape`, in row-major order of the shape.

    A ``ValueMesh`` is immutable. Iterating it yields ``(point, value)`` pairs, the same
    as :meth:`items`, where ``point`` is the :class:`Point` in this mesh's own (local)
    coordinates; :meth:`values` gives the values alone.

    Example:
        >>> mesh = ValueMesh(Shape.from_sizes({"hosts": 2, "gpus": 2}), ["a", "b", "c", "d"])
        >>> mesh.item(hosts=1, gpus=0)
        'c'
        >>> mesh.slice(gpus=1)
        ValueMesh({hosts: 2}):
          {'hosts': 0/2}: 'b'
          {'hosts': 1/2}: 'd'

    Args:
        shape: Where the values lie.
        values: One value per rank of ``shape``, in row-major order.

    Raises:
        ValueError: The number of values is not the number of ranks in ``shape``.
    """

    __slots__ = ("_shape", "_values")

    def __init__(self, shape: Shape, values: Iterable[T]) -> None:
        self._shape = shape
        self._values = tuple(values)
        if len(self._values) != len(shape):
            raise ValueError(
                f"{shape!r} has {len(shape)} ranks but {len(self._values)} values were given"
            )

    @classmethod
    def from_ranks(cls, shape: Shape, results: Mapping[int, T]) -> ValueMesh[T]:
        """Build a mesh from values keyed by local rank (``0 .. len(shape) - 1``).

        Raises:
            ValueError: Some local rank has no value, or a key is not a local rank.
        """
        n = len(shape)
        missing = [r for r in range(n) if r not in results]
        extra = [k for k in results if not (isinstance(k, int) and 0 <= k < n)]
        if missing or extra:
            raise ValueError(
                f"results for {shape!r} must be keyed by local ranks 0..{n - 1}: "
                f"missing {missing}, unexpected {extra}"
            )
        return ValueMesh(shape, [results[r] for r in range(n)])

    def _with_shape(self, shape: Shape) -> ValueMesh[T]:
        """The values at the ranks of ``shape`` (a slice, split, flatten or rename of ours)."""
        index = self._shape.index_of_global
        return ValueMesh(shape, [self._values[index(g)] for g in shape.global_ranks()])

    def item(self, **coords: int) -> T:
        """The value at ``coords``, e.g. ``mesh.item(hosts=1, gpus=0)``.

        Every dim of size greater than 1 needs a coordinate, so on a one-element mesh
        ``mesh.item()`` returns its only value. Negative coordinates count from the end,
        as in :meth:`slice`.

        Raises:
            ValueError: A dim is unknown, or a dim of size greater than 1 has no coordinate.
            IndexError: A coordinate is out of range.
            TypeError: A coordinate is not an integer.
        """
        for dim, c in coords.items():
            if isinstance(c, slice):
                raise TypeError(f"item() takes integer coordinates; use slice() for {dim}={c}")
        # Slicing a row-major shape over local ranks leaves the chosen local rank as its
        # offset: O(ndim), with the same checks and messages as slice().
        local = Shape.from_sizes(self._shape.sizes).slice(**coords)
        if len(local) != 1:
            missing = {d: s for d, s in local.sizes.items() if s > 1}
            raise ValueError(
                f"item() needs a coordinate for each dim of size > 1; missing {missing} "
                f"of a mesh with sizes {self.sizes}"
            )
        return self._values[local.offset]

    def items(self) -> Iterator[tuple[Point, T]]:
        """Each ``(point, value)`` pair, in row-major order; points are local."""
        return zip(self._shape.points(), self._values, strict=True)

    def get(self, rank: int) -> T:
        """The value at linear ``rank`` (row-major, local to this mesh), as Monarch's."""
        if not 0 <= rank < len(self._values):
            raise IndexError(f"rank {rank} is outside a mesh of {len(self._values)}")
        return self._values[rank]

    def values(self) -> list[T]:
        """The values in row-major order (a fresh list)."""
        return list(self._values)

    def __iter__(self) -> Iterator[tuple[Point, T]]:
        """Each ``(point, value)`` pair, like :meth:`items`."""
        return self.items()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ValueMesh):
            return NotImplemented
        return self._shape == other._shape and self._values == other._values

    def __hash__(self) -> int:
        # Like a tuple's: a TypeError when some value is unhashable.
        return hash((self._shape, self._values))

    def __repr__(self) -> str:
        """One line per point for a small mesh, like Monarch's (``{'procs': 0/2}: value``);
        a larger one on one line, the middle of each long dim cut to ``...``."""
        if len(self._values) <= _LINES:
            lines = [f"  {p}: {_short_repr(v)}" for p, v in self.items()]
            return f"ValueMesh({self._shape.extent}):\n" + "\n".join(lines)
        return f"ValueMesh({self._shape.extent}, {self._render(0, 0)})"

    def _render(self, dim: int, base: int) -> str:
        sizes = list(self._shape.sizes.values())
        if dim == len(sizes):
            return _short_repr(self._values[base])
        inner = 1
        for s in sizes[dim + 1 :]:
            inner *= s
        size = sizes[dim]
        if size <= 2 * _EDGE:
            picks: list[int | None] = list(range(size))
        else:
            picks = [*range(_EDGE), None, *range(size - _EDGE, size)]
        parts = ["..." if i is None else self._render(dim + 1, base + i * inner) for i in picks]
        return "[" + ", ".join(parts) + "]"

    def __reduce__(self) -> tuple[type[ValueMesh[T]], tuple[Shape, tuple[T, ...]]]:
        return (ValueMesh, (self._shape, self._values))
