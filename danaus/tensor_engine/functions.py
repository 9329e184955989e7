"""What ``remote(...)`` accepts as the function to run: a callable, or anything one of
:data:`function_resolvers` turns into one (Monarch's ``monarch.function_resolvers``).

Out of the box a string names a function by its import path (``"my_pkg.ops.step"``,
imported on each worker when it runs, so the controller need not import it), and a
callable is itself. Append a resolver of your own to accept other things: it takes the
object given to ``remote`` and returns a picklable callable, or ``None`` to pass.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["FunctionByPath", "function_resolvers", "resolve_function"]


class FunctionByPath:
    """The function at ``path`` (``module.name``, or ``module.Class.method``), imported
    where it is called; it pickles as its path."""

    __slots__ = ("_fn", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fn: Callable[..., Any] | None = None

    def resolve(self) -> Callable[..., Any]:
        if self._fn is None:
            module, _, rest = self.path.partition(".")
            obj: Any = importlib.import_module(module)
            parts = rest.split(".")
            # the longest importable module prefix, then attributes
            for i, part in enumerate(parts):
                try:
                    obj = getattr(obj, part)
                except AttributeError:
                    try:
                        obj = importlib.import_module(".".join([module, *parts[: i + 1]]))
                    except ImportError:
                        raise AttributeError(
                            f"remote function {self.path!r}: {part!r} not found"
                        ) from None
            if not callable(obj):
                raise TypeError(f"remote function {self.path!r} is not callable: {obj!r}")
            self._fn = getattr(obj, "_remote_impl", obj)  # a @remote-wrapped function: its body
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    @property
    def __name__(self) -> str:
        return self.path.rpartition(".")[2]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FunctionByPath, (self.path,))

    def __repr__(self) -> str:
        return f"FunctionByPath({self.path!r})"


def _by_path(arg: object) -> Callable[..., Any] | None:
    if isinstance(arg, str) and "." in arg.strip("."):
        return FunctionByPath(arg)
    return None


def _callable(arg: object) -> Callable[..., Any] | None:
    return arg if callable(arg) else None


#: tried in order by :func:`resolve_function`; the first that does not return None wins
function_resolvers: list[Callable[[object], Callable[..., Any] | None]] = [_by_path, _callable]


def resolve_function(arg: object) -> Callable[..., Any]:
    """The callable ``remote(arg)`` runs; ``ValueError`` naming ``arg`` if no resolver
    takes it."""
    for resolver in function_resolvers:
        fn = resolver(arg)
        if fn is not None:
            return fn
    raise ValueError(
        f"not a function for a remote call: {arg!r} (give a callable or a 'module.function' "
        "path, or add a resolver to function_resolvers)"
    )
