"""The actor runtime of one proc: actors, endpoints, ports, futures, context."""

from ..geometry import Extent, Point
from ._actor import Actor, Endpoint, concurrent_endpoint, endpoint
from ._context import Context, context, current_actor_name, current_rank, current_size
from ._debugging.relay import sweep as _debug_sweep
from ._future import Future
from ._handlers import check_stuck as _check_stuck
from ._ids import ProcId, Uid
from ._loops import enable_transport
from ._port import Channel, Port, PortReceiver, RankedPortReceiver
from ._runtime import on_every_heartbeat as _on_every_heartbeat
from ._telemetry import get_meter, span, traced

_on_every_heartbeat(_check_stuck)  # endpoints running too long are reported
_on_every_heartbeat(_debug_sweep)  # debuggers that went away let their sessions go on

__all__ = [
    "Actor",
    "Channel",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "Point",
    "Port",
    "PortReceiver",
    "ProcId",
    "RankedPortReceiver",
    "Uid",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "enable_transport",
    "endpoint",
    "get_meter",
    "span",
    "traced",
]
