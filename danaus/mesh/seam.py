"""The mesh layer's internal API: what the layers above it (the tensor engine, jobs, the
people's tools, the ``danaus`` command, the package root) may use of it beyond
``danaus.mesh``. Everything else under ``danaus.mesh._*`` is private to the mesh layer;
``lint-imports`` (``make lint``) checks it.
"""

from __future__ import annotations

from ._actor_face import ActorFace, TypedEndpoint
from ._actor_mesh import mesh_ref
from ._admin.server import set_dashboard_starter, start_dashboard
from ._admin.snapshot import add_section, proc_stacks, snapshot
from ._admin.wire import find_controllers, runtime_dir
from ._byte_relay import CLOSE_TIMEOUT, RelayMessage, Relays, close_writer
from ._host_mesh import check_per_host
from ._proc_mesh import (
    group_of,
    host_blocks,
    host_of,
    hosts_left,
    hosts_of,
    preload_for,
    respawn_procs,
    respawnable,
)
from ._procs.host_agent import agent_ref, main_host_agent, read_key_file, serve
from ._supervision import default_fault_hook, exit_on_fault
from ._tensor_engine_hook import TensorEngine, set_tensor_engine, set_tensor_engine_loader
from ._workspace import Workspace

__all__ = [
    "CLOSE_TIMEOUT",
    "ActorFace",
    "RelayMessage",
    "Relays",
    "TensorEngine",
    "TypedEndpoint",
    "Workspace",
    "add_section",
    "agent_ref",
    "check_per_host",
    "close_writer",
    "default_fault_hook",
    "exit_on_fault",
    "find_controllers",
    "group_of",
    "host_blocks",
    "host_of",
    "hosts_left",
    "hosts_of",
    "main_host_agent",
    "mesh_ref",
    "preload_for",
    "proc_stacks",
    "read_key_file",
    "respawn_procs",
    "respawnable",
    "runtime_dir",
    "serve",
    "set_dashboard_starter",
    "set_tensor_engine",
    "set_tensor_engine_loader",
    "snapshot",
    "start_dashboard",
]
