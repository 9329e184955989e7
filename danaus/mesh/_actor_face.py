"""What type checkers see of a spawned actor class. As in Monarch, ``spawn`` is typed as
returning the actor class itself, so that ``mesh.incr.call_one(3)`` is checked against
``def incr(self, n: int) -> int``: the class ``Actor`` statically derives from
:class:`ActorFace` (the actor mesh's members), and ``@endpoint`` statically makes a
:class:`TypedEndpoint`, whose attribute on an instance is a :class:`BoundEndpoint` (the
plain method and the adverbs in one). None of these classes is ever instantiated: at run
time an actor is a plain object, its endpoint attribute the bound method, and what
``spawn`` returns an :class:`~danaus.mesh.ActorMesh`.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Generic, ParamSpec, Self, TypeVar, overload

from ..actors.seam import Endpoint, Future
from ..geometry import Extent, Selector, Shape
from ._actor_endpoint import ActorEndpoint, Stream
from ._admin.records import ActorStats, GoneActorStats, StackEntry
from ._value_mesh import ValueMesh

__all__ = ["ActorFace", "BoundEndpoint", "TypedEndpoint"]

P = ParamSpec("P")
R_co = TypeVar("R_co", covariant=True)
#: what calling the plain method gives (``R`` or a coroutine of it)
C_co = TypeVar("C_co", covariant=True)

_STATIC = "type checkers' view only: an actor instance is not a mesh"


class BoundEndpoint(ActorEndpoint[R_co], Generic[P, R_co, C_co]):
    """``obj.method`` for an endpoint ``method``: on an actor mesh the endpoint with its
    adverbs (``call_one(...) -> Future[R]``), inside the actor the plain bound method
    (``self.method(...) -> C``).

    The adverbs take the method's arguments ``P``, where the run-time class takes any
    (an ``ActorMesh[Foo]`` finds its endpoints by name): narrower than the base class on
    purpose, hence the ``override`` ignores.
    """

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> C_co:
        raise NotImplementedError(_STATIC)

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R_co]:  # type: ignore[override]
        raise NotImplementedError(_STATIC)

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R_co]:  # type: ignore[override]
        raise NotImplementedError(_STATIC)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R_co]]:  # type: ignore[override]
        raise NotImplementedError(_STATIC)

    def stream(self, *args: P.args, **kwargs: P.kwargs) -> Stream[R_co]:  # type: ignore[override]
        raise NotImplementedError(_STATIC)

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:  # type: ignore[override]
        raise NotImplementedError(_STATIC)

    async def post(self, *args: P.args, **kwargs: P.kwargs) -> None:  # type: ignore[override]
        raise NotImplementedError(_STATIC)

    def rref(self, *args: P.args, **kwargs: P.kwargs) -> object:  # type: ignore[override]
        raise NotImplementedError(_STATIC)


class TypedEndpoint(Endpoint[P, R_co], Generic[P, R_co, C_co]):
    """What ``@endpoint`` makes, as type checkers see it: an :class:`Endpoint` that
    remembers what calling the plain method returns."""

    @overload
    def __get__(self, obj: None, owner: type) -> Self: ...
    @overload
    def __get__(self, obj: object, owner: type) -> BoundEndpoint[P, R_co, C_co]: ...
    def __get__(self, obj: object | None, owner: type) -> Self | BoundEndpoint[P, R_co, C_co]:
        raise NotImplementedError(_STATIC)


class ActorFace:
    """The members of :class:`~danaus.mesh.ActorMesh` that what ``spawn`` returns has for
    type checkers, where an actor mesh of ``Foo`` is typed ``Foo``: the shape views
    (which give the same kind of mesh), ``initialized``, ``stop``, ``stats``, ..."""

    @property
    def shape(self) -> Shape:
        raise NotImplementedError(_STATIC)

    @property
    def sizes(self) -> dict[str, int]:
        raise NotImplementedError(_STATIC)

    @property
    def extent(self) -> Extent:
        raise NotImplementedError(_STATIC)

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        raise NotImplementedError(_STATIC)

    def __len__(self) -> int:
        raise NotImplementedError(_STATIC)

    def slice(self, **dims: Selector) -> Self:
        raise NotImplementedError(_STATIC)

    def split(
        self,
        dim: str | None = None,
        into: Mapping[str, int] | None = None,
        /,
        **monarch: Sequence[str] | int,
    ) -> Self:
        raise NotImplementedError(_STATIC)

    def flatten(self, name: str) -> Self:
        raise NotImplementedError(_STATIC)

    def rename(self, **renames: str) -> Self:
        raise NotImplementedError(_STATIC)

    def with_shape(self, shape: Shape) -> Self:
        raise NotImplementedError(_STATIC)

    @property
    def actor_class(self) -> type[Self]:
        raise NotImplementedError(_STATIC)

    @property
    def initialized(self) -> Future[None]:
        raise NotImplementedError(_STATIC)

    def __await__(self) -> Generator[object, None, Self]:
        raise NotImplementedError(_STATIC)

    def rank_addrs(self) -> list[tuple[int, str]]:
        raise NotImplementedError(_STATIC)

    @property
    def failed_ranks(self) -> dict[str, str]:
        raise NotImplementedError(_STATIC)

    def stats(self) -> Future[ValueMesh[ActorStats | GoneActorStats]]:
        raise NotImplementedError(_STATIC)

    def stacks(self) -> Future[ValueMesh[list[StackEntry]]]:
        raise NotImplementedError(_STATIC)

    def stop(self, reason: str = "stopped by its owner") -> Future[None]:
        raise NotImplementedError(_STATIC)
