"""Splitting dims of a :class:`~danaus.geometry.Shape` into several: danaus's form
(one dim, every new size) and Monarch's (dims named, sizes inferred)."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence

Dims = tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]
"""(labels, sizes, strides) of a shape."""


def row_major(sizes: Sequence[int]) -> tuple[int, ...]:
    """Strides of a dense row-major layout of ``sizes``."""
    strides: list[int] = []
    stride = 1
    for size in reversed(sizes):
        strides.append(stride)
        stride *= size
    return tuple(reversed(strides))


def split_dim(
    labels: tuple[str, ...],
    sizes: tuple[int, ...],
    strides: tuple[int, ...],
    dim: str,
    into: Mapping[str, int],
    what: str,
) -> Dims:
    """``dim`` (known) replaced by the dims of ``into``, row-major (see ``Shape.split``)."""
    i = labels.index(dim)
    new = {name: operator.index(size) for name, size in into.items()}
    if not new:
        raise ValueError(f"split of dim {dim!r} needs at least one new dim")
    clash = [name for name in new if name != dim and name in labels]
    if clash:
        raise ValueError(f"cannot split {dim!r} into {new}: {clash} already name dims of {what}")
    product = 1
    for size in new.values():
        product *= size
    if product != sizes[i] or any(size < 1 for size in new.values()):
        raise ValueError(
            f"cannot split dim {dim!r} of size {sizes[i]} into {new}: "
            f"the sizes must be at least 1 and multiply to {sizes[i]}, not {product}"
        )
    inner = tuple(s * strides[i] for s in row_major(tuple(new.values())))
    return (
        labels[:i] + tuple(new) + labels[i + 1 :],
        sizes[:i] + tuple(new.values()) + sizes[i + 1 :],
        strides[:i] + inner + strides[i + 1 :],
    )


def split_monarch(
    labels: tuple[str, ...],
    sizes: tuple[int, ...],
    strides: tuple[int, ...],
    kw: Mapping[str, Sequence[str] | int],
    what: str,
) -> Dims:
    """Monarch's ``split(host=("dp", "pp"), pp=16)`` (see ``Shape.split``)."""
    splits: dict[str, tuple[str, ...]] = {}
    known: dict[str, int] = {}  # sizes of new dims, given or inferred
    for key, value in kw.items():
        if key in labels:
            if isinstance(value, str) or not isinstance(value, Sequence):
                raise ValueError(
                    f"split({key}=...) takes a sequence of new dim names for dim {key!r}, "
                    f"like split({key}=('a', 'b'), b=2); got {value!r}"
                )
            if not value or not all(isinstance(n, str) and n for n in value):
                raise ValueError(f"split({key}={value!r}): new dim names must be non-empty strings")
            splits[key] = tuple(value)
        else:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(
                    f"{key!r} is not a dim of {what}: expected an integer size for a new "
                    f"dim, got {value!r}"
                )
            if value < 1:
                raise ValueError(f"size {key}={value} must be at least 1")
            known[key] = value
    unused = set(known)
    new_labels: list[str] = []
    new_sizes_all: list[int] = []
    new_strides: list[int] = []
    for label, size, stride in zip(labels, sizes, strides, strict=True):
        names = splits.get(label, (label,))
        given = 1
        unknown: str | None = None
        for name in names:
            if name in known:
                given *= known[name]
                unused.discard(name)
            elif unknown is None:
                unknown = name
            else:
                raise ValueError(
                    f"Cannot infer the sizes of {names} (splitting {label!r}): both "
                    f"{unknown!r} and {name!r} have unknown size; give at least one, "
                    f"e.g. {name}=4"
                )
        new_sizes = {n: known.get(n, 0) for n in names}
        if unknown is not None:
            inferred, rest = divmod(size, given)
            if rest:
                shown = tuple(known.get(n, "?") for n in names)
                raise ValueError(
                    f"Dimension {label!r} of size {size} is not evenly divided by "
                    f"{names!r} with sizes {shown!r}"
                )
            new_sizes[unknown] = inferred
        elif given != size:
            raise ValueError(
                f"Dimension {label!r} of size {size} is not evenly divided by {names!r} "
                f"with sizes {tuple(new_sizes.values())!r}"
            )
        for name in names:
            if name in new_labels or list(names).count(name) > 1:
                raise ValueError(f"Duplicate dimension name {name!r} in split({dict(kw)})")
        new_labels.extend(names)
        new_sizes_all.extend(new_sizes.values())
        new_strides.extend(s * stride for s in row_major(tuple(new_sizes.values())))
    if unused:
        raise ValueError(
            f"unused size constraints: {tuple(sorted(unused))} name no new dim of split({dict(kw)})"
        )
    return tuple(new_labels), tuple(new_sizes_all), tuple(new_strides)
