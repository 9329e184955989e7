"""``Actor`` and ``@endpoint``: what a user writes. The mailbox that runs an actor's
messages is in ``_instance``."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import (
    TYPE_CHECKING,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    Self,
    TypeAlias,
    TypeVar,
    cast,
    overload,
)

import msgspec

if TYPE_CHECKING:
    # What type checkers see of an actor class: ``spawn`` returns the class's type, so
    # an actor statically carries the actor mesh's members and its endpoints' adverbs
    # (``danaus.mesh._actor_face``); at run time an ``Actor`` is a plain object.
    from ..mesh.seam import ActorFace as _ActorBase
    from ..mesh.seam import TypedEndpoint
    from ._port import Port
else:
    _ActorBase = object

__all__ = ["Actor", "Endpoint", "concurrent_endpoint", "endpoint"]

_plain_decode = msgspec.msgpack.Decoder().decode
_plain_encode = msgspec.msgpack.Encoder().encode

log = logging.getLogger("danaus.actor")

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
#: the ``self`` of an endpoint's method
S = TypeVar("S")

#: what an ``async def`` returns when called
Coro = Coroutine[object, object, R]


class Endpoint(Generic[P, R_co]):
    """A method of an :class:`Actor` that other actors and the controller may call.

    On an actor instance the attribute is the plain bound method; on an actor mesh it
    is an endpoint reference with ``call``, ``call_one``, ``broadcast``, ... (type
    checkers see both on the instance: see ``danaus.mesh._actor_face``).

    Attributes:
        is_async: an ``async def`` (runs on the proc's event loop); a plain ``def`` runs
            on the actor's own thread, so it may block for as long as it likes.
        explicit_response_port: the endpoint gets a :class:`Port` as its first argument
            and answers through it (``port.send(v)`` / ``port.exception(e)``), when it
            likes; its return value is ignored.
        concurrent: (async only) other messages may run while this one awaits.
        long_running: it runs as long as what it serves (a shell, a server's loop): never
            reported as stuck, however long it runs (danaus's own option).
    """

    def __init__(
        self,
        fn: Callable[Concatenate[S, P], R_co] | Callable[Concatenate[S, P], Awaitable[R_co]],
        *,
        propagate: object = None,
        explicit_response_port: bool = False,
        instrument: bool = False,
        concurrent: bool = False,
        long_running: bool = False,
    ) -> None:
        # The method's own signature lives on in ``P`` and ``R``; the runtime calls it
        # with decoded values, so it keeps the function as a ``Method``.
        self.fn = cast(Method, fn)
        self.name: str = fn.__name__
        self.is_async = inspect.iscoroutinefunction(fn)
        self.propagate = propagate
        self.explicit_response_port = explicit_response_port
        self.instrument = instrument
        if concurrent and not self.is_async:
            raise ValueError(
                f"concurrent_endpoint can only wrap async endpoints: "
                f"{fn.__qualname__} is a plain def"
            )
        self.concurrent = concurrent
        self.long_running = long_running
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Self: ...
    @overload
    def __get__(self, obj: object, owner: type) -> Callable[P, object]: ...
    def __get__(self, obj: object | None, owner: type) -> Self | Callable[P, object]:
        if obj is None:
            return self
        return self.fn.__get__(obj, owner)

    def __repr__(self) -> str:
        kind = "concurrent endpoint" if self.concurrent else "endpoint"
        return f"<{kind} {self.name}>"


def is_long_running(obj: object, method: str) -> bool:
    """Whether ``obj``'s endpoint ``method`` says it runs as long as what it serves
    (``@endpoint(long_running=True)``): not to be reported as stuck."""
    ep = getattr(type(obj), method, None)
    return isinstance(ep, Endpoint) and ep.long_running


#: An endpoint whatever its signature, as an actor class's table holds it. Nothing that
#: reads a table calls through ``P`` (the runtime calls ``fn`` with the caller's values),
#: so an empty ``P`` stands in for "any", which mypy would spell ``...``: an explicit Any.
SomeEndpoint: TypeAlias = "Endpoint[[], object]"


class Method(Protocol):
    """An endpoint's function as the runtime sees it: called with the actor and the
    caller's values, which only the call itself checks."""

    def __call__(self, *args: object, **kwargs: object) -> object: ...
    def __get__(self, obj: object, owner: type | None = None, /) -> Method: ...


class _Decorator(Protocol):
    """What ``@endpoint(...)`` (options, no port) returns."""

    @overload
    def __call__(
        self, fn: Callable[Concatenate[S, P], Coro[R]], /
    ) -> TypedEndpoint[P, R, Coro[R]]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[S, P], R], /) -> TypedEndpoint[P, R, R]: ...


class _PortDecorator(Protocol):
    """What ``@endpoint(explicit_response_port=True)`` returns: the method's first
    argument, a ``Port[R]``, is the caller's, not an argument of the adverbs."""

    @overload
    def __call__(
        self, fn: Callable[Concatenate[S, Port[R], P], Coro[None]], /
    ) -> TypedEndpoint[P, R, Coro[None]]: ...
    @overload
    def __call__(
        self, fn: Callable[Concatenate[S, Port[R], P], None], /
    ) -> TypedEndpoint[P, R, None]: ...


@overload
def endpoint(fn: Callable[Concatenate[S, P], Coro[R]], /) -> TypedEndpoint[P, R, Coro[R]]: ...
@overload
def endpoint(fn: Callable[Concatenate[S, P], R], /) -> TypedEndpoint[P, R, R]: ...
@overload
def endpoint(
    *,
    propagate: object = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = False,
    long_running: bool = False,
) -> _Decorator: ...
@overload
def endpoint(
    *,
    propagate: object = None,
    explicit_response_port: Literal[True],
    instrument: bool = False,
    long_running: bool = False,
) -> _PortDecorator: ...
def endpoint(
    fn: Callable[Concatenate[S, P], object] | None = None,
    *,
    propagate: object = None,
    explicit_response_port: bool = False,
    instrument: bool = False,
    long_running: bool = False,
) -> object:  # the overloads say what
    """Mark an actor method (sync or ``async def``) as callable from other processes.

    Usable bare (``@endpoint``) or called (``@endpoint(explicit_response_port=True)``).
    An actor handles one message at a time, in arrival order: async endpoints on the
    proc's event loop, sync ones on the actor's own thread (they may block for hours
    and call other actors with ``.get()``; the proc keeps answering meanwhile).

    Args:
        propagate: accepted for Monarch compatibility (tensor-engine shape propagation).
        explicit_response_port: pass the endpoint a ``Port`` to answer through, as
            Monarch does; raising without answering fails the actor (the caller gets
            ``SupervisionError``).
        instrument: accepted for Monarch compatibility.
        long_running: it runs as long as what it serves (a shell, a server's loop):
            never reported as stuck (``config.stuck_warn_after``), however long it
            runs, and its actor shows as busy, not stuck.
    """
    if fn is None:
        return functools.partial(
            _make_endpoint,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
            long_running=long_running,
        )
    return _make_endpoint(
        fn,
        propagate=propagate,
        explicit_response_port=explicit_response_port,
        instrument=instrument,
        long_running=long_running,
    )


def _make_endpoint(
    fn: Callable[Concatenate[S, P], object],
    *,
    propagate: object,
    explicit_response_port: bool,
    instrument: bool,
    concurrent: bool = False,
    long_running: bool = False,
) -> Endpoint[P, object]:
    return Endpoint(
        fn,
        propagate=propagate,
        explicit_response_port=explicit_response_port,
        instrument=instrument,
        concurrent=concurrent,
        long_running=long_running,
    )


@overload
def concurrent_endpoint(
    fn: Callable[Concatenate[S, P], Coro[R]], /
) -> TypedEndpoint[P, R, Coro[R]]: ...
@overload
def concurrent_endpoint(
    *,
    propagate: object = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = False,
    long_running: bool = False,
) -> _Decorator: ...
@overload
def concurrent_endpoint(
    *,
    propagate: object = None,
    explicit_response_port: Literal[True],
    instrument: bool = False,
    long_running: bool = False,
) -> _PortDecorator: ...
def concurrent_endpoint(
    fn: Callable[Concatenate[S, P], object] | None = None,
    *,
    propagate: object = None,
    explicit_response_port: bool = False,
    instrument: bool = False,
    long_running: bool = False,
) -> object:  # the overloads say what
    """An async endpoint that does not hold the actor's mailbox while it awaits.

    It starts in arrival order like any message, but the next message starts as soon as
    this one first awaits, so a handler that waits for a later message (a barrier, a
    rendezvous, a resource pool) does not deadlock. An exception it raises still answers
    its caller; with ``explicit_response_port=True`` one that escapes unanswered fails
    the actor, as in Monarch.

    Raises:
        ValueError: the method is not an ``async def``.
    """
    if fn is None:
        return functools.partial(
            concurrent_endpoint,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
            long_running=long_running,
        )
    if isinstance(fn, Endpoint):
        raise ValueError(
            "concurrent_endpoint does not wrap @endpoint; pass the endpoint "
            "options to @concurrent_endpoint itself"
        )
    return _make_endpoint(
        fn,
        propagate=propagate,
        explicit_response_port=explicit_response_port,
        instrument=instrument,
        concurrent=True,
        long_running=long_running,
    )


class Actor(_ActorBase):
    """Base class of actors. Subclass it and mark methods with :func:`endpoint`.

    ``__init__(*args, **kwargs)`` runs in the actor's proc when the mesh is spawned,
    before the first message is handled. An actor handles one message at a time, in
    arrival order; messages from one sender arrive in the order sent.
    """

    __endpoints__: dict[str, SomeEndpoint] = {}

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """A logger named after the actor's class, at DEBUG (Monarch's ``Actor.logger``);
        its records reach the controller like the proc's other log lines."""
        lgr = logging.getLogger(type(self).__name__)
        lgr.setLevel(logging.DEBUG)
        return lgr

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        eps: dict[str, SomeEndpoint] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, Endpoint):
                    eps[name] = value
                elif name in eps:
                    del eps[name]  # overridden by a non-endpoint
        cls.__endpoints__ = eps


#: Marks a call's method name as a plain method called through ``as_endpoint``:
#: ``"\x00as:call:name"`` (returns its result) or ``"\x00as:port:name"`` (explicit port).
AS_ENDPOINT = "\x00as:"


def endpoints_of(cls: type) -> dict[str, SomeEndpoint]:
    eps: dict[str, SomeEndpoint] = getattr(cls, "__endpoints__", {})
    return eps


def describe_endpoints(cls: type) -> str:
    names = sorted(endpoints_of(cls))
    return ", ".join(names) if names else "(none)"
