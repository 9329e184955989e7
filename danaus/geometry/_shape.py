"""Named, strided views over a flat rank space (Monarch's ``Shape`` and ndslice)."""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence
from itertools import pairwise
from typing import NoReturn, SupportsIndex, TypeAlias

from ._ndslice import NDSlice
from ._ndslice import Region as NDRegion
from ._point import Extent, Point
from ._split import row_major as _row_major
from ._split import split_dim, split_monarch

Selector: TypeAlias = "int | slice[int | None, int | None, int | None]"
"""What :meth:`Shape.slice` takes per dim: an index (drops the dim) or a slice (keeps it)."""


def _check_nested(labels: Sequence[str], sizes: Sequence[int], strides: Sequence[int]) -> None:
    # Sorted by stride, every dim must step past everything the smaller-stride dims can
    # reach. That makes the layout one-to-one, and lets index_of_global decode a rank by
    # greedy division. Every shape made by slicing a row-major one satisfies it.
    span = 0
    for stride, size, label in sorted(
        (st, sz, lb) for lb, sz, st in zip(labels, sizes, strides, strict=True) if sz > 1
    ):
        if stride <= span:
            raise ValueError(
                f"strides {dict(zip(labels, strides, strict=True))} overlap at dim {label!r}: "
                "two points would map to the same global rank"
            )
        span += (size - 1) * stride


