"""Where each message that arrives at a runtime is handled: every type of the wire union
(``_wire.py``) and the one function of this layer that handles it.

The receiver owns its handlers: every message on the wire is the actor layer's, and so is
this table, complete before any layer above is imported. What the actor layer tells the
layers above (an actor failed, an endpoint is stuck) travels as ordinary calls to system
actors they install (``SUPERVISOR``), never as a message type of their own.
``Runtime.dispatch`` looks a message's type up here and nowhere else; a unit test checks
that the keys are exactly the wire union's types (``tests/unit/test_dispatch.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias, cast

from ._cast import on_cast, on_gathered
from ._debugging.relay import on_debug_close, on_debug_down, on_debug_open, on_debug_output
from ._handlers import on_call, on_cancel, on_seq_skip, on_spawn, on_stop_actor, on_stop_proc
from ._replies_in import on_result
from ._runtime import on_paused, on_ping, on_pong
from ._wire import (
    Call,
    Cancel,
    Cast,
    DebugClose,
    DebugDetach,
    DebugInput,
    DebugOpen,
    DebugOutput,
    Gathered,
    Message,
    Paused,
    Ping,
    Pong,
    Result,
    SeqSkip,
    Spawn,
    StopActor,
    StopProc,
)

if TYPE_CHECKING:
    from ._connection import Connection
    from ._runtime import Runtime

__all__ = ["HANDLERS"]

#: A handler as a runtime calls it: with a message of the type it is listed for.
Dispatch: TypeAlias = "Callable[[Runtime, Connection, Message, Sequence[object]], None]"

HANDLERS: Mapping[type, Dispatch] = cast(
    "Mapping[type, Dispatch]",  # (each handler takes its own key's type, which no type says)
    {
        # the connection's own: replies to our ports, liveness, a peer paused in a debugger
        Result: on_result,  # _replies_in.py
        Ping: on_ping,  # _runtime.py
        Pong: on_pong,  # _runtime.py
        Paused: on_paused,  # _runtime.py
        # to actors of this proc: _handlers.py
        Call: on_call,
        Spawn: on_spawn,
        StopActor: on_stop_actor,
        StopProc: on_stop_proc,
        Cancel: on_cancel,
        SeqSkip: on_seq_skip,
        # casting down a tree of procs and gathering back up: _cast.py
        Cast: on_cast,
        Gathered: on_gathered,
        # debugger sessions, relayed up to the controller and back: _debugging/relay.py
        DebugOpen: on_debug_open,
        DebugOutput: on_debug_output,
        DebugClose: on_debug_close,
        DebugInput: on_debug_down,
        DebugDetach: on_debug_down,
    },
)
