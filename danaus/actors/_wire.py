"""Wire messages and frame layout of the control plane.

A frame is::

    magic "DNS1" | u32 header length | u32 part count | u64 length of each part
    | msgspec-msgpack header | part 0 | part 1 | ...

The header is one tagged ``msgspec.Struct`` from a union: :data:`Handshake` before a
peer has authenticated, :data:`Message` after. User payloads are never typed fields:
they are ``msgspec.Raw`` (plain values, or the bytes of a pickle) plus out-of-band
parts (the large buffers of that pickle).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TypeAlias

import msgspec

MAGIC = b"DNS1"
PREFIX = struct.Struct("<4sII")
PART_LEN = struct.Struct("<Q")
MAX_PARTS = 4096
#: Largest header accepted before a peer has authenticated.
MAX_HANDSHAKE_HEADER = 4096

Buffer: TypeAlias = bytes | bytearray | memoryview

# ---------------------------------------------------------------- handshake


class Hello(msgspec.Struct, tag=1, array_like=True, frozen=True):
    """Dialer -> acceptor: who I am (my listening address) and a fresh challenge."""

    nonce: bytes
    addr: str
    version: int = 1


class Challenge(msgspec.Struct, tag=2, array_like=True, frozen=True):
    """Acceptor -> dialer: proof that the acceptor holds the key, and its own challenge."""

    nonce: bytes
    mac: bytes


class Auth(msgspec.Struct, tag=3, array_like=True, frozen=True):
    """Dialer -> acceptor: proof that the dialer holds the key."""

    mac: bytes


# Tag 4 was a Welcome (acceptor -> dialer: authenticated) that was never sent: the
# dialer's first message follows its Auth. Do not reuse the tag.
Handshake: TypeAlias = Hello | Challenge | Auth

# ---------------------------------------------------------------- messages

#: ``Result.status`` values.
OK, ERROR, CLOSE = 0, 1, 2
#: An encoded value that is nothing (msgpack nil): the value of a result without one.
NIL = msgspec.Raw(b"\xc0")


class RegionWire(msgspec.Struct, array_like=True, frozen=True):
    """The slice of a mesh a message was sent to, as the wire carries it: named dims laid
    over the global ranks (``offset + sum(coord * stride)``), the fields of a
    :class:`danaus.geometry.Region` (the one region type; this is its encoding). Its
    receivers find their *message rank* in it."""

    labels: list[str]
    sizes: list[int]
    strides: list[int]
    offset: int


class Call(msgspec.Struct, tag=16, array_like=True, frozen=True):
    """Run ``method`` on the local actor named ``actor``.

    ``args`` is msgpack of ``[args, kwargs]`` when ``pickled`` is false, else msgpack
    ``bin`` holding a pickle of ``(args, kwargs)`` whose out-of-band buffers are the
    frame's parts. ``reply`` is a port id on the sending peer; 0 means nobody waits.
    """

    actor: str
    method: str
    reply: int
    args: msgspec.Raw
    pickled: bool = False
    #: Per (sender, actor) sequence number from 1; the actor handles a sender's messages
    #: in this order even when some took another path (a cast tree). 0: unordered.
    seq: int = 0
    #: the slice called, when it is not the whole mesh the actor was spawned in
    region: RegionWire | None = None
    #: the caller's span (a W3C ``traceparent``), with telemetry on; "" otherwise
    trace: str = ""


class CallSpec(msgspec.Struct, frozen=True):
    """One call as the layers above hand it to the runtime (``Runtime.call``,
    ``send_call``), not itself on the wire: the endpoint ``method`` of actor ``actor``, the
    arguments encoded as :class:`Call` carries them (``args``, ``pickled``, and the
    frame's out-of-band ``parts``), the slice called (``region``, ``None`` for the whole
    mesh) and the caller's span (``trace``). Built once per call, whatever number of
    actors it goes to and however it travels."""

    actor: str
    method: str
    args: msgspec.Raw
    pickled: bool = False
    parts: Sequence[Buffer] = ()
    region: RegionWire | None = None
    trace: str = ""


class Result(msgspec.Struct, tag=17, array_like=True, frozen=True):
    """A value (or error, or close) for port ``port`` of the receiving peer.

    ``rank`` is the sender's linear rank (-1 when it has none), so a port that gathers
    a mesh's replies knows whose each is. ``value`` is encoded like ``Call.args``; an
    error is an :class:`ErrorInfo` in msgpack.
    """

    port: int
    status: int
    value: msgspec.Raw
    pickled: bool = False
    rank: int = -1


class Creator(msgspec.Struct, array_like=True, frozen=True):
    """One link of an actor's line of creation (``actor_instance.creator``): a spawner's
    mesh name, class (``""`` for a controller's root) and rank in its mesh."""

    name: str
    class_name: str
    rank: int
    sizes: dict[str, int]


class Spawn(msgspec.Struct, tag=18, array_like=True, frozen=True):
    """Create actor ``actor`` in the receiving proc.

    ``payload`` is encoded like ``Call.args`` and holds ``(cls, args, kwargs)``.
    """

    actor: str
    reply: int
    mesh: str
    rank: int
    sizes: dict[str, int]
    payload: msgspec.Raw
    pickled: bool = True
    #: where failures of this actor are reported: the spawning runtime's address
    owner_addr: str = ""
    #: the address of every proc of the proc mesh, by rank (``actor_instance.proc_mesh``)
    proc_addrs: list[str] = msgspec.field(default_factory=list)
    #: who spawns it, then that one's creator, up to a root (``actor_instance.creator``)
    creators: list[Creator] = msgspec.field(default_factory=list)


class StopActor(msgspec.Struct, tag=19, array_like=True, frozen=True):
    """Stop actor ``actor``; its pending messages fail. Reply with OK when done."""

    actor: str
    reply: int


class StopProc(msgspec.Struct, tag=20, array_like=True, frozen=True):
    """Stop every actor and exit the proc after replying."""

    reply: int


#: ``Cast.mode`` values: how results travel back.
CAST_NONE, CAST_GATHER, CAST_REDUCE = 0, 1, 2


class Cast(msgspec.Struct, tag=21, array_like=True, frozen=True):
    """Call ``method`` on actor ``actor`` at every target, down a fan-out tree of procs.

    The receiving proc holds ``targets[0]``; it forwards the rest, split into at most
    ``fanout`` subtrees, to the first proc of each. ``targets`` are ``(rank, addr, seq)``.
    Results go to port ``reply`` at ``reply_to`` (``""``: back over the arriving
    connection), gathered or reduced on the way up the tree.
    ``args`` and the frame's parts are as in :class:`Call`.
    """

    actor: str
    method: str
    targets: list[tuple[int, str, int]]
    reply: int
    reply_to: str
    sender: str
    mode: int
    fanout: int
    args: msgspec.Raw
    pickled: bool = False
    #: For CAST_REDUCE: ``(identity, combine)``, encoded like ``args``.
    reducer: msgspec.Raw = NIL
    reducer_pickled: bool = False
    #: as in :class:`Call`
    region: RegionWire | None = None
    #: as in :class:`Call`
    trace: str = ""


class Gathered(msgspec.Struct, tag=22, array_like=True, frozen=True):
    """Results of a subtree for port ``port``: ``(rank, status, value, pickled, nparts)``
    each, their out-of-band parts following in the frame in the same order."""

    port: int
    entries: list[tuple[int, int, msgspec.Raw, bool, int]]


class SeqSkip(msgspec.Struct, tag=23, array_like=True, frozen=True):
    """Sequence number ``seq`` from this sender to ``actor`` will never arrive (it was
    lost with a failed cast subtree): do not wait for it."""

    actor: str
    seq: int
    #: whose sequence number it is, when not the sending peer's (a cast tree node skips
    #: for the original sender)
    sender: str = ""


class Ping(msgspec.Struct, tag=24, array_like=True, frozen=True):
    """Are you alive? (sent on connections that have been quiet for a while)"""


class Pong(msgspec.Struct, tag=25, array_like=True, frozen=True):
    """Alive."""


# Tags 26 and 28 were Failure and Stuck, which the actor layer now tells the spawner's
# system actor (``SUPERVISOR``, danaus/actors/_instance.py) as ordinary calls.


class Cancel(msgspec.Struct, tag=27, array_like=True, frozen=True):
    """The caller of a call to actor ``actor`` whose reply goes to port ``reply`` (on the
    sending peer) gave up: drop the call if it is still queued, cancel it if it runs (an
    async endpoint sees ``CancelledError``; a sync one finishes, its result dropped)."""

    actor: str
    reply: int


# ---------------------------------------------------------------- debugger
# A paused actor's pdb session travels on a connection of its own, dialed by the paused
# thread with a blocking socket (its proc's loop may be the thing paused) to where the
# actor's failures go; the spawner side may relay it further up (nested meshes).


class DebugOpen(msgspec.Struct, tag=40, array_like=True, frozen=True):
    """Paused thread -> spawner: actor ``actor_id`` (rank ``rank`` of actor mesh ``mesh``)
    stopped in pdb at ``where`` (``file:line``); ``session`` names it on this channel."""

    session: int
    actor_id: str
    mesh: str
    rank: int
    coords: dict[str, int]
    where: str
    function: str
    proc: str
    host: str
    pid: int
    #: "breakpoint", or "post-mortem: <exception>" (``config.debug_on_error``)
    reason: str = "breakpoint"


class DebugOutput(msgspec.Struct, tag=41, array_like=True, frozen=True):
    """Paused thread -> spawner: what pdb wrote. ``prompt``: it now waits for a line,
    stopped at ``where`` in ``function``."""

    session: int
    text: str
    prompt: bool = False
    where: str = ""
    function: str = ""


class DebugInput(msgspec.Struct, tag=42, array_like=True, frozen=True):
    """Spawner -> paused thread: one line typed for pdb."""

    session: int
    line: str


class DebugClose(msgspec.Struct, tag=43, array_like=True, frozen=True):
    """Paused thread -> spawner: the session is over (the actor goes on)."""

    session: int


class DebugDetach(msgspec.Struct, tag=44, array_like=True, frozen=True):
    """Spawner -> paused thread: nobody will attach (the attacher went away, or the user
    continued every session): clear the breakpoints set in pdb and continue."""

    session: int


class Paused(msgspec.Struct, tag=45, array_like=True, frozen=True):
    """The sender's event loop stops (``paused``: a debugger prompt runs on its thread)
    or resumes: its silence meanwhile is no sign that it is lost."""

    paused: bool


Message: TypeAlias = (
    Call
    | Result
    | Spawn
    | StopActor
    | StopProc
    | Cast
    | Gathered
    | SeqSkip
    | Ping
    | Pong
    | Cancel
    | DebugOpen
    | DebugOutput
    | DebugInput
    | DebugClose
    | DebugDetach
    | Paused
)


class ErrorInfo(msgspec.Struct, array_like=True, frozen=True):
    """A remote exception, as plain data (never a pickle, so it always decodes)."""

    kind: str  # "actor", "remote", "supervision", "serialization", "endpoint", "closed"
    actor: str
    rank: str
    exc_type: str
    message: str
    traceback: str
    issued_at: str = ""  # "remote" (tensor engine): the controller line that issued the op
    #: "actor": a pickle of the exception itself, where it pickled (and unpickled) there
    exception: bytes = b""


def frame(header: bytes, parts: Sequence[Buffer] = ()) -> list[Buffer]:
    """Lay out one frame as buffers for ``transport.writelines``."""
    if not parts:
        return [PREFIX.pack(MAGIC, len(header), 0) + header]
    lens = b"".join(PART_LEN.pack(memoryview(p).nbytes) for p in parts)
    return [PREFIX.pack(MAGIC, len(header), len(parts)) + lens + header, *parts]
