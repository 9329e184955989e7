"""Encoding of user values: msgpack for plain data, pickle protocol 5 for the rest.

Plain values (None, bool, int, float, str, small bytes, and lists and str-keyed dicts
of those) ride in the frame header as msgpack: no pickle at all. Everything else is
pickled with protocol 5; buffers over ``config.oob_threshold`` (numpy arrays, torch
CPU tensors, large bytes) become out-of-band frame parts instead of being copied into
the pickle. cloudpickle is used only when plain pickle cannot (lambdas, classes and
functions defined in ``__main__`` or a notebook).
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import cloudpickle
import msgspec

from ..config import config
from ..errors import SerializationError
from ._wire import Buffer

if TYPE_CHECKING:
    import torch

#: What an out-of-band buffer is rebuilt from: a part of the frame, or, in-band, pickle's
PickledBuffer = Buffer | pickle.PickleBuffer

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode

_ATOMS = frozenset({str, int, float, bool, type(None)})
#: bytes shorter than this travel as plain msgpack; longer ones are pickled out of band
_PLAIN_BYTES = 4096


def _is_plain(obj: object, depth: int = 0) -> bool:
    """True when msgpack round-trips ``obj`` to an equal object of the same types.

    (An int too large for msgpack is caught when encoding, which then falls back to pickle.)
    """
    t = type(obj)
    if t in _ATOMS:
        return True
    if depth > 8:
        return False
    if t is list:
        for x in obj:  # type: ignore[attr-defined]
            if type(x) not in _ATOMS and not _is_plain(x, depth + 1):
                return False
        return True
    if t is dict:
        for k, v in obj.items():  # type: ignore[attr-defined]
            if type(k) is not str or (type(v) not in _ATOMS and not _is_plain(v, depth + 1)):
                return False
        return True
    if t is bytes:
        return len(obj) < _PLAIN_BYTES  # type: ignore[arg-type]
    return False


class _NeedCloudpickle(Exception):
    """Plain pickle would store a reference the other process cannot resolve."""


def _rebuild_bytes(buf: PickledBuffer) -> bytes:
    return bytes(buf)


def _rebuild_tensor(
    buf: PickledBuffer, dtype: str, shape: tuple[int, ...], requires_grad: bool, param: bool
) -> torch.Tensor:
    import torch

    dt = getattr(torch, dtype)
    if len(memoryview(buf)) == 0:
        t = torch.empty(shape, dtype=dt)
    else:
        t = torch.frombuffer(buf, dtype=torch.uint8).view(dt).reshape(shape)
    if param:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _reduce_tensor(obj: torch.Tensor) -> object:
    """Reduce a plain CPU tensor to its bytes as a PickleBuffer (out-of-band if large):
    pickle's reduce tuple, or ``NotImplemented`` for a tensor pickled as usual."""
    import torch

    if obj.device.type != "cpu" or obj.is_sparse or obj.is_quantized:
        return NotImplemented
    if type(obj) not in (torch.Tensor, torch.nn.Parameter):
        return NotImplemented
    t = obj.detach().resolve_conj().resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else bytearray()
    dtype = str(t.dtype).removeprefix("torch.")
    return (
        _rebuild_tensor,
        (
            pickle.PickleBuffer(raw),  # type: ignore[arg-type]  # numpy's stubs: no Buffer
            dtype,
            tuple(t.shape),
            obj.requires_grad,
            isinstance(obj, torch.nn.Parameter),
        ),
    )


class _LargeBytes:
    """Marks a large ``bytes`` (pickle's fast path for ``bytes`` skips reducer_override)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def _mark_large_bytes(obj: object, depth: int = 0) -> object:
    """Wrap large ``bytes`` in the first levels of tuples/lists/dicts (a call's arguments
    and their items) for out-of-band travel; deeper ones stay in the pickle."""
    t = type(obj)
    if t is bytes:
        return _LargeBytes(obj) if len(obj) >= config.oob_threshold else obj  # type: ignore[arg-type]
    if depth >= 3:
        return obj
    if t is tuple:
        return tuple(_mark_large_bytes(x, depth + 1) for x in obj)  # type: ignore[attr-defined]
    if t is list:
        return [_mark_large_bytes(x, depth + 1) for x in obj]  # type: ignore[attr-defined]
    if t is dict:
        return {k: _mark_large_bytes(v, depth + 1) for k, v in obj.items()}  # type: ignore[attr-defined]
    return obj


def _override(obj: object) -> object:
    """pickle's reduce tuple for ``obj``, or ``NotImplemented`` (pickled as usual)."""
    t = type(obj)
    if t is _LargeBytes:
        return (_rebuild_bytes, (pickle.PickleBuffer(cast(_LargeBytes, obj).data),))
    if "torch" in sys.modules and t.__module__.startswith("torch"):
        import torch

        if isinstance(obj, torch.Tensor):
            return _reduce_tensor(obj)
    return NotImplemented


# The stubs' return type of reducer_override is a private alias (with Any in it): ours say
# object, a reduce tuple or NotImplemented, which pickle checks as it goes.
class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: object) -> object:  # type: ignore[override]
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) in (
            "__main__",
            "__mp_main__",
        ):
            raise _NeedCloudpickle
        return _override(obj)


