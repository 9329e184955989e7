"""Errors on the wire: one encoder and one decoder of what a remote failure was.

Danaus's own errors keep their class across the wire; an endpoint's exception becomes an
``ActorError`` carrying its text, its traceback and, where it pickles here and unpickles
there, the exception object itself.
"""

from __future__ import annotations

import pickle

import msgspec

from ..errors import (
    ActorError,
    ClosedError,
    DanausError,
    EndpointNotFoundError,
    RemoteException,
    SerializationError,
    SupervisionError,
    actor_error,
)
from ._serialize import _pickle
from ._wire import ErrorInfo

error_decode = msgspec.msgpack.Decoder(ErrorInfo).decode
_error_encode = msgspec.msgpack.Encoder().encode


def error_from_info(info: ErrorInfo) -> DanausError:
    """Turn wire error data back into the right exception."""
    kind = info.kind
    if kind == "actor":
        return actor_error(
            info.actor,
            info.rank,
            info.exc_type,
            info.message,
            info.traceback,
            _unpickle_exception(info.exception),
        )
    if kind == "remote":
        return RemoteException(
            info.actor, info.rank, info.exc_type, info.message, info.traceback, info.issued_at
        )
    cls: type[DanausError] = {
        "supervision": SupervisionError,
        "serialization": SerializationError,
        "endpoint": EndpointNotFoundError,
        "closed": ClosedError,
    }.get(kind, DanausError)
    return cls(info.message)


def info_from_error(exc: BaseException, actor: str = "", rank: str = "", tb: str = "") -> ErrorInfo:
    kind = "actor"
    if isinstance(exc, SupervisionError):
        kind = "supervision"
    elif isinstance(exc, SerializationError):
        kind = "serialization"
    elif isinstance(exc, EndpointNotFoundError):
        kind = "endpoint"
    elif isinstance(exc, ClosedError):
        kind = "closed"
    if isinstance(exc, RemoteException):
        return ErrorInfo(
            "remote",
            exc.actor,
            exc.rank,
            exc.exc_type,
            exc.message,
            exc.remote_traceback,
            exc.issued_at,
        )
    if isinstance(exc, ActorError):
        return ErrorInfo(
            "actor",
            exc.actor,
            exc.rank,
            exc.exc_type,
            exc.message,
            exc.remote_traceback,
            "",
            _pickle_exception(exc.exception),
        )
    t = type(exc)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    try:
        message = str(exc)
    except Exception as e:  # a __str__ that raises must not lose the error itself
        message = f"<str() of the exception raised {type(e).__name__}: {e}>"
    pickled = _pickle_exception(exc) if kind == "actor" else b""
    return ErrorInfo(kind, actor, rank, name, _utf8(message), _utf8(tb), "", pickled)


#: An exception pickle larger than this travels as text only (it rides in the header).
_MAX_EXCEPTION_PICKLE = 64 << 10


def _pickle_exception(exc: BaseException | None) -> bytes:
    """A pickle of ``exc`` for the caller, or ``b""`` where it would not arrive whole:
    unpicklable, too large, or not unpickling even here (an ``__init__`` whose
    arguments are not its ``args``). Never raises: the text fields still travel."""
    if exc is None or isinstance(exc, DanausError):
        return b""
    try:
        data, buffers = _pickle(exc)
        if buffers or len(data) > _MAX_EXCEPTION_PICKLE:
            return b""
        pickle.loads(data)
    except Exception:
        return b""
    return data


def _unpickle_exception(data: bytes) -> BaseException | None:
    """The remote exception, or ``None`` where it does not unpickle here (its class is
    not importable in this process, say): the caller keeps the text fields."""
    if not data:
        return None
    try:
        exc = pickle.loads(data)
    except Exception:
        return None
    return exc if isinstance(exc, BaseException) else None


def _utf8(text: str) -> str:
    """``text`` as valid UTF-8 for the wire: lone surrogates (from file names that are
    not UTF-8, say) become ``\\udcff`` escapes instead of failing the encoding."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def encode_error(info: ErrorInfo) -> msgspec.Raw:
    try:
        return msgspec.Raw(_error_encode(info))
    except UnicodeEncodeError:  # text that is not UTF-8 (lone surrogates): escape it
        texts = {
            name: _utf8(value)
            for name in info.__struct_fields__
            if isinstance(value := getattr(info, name), str)
        }
        return msgspec.Raw(_error_encode(msgspec.structs.replace(info, **texts)))