class Shape:
    """An immutable set of ranks laid out as named dimensions.

    A shape has ``labels`` (dim names, outermost first), a ``size`` per dim, and maps
    each point to a *global* rank ``offset + sum(coord * stride)``. Slicing keeps that
    mapping, so a slice of a slice still knows which ranks of the original mesh it holds,
    while its own points are numbered from zero (*local* ranks, row-major in this shape).

    Example:
        >>> shape = Shape.from_sizes({"hosts": 2, "gpus": 4})
        >>> shape.slice(hosts=1, gpus=slice(None, None, 2)).global_ranks()
        [4, 6]

    Args:
        labels: The dim names, outermost first; unique, non-empty strings.
        sizes: The size of each dim, at least 1; or an :class:`NDSlice` giving sizes,
            strides and offset at once (Monarch's ``Shape(labels, ndslice)``).
        strides: How far one step along each dim moves in the global rank space;
            row-major for ``sizes`` when omitted. The dims must not overlap: sorted by
            stride, each one steps past everything the smaller-stride dims can reach.
        offset: The global rank of the all-zeros point.

    Raises:
        ValueError: The labels, sizes, strides or offset do not describe a valid layout.
    """

    __slots__ = ("_labels", "_offset", "_sizes", "_strides")

    _labels: tuple[str, ...]
    _sizes: tuple[int, ...]
    _strides: tuple[int, ...]
    _offset: int

    def __init__(
        self,
        labels: Sequence[str],
        sizes: Sequence[int] | NDSlice,
        strides: Sequence[int] | None = None,
        offset: int = 0,
    ) -> None:
        if isinstance(sizes, NDSlice):  # Monarch's spelling: Shape(labels, ndslice)
            if strides is not None or offset:
                raise TypeError("Shape(labels, ndslice) takes no strides or offset of its own")
            nd = sizes
            sizes, strides, offset = nd.sizes, nd.strides, nd.offset
        if isinstance(labels, str):
            raise TypeError(f"labels must be a sequence of dim names, not the string {labels!r}")
        labels_t = tuple(labels)
        sizes_t = tuple(operator.index(s) for s in sizes)
        if len(labels_t) != len(sizes_t):
            raise ValueError(
                f"{len(labels_t)} labels {labels_t} but {len(sizes_t)} sizes {sizes_t}"
            )
        for label in labels_t:
            if not isinstance(label, str) or not label:
                raise ValueError(f"dim names must be non-empty strings, got {label!r}")
        if len(set(labels_t)) != len(labels_t):
            raise ValueError(f"dim names must be unique, got {labels_t}")
        for label, size in zip(labels_t, sizes_t, strict=True):
            if size < 1:
                raise ValueError(f"dim {label!r} has size {size}; sizes must be at least 1")
        if strides is None:
            strides_t = _row_major(sizes_t)
        else:
            strides_t = tuple(operator.index(s) for s in strides)
            if len(strides_t) != len(sizes_t):
                raise ValueError(f"{len(sizes_t)} sizes but {len(strides_t)} strides {strides_t}")
            if any(s < 1 for s in strides_t):
                raise ValueError(f"strides must be at least 1, got {strides_t}")
        offset = operator.index(offset)
        if offset < 0:
            raise ValueError(f"offset must be at least 0, got {offset}")
        _check_nested(labels_t, sizes_t, strides_t)
        object.__setattr__(self, "_labels", labels_t)
        object.__setattr__(self, "_sizes", sizes_t)
        object.__setattr__(self, "_strides", strides_t)
        object.__setattr__(self, "_offset", offset)

    @classmethod
    def from_sizes(cls, sizes: Mapping[str, int]) -> Shape:
        """A row-major shape over global ranks ``0 .. n-1``, e.g. ``{"hosts": 2, "gpus": 4}``."""
        return cls(tuple(sizes), tuple(sizes.values()))

    # -- what it is -------------------------------------------------------------------

    @property
    def labels(self) -> tuple[str, ...]:
        """The dim names, outermost first."""
        return self._labels

    @property
    def sizes(self) -> dict[str, int]:
        """The size of each dim, outermost first (a fresh dict)."""
        return dict(zip(self._labels, self._sizes, strict=True))

    @property
    def strides(self) -> dict[str, int]:
        """How far one step along each dim moves in the global rank space."""
        return dict(zip(self._labels, self._strides, strict=True))

    @property
    def offset(self) -> int:
        """The global rank of the all-zeros point."""
        return self._offset

    @property
    def ndslice(self) -> NDSlice:
        """The ranks of this shape without the dim names (Monarch's ``shape.ndslice``)."""
        return NDSlice(offset=self._offset, sizes=self._sizes, strides=self._strides)

    @property
    def region(self) -> NDRegion:
        """The labels over :attr:`ndslice` (Monarch's ``shape.region``)."""
        return NDRegion(self._labels, self.ndslice)

    @classmethod
    def from_region(cls, region: NDRegion) -> Shape:
        """The shape of a :class:`Region` (``region.as_shape()``)."""
        return cls(region.labels, region.slice())

    @property
    def ndim(self) -> int:
        """The number of dims."""
        return len(self._labels)

    @property
    def extent(self) -> Extent:
        """The dim names and sizes as an :class:`Extent` (Monarch's name)."""
        return Extent(self._labels, self._sizes)

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """The size of ``dim``; of several dims, the product of their sizes; of ``None``,
        the number of ranks (as Monarch's ``size``).

        Raises:
            ValueError: The shape has no dim named ``dim`` (or one of them).
        """
        if dim is None:
            return len(self)
        if isinstance(dim, str):
            return self._sizes[self._dim_index(dim)]
        n = 1
        for d in dim:
            if not isinstance(d, str):
                raise TypeError(f"size() takes dim names, got {d!r} in {dim!r}")
            n *= self._sizes[self._dim_index(d)]
        return n

    def __len__(self) -> int:
        """The number of ranks (1 for a shape with no dims)."""
        n = 1
        for size in self._sizes:
            n *= size
        return n

    # -- making new shapes ------------------------------------------------------------

    def slice(self, **dims: Selector) -> Shape:
        """Select part of this shape, keeping each point's global rank.

        Args:
            **dims: Per dim, an ``int`` picks one coordinate and drops the dim (negative
                counts from the end), a ``slice`` keeps the dim with ``start:stop:step``
                (``step`` must be positive). Dims not named are kept whole.

        Returns:
            The selected shape.

        Raises:
            ValueError: A dim is unknown, a slice step is not positive, or a slice selects
                nothing.
            IndexError: An index is out of range for its dim.
            TypeError: A value is neither an integer nor a slice.
        """
        self._check_known(dims)
        labels: list[str] = []
        sizes: list[int] = []
        strides: list[int] = []
        offset = self._offset
        for label, size, stride in zip(self._labels, self._sizes, self._strides, strict=True):
            if label not in dims:
                labels.append(label)
                sizes.append(size)
                strides.append(stride)
                continue
            sel = dims[label]
            if isinstance(sel, slice):
                if sel.step is not None and operator.index(sel.step) < 1:
                    raise ValueError(
                        f"slice {sel} for dim {label!r} has step {sel.step}; "
                        "only positive steps are supported"
                    )
                start, stop, step = sel.indices(size)
                n = len(range(start, stop, step))
                if n == 0:
                    raise ValueError(f"slice {sel} of dim {label!r} (size {size}) selects nothing")
                offset += start * stride
                labels.append(label)
                sizes.append(n)
                strides.append(stride * step)
            else:
                offset += _check_index(label, sel, size) * stride
        return Shape(labels, sizes, strides, offset)

    def split(
        self,
        dim: str | None = None,
        into: Mapping[str, int] | None = None,
        /,
        **monarch: Sequence[str] | int,
    ) -> Shape:
        """Replace dims by several dims each, row-major, whose sizes multiply to its size.

        Two spellings. Monarch's names the dims to split and the sizes of new dims,
        inferring at most one unknown size per split dim (dims not named stay)::

            shape.split(host=("dp", "pp"), gpu=("tp", "cp"), pp=16, cp=2)

        danaus's names one dim and every new size::

            Shape.from_sizes({"gpus": 8}).split("gpus", {"nodes": 2, "local": 4})

        Args:
            dim: The dim to split.
            into: The new dims and their sizes, outermost first. A new name may reuse
                ``dim`` but not another dim of this shape.

        Returns:
            The split shape; its global ranks are unchanged.

        Raises:
            ValueError: ``dim`` is unknown, ``into`` is empty or clashes with another dim,
                or its sizes do not multiply to the size of ``dim``; in Monarch's form, a
                size cannot be inferred, does not divide the dim, is left unused, or a new
                name repeats.
        """
        if dim is None and into is None:
            return self._split_monarch(monarch)
        if dim is None or into is None or monarch:
            raise TypeError(
                "split() takes either a dim and its new sizes, split('gpus', {'a': 2, 'b': 4}), "
                "or Monarch's keywords, split(gpus=('a', 'b'), b=4); not both"
            )
        i = self._dim_index(dim)  # a clear error for an unknown dim
        labels, sizes, strides = split_dim(
            self._labels, self._sizes, self._strides, self._labels[i], into, repr(self)
        )
        return Shape(labels, sizes, strides, self._offset)

    def _split_monarch(self, kw: Mapping[str, Sequence[str] | int]) -> Shape:
        labels, sizes, strides = split_monarch(
            self._labels, self._sizes, self._strides, kw, repr(self)
        )
        return Shape(labels, sizes, strides, self._offset)

    def flatten(self, name: str) -> Shape:
        """Merge all dims into one dim ``name``, keeping row-major order and global ranks.

        This works only when the global ranks, in row-major order, are evenly spaced (one
        stride describes them): true of any unsliced shape, of a slice that keeps inner
        dims whole, and of a single strided dim. ``hosts=slice(0, 2), gpus=slice(0, 2)``
        of a 2x4 shape gives ranks ``[0, 1, 4, 5]``, which cannot be flattened.

        Raises:
            ValueError: The global ranks are not evenly spaced.
        """
        kept = [
            (label, size, stride)
            for label, size, stride in zip(self._labels, self._sizes, self._strides, strict=True)
            if size > 1
        ]
        for (outer, _, outer_stride), (inner, inner_size, inner_stride) in pairwise(kept):
            if outer_stride != inner_stride * inner_size:
                raise ValueError(
                    f"cannot flatten {self!r}: its global ranks are not evenly spaced, "
                    f"because a step along {outer!r} moves {outer_stride} ranks, not the "
                    f"{inner_stride * inner_size} that {inner!r} spans; flatten before slicing, "
                    "or keep inner dims whole"
                )
        stride = kept[-1][2] if kept else 1
        return Shape((name,), (len(self),), (stride,), self._offset)

    def rename(self, **renames: str) -> Shape:
        """Rename dims, e.g. ``shape.rename(gpus="procs")``; others keep their names.

        Raises:
            ValueError: A dim is unknown, or the new names are not unique.
        """
        self._check_known(renames)
        labels = tuple(renames.get(label, label) for label in self._labels)
        return Shape(labels, self._sizes, self._strides, self._offset)

    # -- ranks and points -------------------------------------------------------------

    def global_ranks(self) -> list[int]:
        """The global rank of every point, in row-major order of this shape."""
        ranks = [self._offset]
        for size, stride in zip(self._sizes, self._strides, strict=True):
            ranks = [r + i * stride for r in ranks for i in range(size)]
        return ranks

    def global_rank(self, coords: Mapping[str, int]) -> int:
        """The global rank of the point at ``coords`` (a :class:`Point` or a dict).

        Raises:
            ValueError: ``coords`` does not name exactly the dims of this shape.
            IndexError: A coordinate is out of range (negative ones are too).
        """
        return self._offset + sum(
            c * s for c, s in zip(self._coords(coords), self._strides, strict=True)
        )

    def local_rank(self, coords: Mapping[str, int]) -> int:
        """The row-major index in this shape of the point at ``coords``.

        Raises:
            ValueError: ``coords`` does not name exactly the dims of this shape.
            IndexError: A coordinate is out of range (negative ones are too).
        """
        rank = 0
        for c, size in zip(self._coords(coords), self._sizes, strict=True):
            rank = rank * size + c
        return rank

    def point_of(self, local_rank: int) -> Point:
        """The point at row-major index ``local_rank`` of this shape.

        Raises:
            IndexError: ``local_rank`` is not in ``0 .. len(self) - 1``.
        """
        if not 0 <= local_rank < len(self):
            raise IndexError(f"local rank {local_rank} is out of range for {self!r} of {len(self)}")
        return Point.from_rank(local_rank, self.sizes)

    def points(self) -> Iterator[Point]:
        """Every point, in local coordinates, in row-major order."""
        sizes = self.sizes
        for rank in range(len(self)):
            yield Point.from_rank(rank, sizes)

    def index_of_global(self, global_rank: int) -> int:
        """The local rank of the point that maps to ``global_rank``.

        Raises:
            ValueError: No point of this shape maps to ``global_rank``.
        """
        rest = global_rank - self._offset
        coords = [0] * self.ndim
        if rest >= 0:
            # Largest stride first; _check_nested guarantees each quotient is the coordinate.
            for i in sorted(range(self.ndim), key=lambda j: -self._strides[j]):
                if self._sizes[i] > 1:
                    coords[i], rest = divmod(rest, self._strides[i])
            if rest == 0 and all(c < s for c, s in zip(coords, self._sizes, strict=True)):
                return self.local_rank(dict(zip(self._labels, coords, strict=True)))
        raise ValueError(f"global rank {global_rank} is not in {self!r}")

    # -- helpers ----------------------------------------------------------------------

    def _dim_index(self, dim: str) -> int:
        try:
            return self._labels.index(dim)
        except ValueError:
            raise ValueError(
                f"unknown dim {dim!r}; {self!r} has dims {list(self._labels)}"
            ) from None

    def _check_known(self, dims: Mapping[str, object]) -> None:
        unknown = [d for d in dims if d not in self._labels]
        if unknown:
            raise ValueError(f"unknown dims {unknown}; {self!r} has dims {list(self._labels)}")

    def _coords(self, coords: Mapping[str, int]) -> list[int]:
        missing = [d for d in self._labels if d not in coords]
        unknown = [d for d in coords if d not in self._labels]
        if missing or unknown:
            raise ValueError(
                f"coordinates {dict(coords)} do not match the dims {list(self._labels)} of "
                f"{self!r} (missing {missing}, unknown {unknown})"
            )
        out: list[int] = []
        for label, size in zip(self._labels, self._sizes, strict=True):
            c = operator.index(coords[label])
            if not 0 <= c < size:
                raise IndexError(
                    f"coordinate {label}={c} is out of range for dim {label!r} of size {size}"
                )
            out.append(c)
        return out

    def _key(self) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...], int]:
        # The stride of a size-1 dim never moves a point, so it is not part of identity.
        strides = tuple(
            st if sz > 1 else 0 for sz, st in zip(self._sizes, self._strides, strict=True)
        )
        return (self._labels, self._sizes, strides, self._offset)

    # -- dunder -----------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shape):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        sizes = self.sizes
        if self._key() == Shape.from_sizes(sizes)._key():  # noqa: SLF001 - another Shape
            return f"Shape({sizes})"
        return f"Shape({sizes}, strides={self._strides}, offset={self._offset})"

    def __reduce__(
        self,
    ) -> tuple[type[Shape], tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...], int]]:
        return (Shape, (self._labels, self._sizes, self._strides, self._offset))

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"Shape is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"Shape is immutable; cannot delete {name!r}")


def _check_index(label: str, index: object, size: int) -> int:
    if not isinstance(index, SupportsIndex):
        raise TypeError(
            f"dim {label!r} takes an int or a slice, not {type(index).__name__} {index!r}"
        )
    i = operator.index(index)
    if not -size <= i < size:
        raise IndexError(f"index {i} is out of range for dim {label!r} of size {size}")
    return i + size if i < 0 else i
