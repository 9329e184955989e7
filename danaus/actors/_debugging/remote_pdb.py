"""pdb in a proc whose terminal is the actor's spawner.

:class:`RemotePdb`'s stdin and stdout are a
:class:`~danaus.actors._debugging.channel.DebugChannel` to where the actor's failures go (its
spawner: the controller, for meshes the controller spawned; else whoever started the
proc), dialed by the paused thread itself, so that it works when that thread is the
proc's event loop (an ``async def`` endpoint) as well as an actor's own thread (a sync
one).

A channel opens at the first prompt and closes when the user continues, quits, or steps
out of the endpoint's own code; a breakpoint set in pdb that hits later opens another.
If the spawner goes away, falls silent past ``heartbeat_timeout``, or tells the session
to detach (nobody will attach), pdb clears its breakpoints and continues: a paused actor
never waits for good.
"""

from __future__ import annotations

import dis
import inspect
import logging
import os
import pdb
import queue
import secrets
import socket
from collections.abc import Iterable
from types import FrameType, TracebackType
from typing import TYPE_CHECKING

from ...config import config
from .._context import current
from .._process import process
from .._wire import DebugClose, DebugOpen, DebugOutput
from . import hook as _debug
from .channel import ChannelState, DebugChannel, Nothing

if TYPE_CHECKING:
    from _typeshed import TraceFunction

    from .._instance import ActorInstance

__all__ = ["RemotePdb", "post_mortem", "set_trace"]

log = logging.getLogger("danaus.debug")

#: Modules whose frames pdb never stops in (``step`` passes through them); a frame called
#: from one of them is where an endpoint's own code begins.
_INTERNAL_PACKAGES = ("danaus", "asyncio", "uvloop", "concurrent", "threading", "contextvars")
_INTERNAL = tuple(p for pkg in _INTERNAL_PACKAGES for p in (pkg, f"{pkg}.*"))
_CO_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_YIELD = dis.opmap["YIELD_VALUE"]
#: pdb's output goes out at each prompt, and whenever this much is waiting
_OUTPUT_CHUNK = 4096


def set_trace(frame: FrameType) -> None:
    """``breakpoint()`` in ``frame``: stop there, in a session of the actor running here."""
    RemotePdb(_Who.here()).set_trace(frame)


def post_mortem(exc: BaseException, actor: ActorInstance) -> None:
    """Stop at the frame that raised ``exc`` in an endpoint of ``actor`` (an
    ActorInstance), until the user continues."""
    tb = exc.__traceback__
    while tb is not None and _internal(tb.tb_frame):
        tb = tb.tb_next  # the runtime's frames above the endpoint's are not the user's
    if tb is None:
        return
    dbg = RemotePdb(_Who(actor, f"post-mortem: {type(exc).__name__}: {exc}"))
    dbg.reset()
    try:
        dbg.interaction(None, tb)
    finally:
        dbg.end()


def _internal(frame: FrameType) -> bool:
    name = frame.f_globals.get("__name__", "")
    return isinstance(name, str) and name.partition(".")[0] in _INTERNAL_PACKAGES


def _location(frame: FrameType | None) -> tuple[str, str]:
    if frame is None:
        return "", ""
    return f"{frame.f_code.co_filename}:{frame.f_lineno}", frame.f_code.co_name


class _Who:
    """The paused actor (None outside one) and why it is paused."""

    def __init__(self, actor: ActorInstance | None, reason: str) -> None:
        self.actor = actor
        self.reason = reason

    @classmethod
    def here(cls) -> _Who:
        ctx = current.get().actor
        return cls(None if ctx is None else ctx.runtime_actor, "breakpoint")

    @property
    def key(self) -> str:
        """The actor's wire key ("" outside an actor)."""
        return self.actor.wire if self.actor is not None else ""

    @property
    def target(self) -> str:
        """Where the session goes: the actor's spawner (where its failures go), else the
        proc's parent (also when the spawner is this very proc, whose loop may be the
        thing paused: it would only relay the session there)."""
        rt = _debug.proc_runtime()
        owner = self.actor.owner_addr if self.actor is not None else ""
        if owner and (rt is None or owner != rt.addr):
            return owner
        return _debug.proc_parent()

    def open_message(self, session: int, frame: FrameType | None) -> DebugOpen:
        rt = _debug.proc_runtime()
        proc = rt.addr if rt is not None else ""
        where, function = _location(frame)
        host, pid = socket.gethostname(), os.getpid()
        a = self.actor
        if a is None:
            return DebugOpen(
                session, proc, "", -1, {}, where, function, proc, host, pid, self.reason
            )
        ctx = a.ctx
        return DebugOpen(
            session, ctx.actor_id, ctx.name, a.rank, dict(ctx.rank), where, function, proc,
            host, pid, self.reason,
        )  # fmt: skip


