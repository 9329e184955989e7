"""The mesh layer's state in this process, held by one object, :data:`process` (as the
actor layer's is ``danaus.actors``' ``ActorProcess``).

It holds what the layer's modules share across meshes: the local procs not reaped yet
and the fork server (``_procs``), the log aggregators, the fault hook, the supervision
reports kept for the tools and whether the interpreter is exiting (``_supervision``), the
controllers' singletons, the gateway this process attached through, the admin endpoint
and its operations, the snapshot's sections and the dashboard's starter (``_admin``), how
to reach the tensor engine, and the token and counter that name actor meshes spawned
here. The live meshes themselves are ``live_meshes``' (``_live_meshes``). A forked proc
starts with a copy; what must differ there is reset after the fork (``_actor_spawn``).
"""

from __future__ import annotations

import collections
import itertools
import secrets
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..actors.seam import Actor
    from ._actor_mesh import ActorMesh
    from ._admin.server import AdminServer
    from ._procs.forkserver import ForkServer
    from ._procs.handles import ProcHandle
    from ._procs.logs import Aggregator
    from ._supervision import FailureReport, MeshFailure, StuckReport
    from ._tensor_engine_hook import TensorEngine

__all__ = ["MeshProcess", "process"]


class MeshProcess:
    """The mesh layer's state in this process (see the module)."""

    def __init__(self) -> None:
        # procs started here (_procs/local.py): the handles not reaped yet, killed at exit
        self.live_procs: set[ProcHandle] = set()
        self.live_procs_lock = threading.Lock()
        self.fork_server: ForkServer | None = None
        self.fork_server_lock = threading.Lock()
        #: the aggregators of procs' log lines, flushed at exit (_procs/logs.py)
        self.aggregators: weakref.WeakSet[Aggregator] = weakref.WeakSet()
        # supervision (_supervision.py): the fault hook set (None: the default), the
        # interpreter exiting (failures are not reported then), the reports kept for tools
        self.fault_hook: Callable[[MeshFailure], object] | None = None
        self.fault_hook_lock = threading.Lock()
        self.exiting = threading.Event()
        self.stuck_reports: collections.deque[tuple[float, StuckReport]] = collections.deque(
            maxlen=256
        )
        self.failure_reports: collections.deque[FailureReport] = collections.deque(maxlen=256)
        #: a controller's singletons by name, or the failure that ended one (_controllers.py)
        self.singletons: dict[str, ActorMesh[Actor] | MeshFailure] = {}
        self.singletons_lock = threading.Lock()
        #: the host agent this process attached through (_gateway.py)
        self.attached: str | None = None
        #: how often a caller picked each actor (choose), guarded by this (_actor_mesh.py)
        self.choose_lock = threading.Lock()
        # names of the actor meshes spawned here: a token per process, a counter
        self.spawn_token = secrets.token_hex(4)
        self.spawn_ids: itertools.count[int] = itertools.count()
        # the admin endpoint (_admin/): its operations, the server and its start, the
        # snapshot's sections from the layers above, how the tools start a dashboard
        self.admin_ops: dict[str, Callable[[dict[str, object]], Awaitable[object]]] = {}
        self.admin_server: AdminServer | None = None
        self.admin_server_lock = threading.Lock()
        self.admin_server_ready = threading.Event()
        self.admin_starting = threading.Lock()
        self.snapshot_sections: dict[str, Callable[[], object]] = {}
        self.dashboard_starter: Callable[[int], str] | None = None
        # the tensor engine, once imported, and how to import it (_tensor_engine_hook.py)
        self.tensor_engine: TensorEngine | None = None
        self.tensor_engine_loader: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"<MeshProcess live_procs={len(self.live_procs)} admin={self.admin_server}>"


#: this process's
process = MeshProcess()
