"""What goes back to the caller of an actor's message once it ran: the :class:`Replier`
turns each outcome (a value, an exception, a cancellation, a stop) into a reply, encoding
a value as plain msgpack when it is a small atom and as a pickle with out-of-band parts
otherwise, and an exception as an :class:`ErrorInfo` with the user's traceback; an error
that nobody waits for fails the actor (a spawned one; an installed system actor logs it).
Replies coming back to this runtime are ``_replies_in``'s. It also holds the :class:`ResponsePort` that an
``explicit_response_port`` endpoint answers through. Running the message is the actor
instance's."""

from __future__ import annotations

import asyncio
import logging
import os
import traceback
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

import msgspec

from ..config import config
from ..errors import SerializationError, actor_failed
from ._actor_thread import Job
from ._connection import Connection
from ._errinfo import encode_error, info_from_error
from ._loops import run_on
from ._port import Port
from ._serialize import _ATOMS, _PLAIN_BYTES, dumps
from ._wire import ERROR, NIL, OK, Buffer, Call, ErrorInfo, Result, frame

if TYPE_CHECKING:
    from ._instance import ActorInstance, RunnableEndpoint

__all__ = ["Describe", "Replier", "ReplySink", "ResponsePort", "error_info"]

log = logging.getLogger("danaus.actor")


class ReplySink(Protocol):
    """Where the reply to a call goes: the connection it came on, or, for the local target
    of a cast, its tree node in this proc (``_cast``), which gathers it with the rest."""

    @property
    def peer(self) -> str | None:
        """Who sent the call (orders it by its sequence number), if known."""
        ...

    def send(self, msg: Result, parts: Sequence[Buffer] = ()) -> bool: ...


_plain_encode = msgspec.msgpack.Encoder().encode
#: the encoder of replies written from an actor's thread (msgspec's module-level one: the
#: loop's ``_plain_encode`` may be encoding at the same moment)
_thread_encode = msgspec.msgpack.encode


#: Where the frames of the runtime itself and of the event loop come from.
_RUNTIME_FILES = (
    os.path.dirname(__file__) + os.sep,
    os.path.dirname(asyncio.__file__) + os.sep,
    "uvloop" + os.sep,
)


