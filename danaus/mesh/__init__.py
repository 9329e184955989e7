"""Meshes: hosts, procs and actors laid out as named multi-dimensional meshes."""

from ._actor_mesh import ActorEndpoint, ActorMesh
from ._proc_mesh import HostMesh, ProcMesh, this_host
from ._shape import Shape
from ._value_mesh import ValueMesh

__all__ = ["ActorEndpoint", "ActorMesh", "HostMesh", "ProcMesh", "Shape", "ValueMesh", "this_host"]
