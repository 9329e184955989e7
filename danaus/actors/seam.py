"""The actor layer's internal API: what the layers above it (meshes, the data plane, the
tensor engine, SPMD, jobs) may use of it. Everything else under ``danaus.actors._*`` is
private to the actor layer; upper layers import from here only (``lint-imports``), and
everything here is used above (``tests/unit/test_exports.py``). By what it is for:

- **Actors and their values**: ``Actor``, ``Endpoint``, ``endpoint``,
  ``concurrent_endpoint``, ``AS_ENDPOINT``, ``endpoints_of``, ``describe_endpoints``,
  ``context``, ``current_rank``, ``spawn_creators``, ``waiting_actor``,
  ``Future``, ``Port``, ``PortReceiver``, ``Channel``, ``forward`` (ranks and shapes are
  ``danaus.geometry``'s, below this layer).
- **The runtime of a loop**, which meshes send through: ``Runtime`` (its verbs: ``call``
  and ``send_call`` with a ``CallSpec``, ``spawn``, ``stop_actor``, ``stop_proc``,
  ``cancel``, ports), ``current_runtime``, ``runtime_here``,
  ``background_runtime``, ``start_background_runtime``,
  ``install_runtime``, ``all_runtimes``, ``new_event_loop``, ``run_on``, ``run_task``,
  ``call_in_loop``, ``listen_address``, ``parse_addr``, and ``peers`` (what the process
  knows of its peers). The proofs every handshake makes are ``danaus._auth``'s, below
  this layer; the job's key is the process's (``actor_process.job_key()``).
- **Being a proc**: ``run_proc``, ``ensure_actor`` (a system actor: the one there while it
  serves, else a new one),
  ``ProcControl``, ``SUPERVISOR`` (the key of the system actor a
  spawner installs to hear of its actors' failures and stuck endpoints). What a proc
  says of itself is in records whose fields both layers know (``danaus._records``).
- **The actor layer's state in this process**: ``actor_process`` (``ActorProcess``):
  whether this is a proc (``in_proc``), and where the mesh layer gives the actor context
  its proc meshes (``proc_of_actor``, ``proc_mesh_of_actor``, ``controller_proc``).
- **The debugger's sessions** in the controller, for ``danaus debug``'s admin operations
  and ``DebugController``: ``debug_registry``, ``DebugRecord``.
- **Encoding, tracing**: ``dumps``, ``dumps_args``, ``outgoing_trace``,
  ``otlp_traces_url``.
- **What a call's reply says**: ``OK``, ``ERROR``;
  ``RegionWire``, the slice of a mesh a call was sent to; ``CallSpec``, one call as the
  runtime takes it. Meshes build no wire message: they ask the runtime (``call``,
  ``send_call``, ``spawn``, ``stop_actor``,
  ``stop_proc``, ``cancel``), and no message is handled above this layer (the one table
  of handlers is ``_dispatch.py``'s).
"""

from __future__ import annotations

from typing import NoReturn

from ._actor import (
    AS_ENDPOINT,
    Actor,
    Endpoint,
    concurrent_endpoint,
    describe_endpoints,
    endpoint,
    endpoints_of,
)
from ._actor_thread import (
    waiting_actor,
)
from ._address import (
    listen_address,
    parse_addr,
)
from ._context import (
    context,
    current_rank,
    spawn_creators,
)
from ._debugging.sessions import DebugRecord
from ._debugging.sessions import registry as debug_registry
from ._future import (
    Future,
)
from ._handlers import (
    ProcControl,
    ensure_actor,
)
from ._instance import SUPERVISOR
from ._loops import (
    all_runtimes,
    background_runtime,
    call_in_loop,
    current_runtime,
    install_runtime,
    new_event_loop,
    run_on,
    run_task,
    runtime_here,
    start_background_runtime,
)
from ._peers import peers
from ._port import (
    Channel,
    Port,
    PortReceiver,
    forward,
)
from ._process import process as actor_process
from ._runtime import (
    Runtime,
)
from ._serialize import (
    dumps,
    dumps_args,
)
from ._telemetry import (
    otlp_traces_url,
    outgoing_trace,
)
from ._wire import (
    ERROR,
    OK,
    CallSpec,
    RegionWire,
)

__all__ = [
    "AS_ENDPOINT",
    "ERROR",
    "OK",
    "SUPERVISOR",
    "Actor",
    "CallSpec",
    "Channel",
    "DebugRecord",
    "Endpoint",
    "Future",
    "Port",
    "PortReceiver",
    "ProcControl",
    "RegionWire",
    "Runtime",
    "actor_process",
    "all_runtimes",
    "background_runtime",
    "call_in_loop",
    "concurrent_endpoint",
    "context",
    "current_rank",
    "current_runtime",
    "debug_registry",
    "describe_endpoints",
    "dumps",
    "dumps_args",
    "endpoint",
    "endpoints_of",
    "ensure_actor",
    "forward",
    "install_runtime",
    "listen_address",
    "new_event_loop",
    "otlp_traces_url",
    "outgoing_trace",
    "parse_addr",
    "peers",
    "run_on",
    "run_proc",
    "run_task",
    "runtime_here",
    "spawn_creators",
    "start_background_runtime",
    "waiting_actor",
]


# A proc's entry point, imported only when used: ``python -m danaus.actors._proc_main`` imports
# this package first, and must find ``_proc_main`` not imported yet.
def run_proc(addr: str, parent: str, parent_pid: int, listen_fd: int | None) -> NoReturn:
    """Be a proc (in a forked child of a fork server); never returns."""
    from ._proc_main import run

    run(addr, parent, parent_pid, listen_fd)
