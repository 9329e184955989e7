"""What is built on actor endpoints: ``Accumulator`` (an endpoint's results reduced on
the way up the casting tree), ``send`` (Monarch's call without a future: results to a
port, or dropped), ``as_endpoint`` (a plain method of a spawned actor called through the
adverbs), and ``NotAnEndpoint``, what ``mesh.method`` is for such a method."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, NoReturn, TypeVar, cast

from ..actors.seam import (
    AS_ENDPOINT,
    ERROR,
    Actor,
    Future,
    Port,
    current_runtime,
    dumps,
    forward,
)
from ..config import config
from ..errors import EndpointNotFoundError
from ._actor_endpoint import ActorEndpoint, as_error

if TYPE_CHECKING:
    from ._actor_mesh import ActorMesh

__all__ = ["Accumulator", "NotAnEndpoint", "as_endpoint", "send"]

#: an endpoint's result
R = TypeVar("R")
T = TypeVar("T")
#: an accumulator's running value
V = TypeVar("V")


class Accumulator(Generic[R, V]):
    """Reduce an endpoint's results over a mesh: ``Accumulator(mesh.value, 0, operator.add)``.

    Results are combined on the way up the casting tree (so ``combine`` must be
    associative, and take its own results as well as the endpoint's), and the caller
    gets ``combine(identity, reduced)``.
    """

    def __init__(
        self, endpoint: ActorEndpoint[R], identity: V, combine: Callable[[V, R], V]
    ) -> None:
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: object, **kwargs: object) -> Future[V]:
        ep = self._endpoint
        enc = ep.encode_args(args, kwargs)
        rt = current_runtime()
        fut: Future[V] = Future(loop=rt.loop)
        ranks = ep.mesh.global_ranks()
        acc = [self._identity]
        left = [len(ranks)]
        combine = self._combine

        def on_reply(rank: int, status: int, value: object) -> bool:
            left[0] -= 1
            if fut.done():
                return left[0] <= 0
            if status == ERROR:
                fut.set_exception(as_error(value))
            else:
                try:  # a rank's result, or (through a casting tree) a subtree's reduced one
                    acc[0] = combine(acc[0], cast("R", value))
                except Exception as e:
                    fut.set_exception(e)
            if left[0] <= 0 and not fut.done():
                fut.set_result(acc[0])
            return left[0] <= 0

        reducer = dumps((self._identity, combine), lambda: "the accumulator's combine function")
        port = rt.open_port(on_reply)
        if config.cast_fanout and len(ranks) > config.cast_fanout:
            # Each top-level subtree answers once, with its reduced value.
            left[0] = min(config.cast_fanout, len(ranks))
        ep.send_encoded(rt, ranks, port, enc, (reducer[0], reducer[1]))
        return fut


class NotAnEndpoint:
    """``mesh.method`` for a plain method (not an ``@endpoint``) of the actor class: not
    callable as is; ``as_endpoint(mesh.method)`` makes an endpoint of it, as in Monarch."""

    def __init__(self, mesh: ActorMesh[Actor], name: str) -> None:
        self._mesh = mesh
        self._name = name

    @property
    def mesh(self) -> ActorMesh[Actor]:
        """The actors whose plain method this is."""
        return self._mesh

    @property
    def name(self) -> str:
        """The method's name."""
        return self._name

    def __repr__(self) -> str:
        return f"<plain method {self._mesh.actor_class.__name__}.{self._name} of {self._mesh!r}>"

    def __getattr__(self, adverb: str) -> NoReturn:
        if adverb.startswith("__"):
            raise AttributeError(adverb)
        raise EndpointNotFoundError(
            f"{self._mesh.actor_class.__name__}.{self._name} is a plain method, not an @endpoint: "
            f"mark it @endpoint, or call it through as_endpoint(mesh.{self._name}).{adverb}(...)"
        )


def as_endpoint(
    not_an_endpoint: object, *, propagate: object = None, explicit_response_port: bool = False
) -> ActorEndpoint[object]:
    """Call a plain method of a spawned actor (not an ``@endpoint``) with the adverbs:
    ``as_endpoint(mesh.method).call(...)``, as in Monarch.

    Args:
        not_an_endpoint: ``mesh.method`` for a plain method of the actor class.
        propagate: accepted for Monarch compatibility.
        explicit_response_port: the method gets the caller's reply port as its first
            argument and answers through it (see ``endpoint``).

    Raises:
        ValueError: ``not_an_endpoint`` is not a plain method of an actor mesh.
    """
    del propagate
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise ValueError(
            f"as_endpoint expects a plain method of an actor mesh (mesh.method), got "
            f"{not_an_endpoint!r}"
        )
    kind = "port" if explicit_response_port else "call"
    return ActorEndpoint(not_an_endpoint.mesh, f"{AS_ENDPOINT}{kind}:{not_an_endpoint.name}")


def send(
    endpoint: ActorEndpoint[object],
    args: tuple[object, ...],
    kwargs: dict[str, object],
    port: Port[T] | None = None,
    selection: str = "all",
) -> None:
    """Send a call without waiting for it, as Monarch's ``send``.

    Args:
        endpoint: ``mesh.method`` (or a slice's).
        args: positional arguments.
        kwargs: keyword arguments.
        port: where each actor's result (or error) goes; a receiver from
            ``Channel.open_ranked()`` gets ``(rank, value)`` pairs, ``rank`` being the
            actor's place in the mesh called. ``None``: results are dropped (an endpoint
            that raises then fails its actor, as with ``broadcast``).
        selection: ``"all"`` (every actor) or ``"choose"`` (one of them).

    Raises:
        ValueError: ``selection`` is neither ``"all"`` nor ``"choose"``.
    """
    if selection not in ("all", "choose"):
        raise ValueError(f"send(selection=...) takes 'all' or 'choose', not {selection!r}")
    resolve = getattr(endpoint, "endpoint_call", None)
    if resolve is not None:  # a tensor engine @remote function: its workers' endpoint
        endpoint, args, kwargs = resolve(args, kwargs)
    if not isinstance(endpoint, ActorEndpoint):
        raise TypeError(
            f"send() takes an endpoint of an actor mesh (mesh.method), got {endpoint!r}"
        )
    if port is None:
        if selection == "all":
            endpoint.broadcast(*args, **kwargs)
        else:
            endpoint.choose(*args, **kwargs)  # its result is dropped
        return
    enc = endpoint.encode_args(args, kwargs)
    rt = current_runtime()
    mesh = endpoint.mesh
    ranks = mesh.global_ranks()
    if selection == "choose":
        i = mesh.next_turn(len(ranks))
        ranks = [ranks[i]]
        index = {ranks[0]: i}
    else:
        index = {g: i for i, g in enumerate(ranks)}
    left = [len(ranks)]

    def on_reply(rank: int, status: int, value: object) -> bool:
        left[0] -= 1
        forward(rt, port, index.get(rank, -1), status, value)
        return left[0] == 0

    endpoint.send_encoded(rt, ranks, rt.open_port(on_reply), enc)