def _from_user_code(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` from the first frame of the user's code: below the runtime's frames (which
    call a sync endpoint) and the loop's (which a KeyboardInterrupt or SystemExit from an
    async endpoint passes through on its way out of the loop)."""
    while tb is not None and tb.tb_next is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_RUNTIME_FILES):
            break
        tb = tb.tb_next
    return tb


def error_info(e: BaseException, actor: ActorInstance, include_tb: bool = True) -> ErrorInfo:
    """What the caller hears of ``e``, raised by the actor's endpoint."""
    tb = (
        "".join(traceback.format_exception(type(e), e, _from_user_code(e.__traceback__)))
        if include_tb
        else ""
    )
    return info_from_error(e, actor.ctx.actor_id, actor.rank_text, tb)


class Replier:
    """Answers the callers of one actor's messages (on the loop's thread)."""

    __slots__ = ("_actor",)

    def __init__(self, actor: ActorInstance) -> None:
        self._actor = actor

    def __repr__(self) -> str:
        return f"<Replier {self._actor.ctx.actor_id}>"

    def returned(self, conn: ReplySink, msg: Call, ep: RunnableEndpoint, result: object) -> None:
        """``msg`` returned ``result`` (an explicit-response-port endpoint answers itself)."""
        if msg.reply and not ep.explicit_response_port:
            self.value(conn, msg, result)

    def value(self, conn: ReplySink, msg: Call, result: object) -> None:
        """Answer ``msg`` with ``result``: plain msgpack when it is a small atom, else a
        pickle with out-of-band parts (a ``SerializationError`` if it cannot be)."""
        a = self._actor
        t = type(result)
        if t in _ATOMS or (t is bytes and isinstance(result, bytes) and len(result) < _PLAIN_BYTES):
            try:  # no pickle, no checks
                raw = msgspec.Raw(_plain_encode(result))
            except (OverflowError, UnicodeEncodeError):
                pass  # an int too large for msgpack, a str with lone surrogates: pickle it
            else:
                if len(raw) <= config.oob_threshold:
                    conn.send(Result(msg.reply, OK, raw, False, a.rank))
                    return
        try:
            raw, pickled, parts = dumps(result, Describe(a, msg, "return value"))
        except SerializationError as e:
            self.error(conn, msg, error_info(e, a, include_tb=False))
            return
        conn.send(Result(msg.reply, OK, raw, pickled, a.rank), parts)

    def reply_from_thread(self, job: Job) -> bool:
        """On the actor's thread, as soon as ``job``'s sync endpoint returned: write the
        reply from there, so that it does not wait for the loop to wake up. Only a small
        atom (an ``int``, a ``str``, short ``bytes``...: no pickling off the loop), to a
        caller on a connection, from an endpoint that does not answer through its own
        port; False (nothing written) otherwise, or where the socket cannot take it in
        order now: the loop replies, as it does to every other outcome."""
        conn, msg = job.conn, job.msg
        if not msg.reply or type(conn) is not Connection:
            return False
        result = job.value
        t = type(result)  # (value()'s plain path, which keeps its test inline: the hot path)
        if not (t in _ATOMS or (t is bytes and len(result) < _PLAIN_BYTES)):  # type: ignore[arg-type]
            return False
        a = self._actor
        ep = a.endpoint(msg.method)
        if ep is None or ep.explicit_response_port:
            return False
        try:
            raw = msgspec.Raw(_thread_encode(result))
        except (OverflowError, UnicodeEncodeError):
            return False  # (the loop pickles it)
        if len(raw) > config.oob_threshold:
            return False
        header = _thread_encode(Result(msg.reply, OK, raw, False, a.rank))
        return a.rt.send_from_thread(conn, frame(header))

    def raised(self, conn: ReplySink, msg: Call, ep: RunnableEndpoint, exc: BaseException) -> None:
        """The endpoint that ran ``msg`` raised ``exc``.

        An ``Exception`` is its caller's to handle, and the actor serves on. As in Monarch,
        anything else (``SystemExit``, ``KeyboardInterrupt``, a ``BaseException`` of the
        user's) fails the actor, as does an explicit-response-port endpoint that raised: its
        caller (and every later one) gets ``SupervisionError``, its owner the failure.
        """
        a = self._actor
        info = error_info(exc, a)
        a.stats.failed(msg.method, f"{info.exc_type}: {info.message}")
        if not isinstance(exc, Exception):
            why = f"{info.exc_type}: {info.message} in {msg.method} (not an Exception)"
        elif ep.explicit_response_port:
            # It owed its caller an answer through the port and raised instead; nobody
            # else will see this exception.
            why = (
                f"{info.exc_type}: {info.message} in {msg.method} (an explicit-response-port "
                "endpoint raised instead of answering)"
            )
        else:
            self.error(conn, msg, info)
            return
        report = f"{why}\n{info.traceback}"
        a.fail(report, "actor")
        if msg.reply:
            self.supervision(conn, msg, actor_failed(a.ctx.display_name, report))

    def supervision(self, conn: ReplySink, msg: Call, why: str, tb: str = "") -> None:
        """Fail ``msg`` with ``SupervisionError``: the actor failed or stopped (``why``)."""
        a = self._actor
        info = ErrorInfo("supervision", a.ctx.actor_id, a.rank_text, "SupervisionError", why, tb)
        self.error(conn, msg, info)

    def error(self, conn: ReplySink, msg: Call, info: ErrorInfo) -> None:
        a = self._actor
        if msg.reply:
            a.rt.reply_error(conn, msg.reply, a.rank, info)
        elif info.kind == "actor" and a.failed is None and a.owner_addr:
            # Nobody waits for this result (broadcast): the actor has failed. (Not a
            # system actor, installed rather than spawned: a runtime's supervisor, its
            # controllers, its RDMA service serve on after one bad message, logged.)
            a.fail(
                f"{info.exc_type}: {info.message} in {msg.method} (called with "
                f"broadcast, so no caller saw it)\n{info.traceback}",
                "actor",
            )
        else:
            log.error("%s: %s (no caller waited for this result)", a.ctx.actor_id, info.message)

    def jobs_done(self, jobs: list[Job]) -> None:
        """Sync messages the actor's thread finished, in order."""
        a = self._actor
        batched = []
        if len(jobs) > 1:  # their replies go out in one write per connection
            for job in jobs:
                c = job.conn
                if type(c) is Connection and c not in batched and c.batch_begin():
                    batched.append(c)
        for job in jobs:
            conn, msg = job.conn, job.msg
            if job.cancelled or job.replied:
                continue  # its caller gave up (the result goes nowhere), or has its reply
            ep = a.endpoint(msg.method)
            assert ep is not None  # it ran, so it was found
            if not job.started:
                if msg.reply:
                    self.supervision(conn, msg, a.gone(f"before handling {msg.method}"))
            elif job.error is None:
                if msg.reply and not ep.explicit_response_port:
                    self.value(conn, msg, job.value)
            else:
                self.raised(conn, msg, ep, job.error)
        for c in batched:
            c.batch_end()

    def task_done(
        self,
        conn: ReplySink,
        msg: Call,
        ep: RunnableEndpoint,
        task: asyncio.Task[object],
        by_caller: bool,
    ) -> None:
        """The task that ran ``msg`` ended; ``by_caller``: its caller had cancelled it."""
        if by_caller and (task.cancelled() or task.exception() is None):
            return  # its caller gave up: nobody waits for the outcome
        a = self._actor
        if task.cancelled() and a.stopped:
            if msg.reply:  # (a broadcast has nobody to tell)
                self.supervision(conn, msg, a.gone(f"while handling {msg.method}"))
        elif task.cancelled():  # the endpoint's own code let a cancellation out
            self.error(
                conn,
                msg,
                ErrorInfo(
                    "actor",
                    a.ctx.actor_id,
                    a.rank_text,
                    "asyncio.CancelledError",
                    f"{msg.method} was cancelled (by the endpoint's own code)",
                    "",
                ),
            )
        elif (exc := task.exception()) is not None:
            if by_caller and isinstance(exc, asyncio.CancelledError):
                return
            if config.debug_on_error and not by_caller:
                from ._debugging import hook as _debug

                if _debug.wants_post_mortem(exc):
                    _debug.post_mortem(exc, a)  # (on the loop: its peers are told)
            self.raised(conn, msg, ep, exc)
        elif msg.reply and not ep.explicit_response_port:
            self.value(conn, msg, task.result())


class Describe:
    """Names a message's payload for an error message, built only if one is raised."""

    __slots__ = ("actor", "msg", "what")

    def __init__(self, actor: ActorInstance, msg: Call, what: str) -> None:
        self.actor = actor
        self.msg = msg
        self.what = what

    def __call__(self) -> str:
        return f"{self.what} of {type(self.actor.obj).__name__}.{self.msg.method}"


class ResponsePort(Port[object]):
    """The caller's reply port, given to an ``explicit_response_port`` endpoint.

    ``send(v)`` answers the call with ``v``, ``exception(e)`` with an error; from the
    endpoint, another task, or another message's handler, at any time. Pickled, it
    becomes a plain :class:`Port` to the caller, which another actor may answer through.
    """

    __slots__ = ("_actor", "_conn", "_rank")

    def __init__(self, actor: ActorInstance, conn: ReplySink, msg: Call) -> None:
        super().__init__(getattr(conn, "peer", None) or "", msg.reply)
        self._actor = actor
        self._conn = conn
        self._rank = actor.rank

    def __repr__(self) -> str:
        return f"ResponsePort({self.addr}#{self.port_id})"

    def exception(self, exc: BaseException) -> None:
        a = self._actor
        tb = "".join(traceback.format_exception(exc))

        info = info_from_error(exc, a.ctx.actor_id, a.rank_text, tb)
        self._post(ERROR, encode_error(info), False, [], exc)

    def _post(
        self,
        status: int,
        raw: msgspec.Raw | None,
        pickled: bool,
        parts: list[Buffer],
        local: object,
    ) -> None:
        if not self.port_id:
            return  # a broadcast: nobody waits for an answer
        msg = Result(
            self.port_id,
            status,
            raw if raw is not None else NIL,
            pickled,
            self._rank,
        )
        run_on(self._actor.rt, self._conn.send, msg, parts)
