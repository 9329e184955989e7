"""Meshes: hosts, procs and actors laid out as named multi-dimensional meshes."""

from ..geometry import NDSlice, Selection, Shape
from ._actor_endpoint import ActorEndpoint
from ._actor_mesh import ActorMesh
from ._admin.inspect import mesh_stacks, mesh_stats
from ._admin.metrics import MetricsServer, serve_metrics
from ._admin.server import AdminClient, AdminError, AdminServer, serve_admin
from ._controllers import get_or_spawn_controller
from ._debugging.sessions import debug_controller, debug_sessions
from ._endpoint_ops import Accumulator, as_endpoint, send
from ._gateway import attach
from ._host_mesh import HostMesh, attach_to_hosts, attach_to_workers, hosts_from_config, this_host
from ._proc_mesh import ProcMesh, shutdown_context, this_proc
from ._procs.bootstrap_cmd import BootstrapCommand, default_bootstrap_cmd
from ._procs.host_agent import run_worker_loop_forever
from ._supervision import MeshFailure, exit_on_fault, set_unhandled_fault_hook
from ._value_mesh import ValueMesh

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
