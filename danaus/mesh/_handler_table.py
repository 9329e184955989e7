"""Where each message is handled: every type of the wire union (``danaus/actors/_wire.py``)
and the one function that handles it when it arrives, in every runtime of this process.

This is the only table: a runtime dispatches a message by its type here and nowhere
else (``Runtime.dispatch``). It lives in the mesh layer because that is the lowest layer
that sees every handler; importing ``danaus.mesh`` installs it (``install``). A test
checks that its keys are exactly the wire union's types
(``tests/integration/test_runtime.py``).
"""

from __future__ import annotations

from ..actors._api import (
    Call,
    Cancel,
    Cast,
    DebugClose,
    DebugDetach,
    DebugInput,
    DebugOpen,
    DebugOutput,
    Gathered,
    Handler,
    Paused,
    Ping,
    Pong,
    Result,
    SeqSkip,
    Spawn,
    StopActor,
    StopProc,
    handle_cast,
    handle_gathered,
    install_handlers,
    on_call,
    on_cancel,
    on_paused,
    on_ping,
    on_pong,
    on_result,
    on_seq_skip,
    on_spawn,
    on_stop_actor,
    on_stop_proc,
)
from ._debugging.relay import (
    handle_debug_close,
    handle_debug_down,
    handle_debug_open,
    handle_debug_output,
)

__all__ = ["HANDLERS", "install"]

HANDLERS: dict[type, Handler] = {
    # the connection's own: replies to our ports, liveness, a peer paused in a debugger
    Result: on_result,  # danaus/actors/_results.py
    Ping: on_ping,  # danaus/actors/_runtime.py
    Pong: on_pong,  # danaus/actors/_runtime.py
    Paused: on_paused,  # danaus/actors/_runtime.py
    # to actors of this proc: danaus/actors/_handlers.py
    Call: on_call,
    Spawn: on_spawn,
    StopActor: on_stop_actor,
    StopProc: on_stop_proc,
    Cancel: on_cancel,
    SeqSkip: on_seq_skip,
    # casting down a tree of procs and gathering back up: danaus/actors/_cast.py
    Cast: handle_cast,
    Gathered: handle_gathered,
    # debugger sessions relayed up to the controller and back: danaus/mesh/_debugging/relay.py
    DebugOpen: handle_debug_open,
    DebugOutput: handle_debug_output,
    DebugClose: handle_debug_close,
    DebugInput: handle_debug_down,
    DebugDetach: handle_debug_down,
}


def install() -> None:
    """Make :data:`HANDLERS` the table of every runtime of this process."""
    install_handlers(HANDLERS)