class RemotePdb(pdb.Pdb):
    """pdb whose terminal is the spawner, through a :class:`DebugChannel` opened at the
    first prompt and closed when the user continues, quits or leaves the endpoint."""

    def __init__(self, who: _Who) -> None:
        self._who = who
        self._chan: DebugChannel | None = None
        self._session = 0
        self._base: FrameType | None = None  # the endpoint's outermost frame
        self._unreachable = False
        self._ending = False
        self._buf: list[str] = []
        self._buflen = 0
        super().__init__(
            stdin=_Input(self),  # type: ignore[arg-type]
            stdout=_Output(self),  # type: ignore[arg-type]
            skip=_INTERNAL,
            nosigint=True,  # (a signal handler is the proc's business, and off its thread)
            readrc=False,
        )
        self.use_rawinput = False
        self.prompt = "(Pdb) "

    def __repr__(self) -> str:
        return f"<RemotePdb {self._who.key or '(no actor)'} {self._chan!r}>"

    # ------------------------------------------------------------ sessions

    def interaction(
        self, frame: FrameType | None, tb: TracebackType | BaseException | None
    ) -> None:
        if isinstance(tb, BaseException):  # (pdb passes the exception itself from 3.13)
            tb = tb.__traceback__
        if not self._begin(frame, tb):
            self.set_continue()  # nowhere to type commands from: carry on
            return
        rt = _debug.proc_runtime()
        on_loop = rt is not None and rt.on_loop()
        if on_loop:
            assert rt is not None
            rt.announce_pause(True)
        try:
            super().interaction(frame, tb)
        finally:
            if on_loop:
                assert rt is not None
                rt.announce_pause(False)

    def _begin(self, frame: FrameType | None, tb: TracebackType | None) -> bool:
        """Open a channel for this stop, unless one is open. False: no session to be had."""
        if self._chan is not None:
            return True
        target = self._who.target
        if self._unreachable or not target:
            return False
        if frame is None:  # post-mortem: the frame that raised
            last = tb
            while last is not None and last.tb_next is not None:
                last = last.tb_next
            at = last.tb_frame if last is not None else None
            self._base = None
        else:
            at = base = frame
            while base.f_back is not None and not _internal(base.f_back):
                base = base.f_back
            self._base = base
        self._session = secrets.randbits(62)
        rt = _debug.proc_runtime()
        proc = rt.addr if rt is not None else f"pid {os.getpid()}"
        key = rt.key_for(target) if rt is not None else process.job_key()
        chan = DebugChannel(target, key, f"{proc}#debug-{self._session:x}")
        try:
            chan.open(self._who.open_message(self._session, at))
        except Exception as e:
            self._unreachable = True
            log.warning(
                "breakpoint in %s not taken: no debugger session at %s (%s: %s)",
                self._who.key or f"pid {os.getpid()}",
                target,
                type(e).__name__,
                e,
            )
            return False
        self._chan = chan
        _debug.session_opened(self._who.key)
        return True

    def end(self) -> None:
        """This session is over: its actor goes on."""
        chan, self._chan = self._chan, None
        self._base = None
        if chan is None:
            return
        self._flush_to(chan)
        chan.close(DebugClose(self._session))
        _debug.session_ended(self._who.key)

    def set_continue(self) -> None:
        super().set_continue()
        self._ending = True

    def set_quit(self) -> None:
        super().set_quit()
        self._ending = True

    def _cmdloop(self) -> None:
        self._ending = False
        super()._cmdloop()
        if self._ending:
            self.end()

    def dispatch_return(self, frame: FrameType, arg: object) -> TraceFunction:
        out = super().dispatch_return(frame, arg)
        if self._chan is not None and frame is self._base and _finished(frame):
            # The endpoint's own code is done: stepping on would stop in whatever runs
            # next on this thread (the next message). The session ends here.
            self.set_continue()
            self.end()
        return out

    # ------------------------------------------------------------ commands

    def do_clear(self, arg: str) -> None:
        """cl(ear) [filename:lineno | bpnumber ...]: with no argument, clear every
        breakpoint (without asking: no terminal here could answer)."""
        if arg:
            super().do_clear(arg)
        else:
            self.clear_all_breaks()
            self.message("Deleted all breakpoints")

    do_cl = do_clear

    def do_interact(self, arg: str) -> None:
        """interact: not in a remote session (it would read the proc's own stdin)."""
        self.error("interact is not available in a danaus debugger session")

    # ------------------------------------------------------------ streams

    def write_text(self, text: str) -> None:
        self._buf.append(text)
        self._buflen += len(text)
        if self._buflen >= _OUTPUT_CHUNK and self._chan is not None:
            self._flush_to(self._chan)

    def _flush_to(self, chan: DebugChannel) -> None:
        if self._buf:
            text, self._buf, self._buflen = "".join(self._buf), [], 0
            chan.send(DebugOutput(self._session, text))

    def read_line(self) -> str:
        chan = self._chan
        if chan is None:
            return "continue\n"
        where, function = _location(self.curframe)
        text, self._buf, self._buflen = "".join(self._buf), [], 0
        chan.send(DebugOutput(self._session, text, True, where, function))
        while True:
            try:
                got = chan.lines.get(timeout=config.heartbeat_interval)
            except queue.Empty:
                if chan.state is ChannelState.OPEN:
                    continue
                got = Nothing.GONE
            if not isinstance(got, Nothing):
                return got if got.endswith("\n") else got + "\n"
            # Nobody will type here (detached, or the spawner is gone): forget the
            # breakpoints set in pdb, and go on.
            self.clear_all_breaks()
            return "continue\n"


def _finished(frame: FrameType) -> bool:
    """Is ``frame`` returning for good, rather than a coroutine or generator suspending?"""
    if frame.f_code.co_flags & _CO_SUSPENDABLE:
        code = frame.f_code.co_code
        if 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] == _YIELD:
            return False
    return True


class _Input:
    """pdb's stdin: the lines typed at the spawner."""

    def __init__(self, dbg: RemotePdb) -> None:
        self._dbg = dbg

    def readline(self) -> str:
        return self._dbg.read_line()

    def isatty(self) -> bool:
        return False


class _Output:
    """pdb's stdout: text for the spawner."""

    encoding = "utf-8"

    def __init__(self, dbg: RemotePdb) -> None:
        self._dbg = dbg

    def write(self, text: str) -> int:
        self._dbg.write_text(text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self._dbg.write_text(line)

    def flush(self) -> None:
        pass  # (it goes out at the prompt, or when a chunk is full)

    def isatty(self) -> bool:
        return False
