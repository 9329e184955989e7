"""Geometry: where ranks lie, below every layer that addresses them.

A flat rank space seen through named dims: :class:`NDSlice` (a strided set of ranks),
:class:`Region` (one with a name per dim), :class:`Selection` (an expression that picks
ranks), :class:`Point` and :class:`Extent` (one rank in named coordinates, and the sizes
it lies in), :class:`Shape` (a region of a mesh: slicing, splitting, flattening,
renaming) and :class:`Shaped`, the views every mesh shares over its shape. The actor
layer (an actor's rank) and the mesh layer (a mesh's shape) both import it; it imports
neither.
"""

from ._ndslice import NDSlice, Region, Selection
from ._point import Extent, Point, point_in_region
from ._shape import Selector, Shape
from ._views import Shaped

__all__ = [
    "Extent",
    "NDSlice",
    "Point",
    "Region",
    "Selection",
    "Selector",
    "Shape",
    "Shaped",
    "point_in_region",
]