class _CloudPickler(cloudpickle.Pickler):  # type: ignore[misc]
    def reducer_override(self, obj: object) -> object:
        r = _override(obj)
        if r is NotImplemented:
            return super().reducer_override(obj)
        return r


def _pickle(obj: object) -> tuple[bytes, list[pickle.PickleBuffer]]:
    threshold = config.oob_threshold
    buffers: list[pickle.PickleBuffer] = []

    def keep(b: pickle.PickleBuffer) -> bool:
        if b.raw().nbytes >= threshold:
            buffers.append(b)
            return False  # out-of-band
        return True

    obj = _mark_large_bytes(obj)
    f = io.BytesIO()
    try:
        _Pickler(f, protocol=5, buffer_callback=keep).dump(obj)
    except (_NeedCloudpickle, pickle.PicklingError, AttributeError, TypeError):
        buffers.clear()
        f = io.BytesIO()
        _CloudPickler(f, protocol=5, buffer_callback=keep).dump(obj)
    return f.getvalue(), buffers


def dumps(obj: object, what: Callable[[], str]) -> tuple[msgspec.Raw, bool, list[Buffer]]:
    """Encode ``obj`` as ``(raw, pickled, parts)``.

    Small plain values ride in the header as msgpack. Others are pickled; a pickle over
    ``config.oob_threshold`` (a long string, a list of millions of ints) travels as the
    last out-of-band part, with a marker in the header, so that headers stay small.

    Args:
        obj: the value.
        what: describes ``obj`` for an error message, e.g. ``"arguments of Foo.bar"``.

    Raises:
        SerializationError: ``obj`` cannot be pickled, or is larger than
            ``config.max_frame_bytes``; the message names what and why.
    """
    if _is_plain(obj):
        try:
            data = _encode(obj)
        except (OverflowError, UnicodeEncodeError):
            pass  # an int beyond 64 bits, a str with lone surrogates: pickle keeps them
        else:
            if len(data) <= config.oob_threshold:
                return msgspec.Raw(data), False, []
    try:
        pickled, buffers = _pickle(obj)
    except Exception as e:  # anything a __reduce__ may raise
        raise SerializationError(f"{what()} could not be pickled: {type(e).__name__}: {e}") from e
    parts: list[Buffer] = [b.raw() for b in buffers]
    size = len(pickled) + sum(memoryview(p).nbytes for p in parts)
    if size > config.max_frame_bytes:
        raise SerializationError(
            f"{what()} is {size:,} bytes, over the {config.max_frame_bytes:,}-byte frame "
            "limit (config.max_frame_bytes, DANAUS_MAX_FRAME_BYTES); send it as an "
            "RDMABuffer, or raise the limit on both ends"
        )
    if len(pickled) > config.oob_threshold:
        parts.append(pickled)
        return _OOB_PICKLE, True, parts
    return msgspec.Raw(_encode(pickled)), True, parts


#: In the header of a pickled value: "the pickle is the last part" (not in the header).
_OOB_PICKLE = msgspec.Raw(_encode(0))


def dumps_args(
    args: tuple[object, ...], kwargs: dict[str, object], what: Callable[[], str]
) -> tuple[msgspec.Raw, bool, list[Buffer]]:
    """Encode a call's arguments; the receiver's ``loads`` gives ``[args, kwargs]``."""
    for a in args:
        if type(a) not in _ATOMS and not _is_plain(a, 1):
            break
    else:
        if not kwargs or _is_plain(kwargs):
            try:
                # The tuples become msgpack arrays: the receiver unpacks them with *args.
                data = _encode((args, kwargs))
            except (OverflowError, UnicodeEncodeError):
                pass
            else:
                if len(data) <= config.oob_threshold:
                    return msgspec.Raw(data), False, []
    return dumps((args, kwargs), what)


def loads(
    raw: msgspec.Raw | bytes, pickled: bool, parts: Sequence[Buffer], what: Callable[[], str]
) -> object:
    """Decode what :func:`dumps` made: a value of the sender's user, unchecked.

    Raises:
        SerializationError: the value cannot be decoded or unpickled here (e.g. its
        class is not importable in this process).
    """
    try:
        value = _decode(raw)
        if pickled:
            if type(value) is int:  # the pickle came as the last part
                if not parts:
                    raise ValueError("the out-of-band pickle part is missing")
                value, parts = parts[-1], parts[:-1]
            value = pickle.loads(value, buffers=parts)
    except Exception as e:
        raise SerializationError(f"{what()} could not be unpickled: {type(e).__name__}: {e}") from e
    return value


#: A call's arguments as :func:`loads_args` gives them: a tuple (or a msgpack list) and a dict
Args = tuple[tuple[object, ...] | list[object], dict[str, object]]


def loads_args(raw: msgspec.Raw | bytes, parts: Sequence[Buffer], what: Callable[[], str]) -> Args:
    """Decode the pickled arguments :func:`dumps_args` made: ``(args, kwargs)``.

    Not checked here, per call: the peer passed the handshake and runs this code, whose
    ``dumps_args`` pickles exactly this pair.

    Raises:
        SerializationError: as :func:`loads`.
    """
    return cast(Args, loads(raw, True, parts, what))


def encode_plain(obj: object) -> msgspec.Raw:
    """msgpack of a value known to be plain (protocol-internal data)."""
    return msgspec.Raw(_encode(obj))
