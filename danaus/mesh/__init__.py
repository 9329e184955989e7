"""Meshes: hosts, procs and actors laid out as named multi-dimensional meshes."""

from ..actors._api import (
    Cast,
    Failure,
    Gathered,
    NDSlice,
    Selection,
    Stuck,
    on_every_heartbeat,
    register_handlers,
    set_region_shape,
)
from ._actor_endpoint import ActorEndpoint
from ._actor_mesh import ActorMesh
from ._admin import AdminClient, AdminError, AdminServer, serve_admin
from ._bootstrap_cmd import BootstrapCommand, default_bootstrap_cmd
from ._cast import handle_cast, handle_gathered
from ._controllers import get_or_spawn_controller
from ._debug import debug_controller, debug_sessions
from ._debug_relay import HANDLERS as _DEBUG_HANDLERS
from ._debug_relay import sweep as _debug_sweep
from ._endpoint_ops import Accumulator, as_endpoint, send
from ._gateway import attach
from ._host_agent import run_worker_loop_forever
from ._host_mesh import HostMesh, attach_to_hosts, attach_to_workers, hosts_from_config, this_host
from ._inspect import mesh_stacks, mesh_stats
from ._metrics import MetricsServer, serve_metrics
from ._proc_group import handle_failure
from ._proc_mesh import ProcMesh, shutdown_context, this_proc
from ._shape import Shape
from ._supervision import MeshFailure, exit_on_fault, handle_stuck, set_unhandled_fault_hook
from ._value_mesh import ValueMesh

# The message types the mesh layer handles, registered in one place.
register_handlers(
    {
        Cast: handle_cast,
        Gathered: handle_gathered,
        Failure: handle_failure,
        Stuck: handle_stuck,
        **_DEBUG_HANDLERS,
    }
)
set_region_shape(Shape.from_region)  # Region.as_shape: a region of a mesh
on_every_heartbeat(_debug_sweep)  # debuggers that went away let their sessions go on

__all__ = [
    "Accumulator",
    "ActorEndpoint",
    "ActorMesh",
    "AdminClient",
    "AdminError",
    "AdminServer",
    "BootstrapCommand",
    "HostMesh",
    "MeshFailure",
    "MetricsServer",
    "NDSlice",
    "ProcMesh",
    "Selection",
    "Shape",
    "ValueMesh",
    "as_endpoint",
    "attach",
    "attach_to_hosts",
    "attach_to_workers",
    "debug_controller",
    "debug_sessions",
    "default_bootstrap_cmd",
    "exit_on_fault",
    "get_or_spawn_controller",
    "hosts_from_config",
    "mesh_stacks",
    "mesh_stats",
    "run_worker_loop_forever",
    "send",
    "serve_admin",
    "serve_metrics",
    "set_unhandled_fault_hook",
    "shutdown_context",
    "this_host",
    "this_proc",
]
