"""danaus: a single-controller actor system for PyTorch (Monarch's API, asyncio inside)."""

from .actors import (
    Actor,
    Channel,
    Context,
    Endpoint,
    Future,
    Point,
    Port,
    PortReceiver,
    context,
    current_rank,
    current_size,
    endpoint,
)
from .config import config
from .errors import (
    ActorError,
    AuthenticationError,
    ClosedError,
    DanausError,
    EndpointNotFoundError,
    ProtocolError,
    SerializationError,
    SupervisionError,
)
from .mesh import Accumulator, ActorMesh, HostMesh, ProcMesh, Shape, ValueMesh, this_host

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "AuthenticationError",
    "Channel",
    "ClosedError",
    "Context",
    "DanausError",
    "Endpoint",
    "EndpointNotFoundError",
    "Future",
    "HostMesh",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "ProtocolError",
    "SerializationError",
    "Shape",
    "SupervisionError",
    "ValueMesh",
    "config",
    "context",
    "current_rank",
    "current_size",
    "endpoint",
    "this_host",
]
