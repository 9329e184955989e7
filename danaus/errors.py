"""The one error tree of danaus.

Each class says whose fault it is: your code (a wrong argument, a closed object),
the remote code you called (an endpoint that raised), or something outside both
(a process that died, a peer that sent garbage).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = [
    "ActorError",
    "AuthenticationError",
    "ClosedError",
    "DanausError",
    "DataDependentError",
    "DeadlockError",
    "EndpointNotFoundError",
    "ProtocolError",
    "RDMABackendUnavailableError",
    "RDMABufferDroppedError",
    "RDMABufferError",
    "RDMAError",
    "RDMAOwnerError",
    "RDMATransferError",
    "RemoteException",
    "SerializationError",
    "SupervisionError",
]


class DanausError(Exception):
    """Base of every error danaus raises (timeouts raise the builtin ``TimeoutError``)."""


class ActorError(DanausError):
    """Remote code's fault: an endpoint (or an actor's ``__init__``) raised.

    The actor survives an endpoint that raised for a caller that waits, and serves
    the next call. The remote traceback travels as text, and the exception itself as
    ``exception`` where it could be pickled there and unpickled here.

    When the remote exception's type is importable here and is an ``Exception`` that
    can be subclassed, the error raised is also an instance of that type (a class
    made for it, named like ``ActorError(ValueError)``), so ``except ValueError``
    catches it; its ``args`` and attributes are the remote exception's. Otherwise it is
    a plain ``ActorError``.

    Attributes:
        actor: the actor's id text, like ``world.procs[1].counter[1]``.
        rank: the actor's rank in named coordinates, as text (``{'procs': 1/2}``).
        exc_type: qualified name of the remote exception's type.
        message: ``str()`` of the remote exception.
        remote_traceback: the formatted remote traceback (``exception_formatted``: the
            same, in Monarch's words).
        exception: the remote exception object (without its traceback), or ``None``
            when it could not travel (not picklable there, or not importable here).
    """

    exception: BaseException | None = None

    def __init__(
        self,
        actor: str,
        rank: str,
        exc_type: str,
        message: str,
        remote_traceback: str,
        exception: BaseException | None = None,
    ) -> None:
        self.actor = actor
        self.rank = rank
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = remote_traceback
        self.exception = exception
        super().__init__(actor, rank, exc_type, message, remote_traceback)

    @property
    def exception_formatted(self) -> str:
        """The remote traceback as Monarch's ``ActorError.exception_formatted`` gives it:
        its first line says it is where the remote call failed."""
        return self.remote_traceback.replace(
            "Traceback (most recent call last):",
            "Traceback of where the remote call failed (most recent call last):",
        )

    def __str__(self) -> str:
        return (
            f"{self.exc_type}: {self.message}\n"
            f"  raised in actor {self.actor} at rank {self.rank}\n"
            f"remote traceback:\n{self.remote_traceback.rstrip()}"
        )


class EndpointNotFoundError(DanausError, AttributeError):
    """Your code's fault: the named endpoint does not exist; the message lists those that do."""


class SerializationError(DanausError, TypeError):
    """Your code's fault: an argument or result could not be pickled or unpickled.

    Only the call that carried it fails; nothing else is affected.
    """


class SupervisionError(DanausError, RuntimeError):
    """Outside fault: the actor or proc you called failed, exited or was stopped.

    Calls in flight to it fail with this error instead of waiting forever; later
    calls fail at once. As Monarch's, it is a ``RuntimeError``, and an endpoint's call
    that failed so reads ``Endpoint call mesh.method() failed, <why>``.

    Attributes:
        message: why, without the endpoint.
        endpoint: the call that failed, as ``mesh.method()``, or ``None``.
    """

    #: for a call whose actor's proc was lost: (its rank, why); the mesh layer, which
    #: knows the actor's name and class, words the message from it
    lost: tuple[int, str] | None = None

    def __init__(self, message: str = "", endpoint: str | None = None) -> None:
        self.message = message
        self.endpoint = endpoint
        if endpoint is None:
            super().__init__(message)
        else:
            super().__init__(message, endpoint)

    def __str__(self) -> str:
        if self.endpoint is None:
            return self.message
        return f"Endpoint call {self.endpoint} failed, {self.message}"

    def for_endpoint(self, endpoint: str) -> SupervisionError:
        """This error as the call to ``endpoint`` (``mesh.method()``) raises it; itself
        when it names an endpoint already or is a subclass (an RDMA owner's, say)."""
        if self.endpoint is not None or type(self) is not SupervisionError:
            return self
        return SupervisionError(self.message, endpoint)


def actor_display_name(proc: str, class_name: str, mesh: str, point: object) -> str:
    """How failure reports name an actor, in Monarch's form: the proc, then the class
    and the mesh's name with the actor's point (``procs[0].<app.Trainer trainers{'gpus':
    0/2}>``); its users match on the class and the mesh name in these reports."""
    return f"{proc}.<{class_name} {mesh}{point}>"


def actor_failed(actor: str, why: str) -> str:
    """What a call to ``actor``, which failed for ``why``, hears: in Monarch's words (its
    users match on "The actor ... and all its descendants have failed"); a ``why`` of
    several lines (a traceback) follows, indented, on lines of its own."""
    why = why.strip()
    if "\n" not in why:
        return f"The actor {actor} and all its descendants have failed: {why}"
    return f"The actor {actor} and all its descendants have failed:\n  " + why.replace("\n", "\n  ")


def a_type(value: object) -> str:
    """The type of ``value`` with its article, for messages: ``"an int"``, ``"a str"``."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


class ClosedError(DanausError):
    """Your code's fault: the object (mesh, port, runtime) was already closed or stopped."""


class DeadlockError(DanausError, RuntimeError):
    """Your code's fault: this wait could never end, so it raises instead of hanging.

    Raised by ``Future.get()`` on a future of the event loop that the calling thread
    runs (use ``await``), and when an actor waits for a call to itself from inside one
    of its own endpoints (it handles one message at a time, so that call could only run
    after the waiting endpoint returns). The message names the cycle.
    """


class ProtocolError(DanausError):
    """A peer's fault: it sent a malformed, truncated or oversized frame.

    Only that peer's connection is closed; the proc keeps serving everyone else.
    """


class AuthenticationError(ProtocolError):
    """A peer's fault: it did not prove that it holds the job's secret key."""


class RDMAError(DanausError):
    """Base of the data plane's errors (``danaus.rdma``)."""


class RDMABufferError(RDMAError, ValueError):
    """Your code's fault: a buffer or destination that cannot be used as given
    (not contiguous, not writable, wrong size, range outside the buffer)."""


class RDMABufferDroppedError(RDMAError):
    """Your code's fault: the buffer was dropped (``await buf.drop()``) before this use."""


class RDMAOwnerError(RDMAError, SupervisionError):
    """Outside fault: the proc that owns the buffer died or became unreachable mid-transfer.

    The destination is then reported as not (fully) written.
    """


class RDMABackendUnavailableError(RDMAError):
    """Setup problem: the backend asked for (``DANAUS_RDMA_BACKEND``) cannot run here."""


class RDMATransferError(RDMAError):
    """Outside fault: the transport failed the transfer (e.g. an ibverbs work completion
    error); the destination is not (fully) written."""


class DataDependentError(DanausError, TypeError):
    """Your code asked the controller for a value that lives on the workers (``.item()``,
    ``bool(t)``, ``torch.equal`` on a ``DTensor``): fetch it first (``inspect``,
    ``fetch_shard``). Also a ``TypeError``, as torch raises for such uses."""


class RemoteException(ActorError):
    """Remote code's fault: a tensor-engine operation failed on a worker.

    Raised when a result of the failed operation (or of anything that depended on it) is
    fetched. Besides ``ActorError``'s fields, ``issued_at`` is the controller line that
    issued the operation. The workers keep running.
    """

    def __init__(
        self,
        actor: str,
        rank: str,
        exc_type: str,
        message: str,
        remote_traceback: str,
        issued_at: str = "",
    ) -> None:
        super().__init__(actor, rank, exc_type, message, remote_traceback)
        self.issued_at = issued_at
        self.args = (actor, rank, exc_type, message, remote_traceback, issued_at)

    def __str__(self) -> str:
        where = f"\n  issued on the controller at {self.issued_at}" if self.issued_at else ""
        return super().__str__().replace("\nremote traceback:", f"{where}\nremote traceback:", 1)


def actor_error(
    actor: str,
    rank: str,
    exc_type: str,
    message: str,
    remote_traceback: str,
    exception: BaseException | None = None,
) -> ActorError:
    """The error a caller gets for a remote exception: an instance of both
    :class:`ActorError` and the remote exception's type where that works (see
    :class:`ActorError`), else a plain ``ActorError``. Never raises."""
    if exception is not None:
        cls = _dual_class(type(exception))
        if cls is not None:
            try:
                return _make_dual(cls, exception, actor, rank, exc_type, message, remote_traceback)
            except Exception:  # an unusual __new__ or state: the plain error below
                pass
    return ActorError(actor, rank, exc_type, message, remote_traceback, exception)


_duals: dict[type, type[ActorError] | None] = {}
_duals_lock = threading.Lock()


def _dual_class(t: type[BaseException]) -> type[ActorError] | None:
    """``ActorError(T)``: a subclass of both, made once per ``T``; ``None`` where ``T`` is
    not an ``Exception``, is one of ours, or cannot be a base (``@final``, a C layout
    that clashes)."""
    if not issubclass(t, Exception) or issubclass(t, DanausError):
        return None
    with _duals_lock:
        if t in _duals:
            return _duals[t]
        cls: type[ActorError] | None
        try:
            cls = type(
                f"ActorError({t.__name__})",
                (ActorError, t),
                {
                    "__module__": __name__,
                    "__init__": _dual_init,
                    "__str__": ActorError.__str__,
                    "__repr__": _dual_repr,
                    "__reduce__": _dual_reduce,
                },
            )
        except TypeError:
            cls = None
        _duals[t] = cls
        return cls


def _make_dual(
    cls: type[ActorError],
    exception: BaseException,
    actor: str,
    rank: str,
    exc_type: str,
    message: str,
    remote_traceback: str,
) -> ActorError:
    try:
        err = Exception.__new__(cls)
    except TypeError:  # a C base with its own __new__ (OSError): "not safe", use it
        err = type(exception).__new__(cls)
    # The remote exception's attributes (e.code, an OSError's errno), then ours on top.
    if isinstance(exception, OSError):
        for name in ("errno", "strerror", "filename", "filename2"):
            setattr(err, name, getattr(exception, name))
    err.__dict__.update(getattr(exception, "__dict__", {}))
    _dual_init(err, actor, rank, exc_type, message, remote_traceback, exception)
    return err


def _dual_init(
    self: ActorError,
    actor: str,
    rank: str,
    exc_type: str,
    message: str,
    remote_traceback: str,
    exception: BaseException | None = None,
) -> None:
    self.actor = actor
    self.rank = rank
    self.exc_type = exc_type
    self.message = message
    self.remote_traceback = remote_traceback
    self.exception = exception
    self.args = exception.args if exception is not None else (message,)


def _dual_repr(self: ActorError) -> str:
    return f"{type(self).__name__}({self.exc_type}: {self.message!r}, actor={self.actor!r})"


def _dual_reduce(self: ActorError) -> tuple[Any, ...]:
    return (
        actor_error,
        (
            self.actor,
            self.rank,
            self.exc_type,
            self.message,
            self.remote_traceback,
            self.exception,
        ),
    )
