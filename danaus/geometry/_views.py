"""The shape vocabulary every mesh shares (host, proc and actor meshes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from ._point import Extent
from ._shape import Selector, Shape

M = TypeVar("M", bound="Shaped")


class Shaped:
    """``shape``, ``sizes``, ``size()``, ``len()``, and the views ``slice`` / ``split`` /
    ``flatten`` / ``rename``, over a mesh's :class:`Shape`. Subclasses set ``_shape`` and
    implement ``_with_shape`` (the same mesh seen through another shape)."""

    _shape: Shape

    def _with_shape(self: M, shape: Shape) -> M:
        raise NotImplementedError

    def with_shape(self: M, shape: Shape) -> M:
        """The same mesh seen through ``shape`` (a slice's or a reshaped view's shape)."""
        return self._with_shape(shape)

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def sizes(self) -> dict[str, int]:
        """The size of each named dim."""
        return self._shape.sizes

    @property
    def _labels(self) -> list[str]:
        """The dim names, in order: Monarch's private name, which its examples read
        (``dict.fromkeys(procs._labels, 0)``, the coordinates of rank 0)."""
        return list(self._shape.labels)

    @property
    def extent(self) -> Extent:
        """The dim names and sizes (Monarch's ``extent``: ``.labels``, ``.sizes``, a mapping)."""
        return self._shape.extent

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """The size of ``dim``, the product of several dims' sizes, or the number of ranks."""
        return self._shape.size(dim)

    def __len__(self) -> int:
        return len(self._shape)

    def slice(self: M, **dims: Selector) -> M:
        """The selected ranks (an int drops a dim, a ``slice`` keeps it; steps allowed)."""
        return self._with_shape(self._shape.slice(**dims))

    def split(
        self: M,
        dim: str | None = None,
        into: Mapping[str, int] | None = None,
        /,
        **monarch: Sequence[str] | int,
    ) -> M:
        """Split dims into several dims each: Monarch's
        ``split(host=("dp", "pp"), pp=16)`` (one unknown size per split dim is inferred),
        or ``split("host", {"dp": 2, "pp": 16})``. See :meth:`Shape.split`."""
        return self._with_shape(self._shape.split(dim, into, **monarch))

    def flatten(self: M, name: str) -> M:
        """All dims as one named dim."""
        return self._with_shape(self._shape.flatten(name))

    def rename(self: M, **renames: str) -> M:
        """Rename dims: ``mesh.rename(procs="gpus")``."""
        return self._with_shape(self._shape.rename(**renames))


__all__ = ["Shaped"]
