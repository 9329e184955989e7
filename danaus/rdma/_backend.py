"""The interface every data-plane backend implements, and the owner-side registration."""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ._handle import BufferHandle

#: Calls the owner proc's RDMA manager: ``await exchange(owner_addr, backend, payload)``
#: returns the manager's answer. Backends use it for setup (e.g. queue-pair info).
Exchange = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]

#: Why ibverbs is unavailable when ``config.rdma_disable_ibverbs`` is set.
IBVERBS_DISABLED = "disabled by DANAUS_RDMA_DISABLE_IBVERBS"


@dataclass
class LocalBuffer:
    """An owner-side registration: the bytes of one RDMABuffer, kept alive while registered.

    Attributes:
        buf_id: id in this proc's registry.
        view: a 1-D, C-contiguous, unsigned-byte memoryview of the user's memory.
        addr: its virtual address.
        keepalive: the user's object (tensor, array) the view belongs to.
        keys: what each backend added at registration (goes into the handle).
        state: per-backend private state (e.g. an ibverbs memory region).
    """

    buf_id: int
    view: memoryview
    addr: int
    keepalive: Any
    keys: dict[str, dict[str, int | str]] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return self.view.nbytes


class Backend(abc.ABC):
    """One way of moving bytes between procs. Instances live one per proc.

    Reads and writes are one-sided where the backend allows it: the owner's event loop
    does no copying. A backend reports a failure by raising an ``RDMAError`` subclass;
    the destination is then not (fully) written.

    A read or write may be cancelled (its deadline passed). Before the cancellation
    propagates, the backend stops touching the caller's memory, or keeps that memory
    referenced until its hardware is done with it; and nothing the owner does later for
    the abandoned transfer may land in another transfer's bytes.
    """

    name: ClassVar[str]

    @classmethod
    @abc.abstractmethod
    def probe(cls) -> str | None:
        """``None`` if the backend can run in this process, else why not (a sentence)."""

    def register(self, buf: LocalBuffer) -> dict[str, int | str]:
        """Owner side: make ``buf`` reachable; return keys for the handle (may be empty)."""
        return {}

    def unregister(self, buf: LocalBuffer) -> None:  # noqa: B027 - optional hook
        """Owner side: ``buf`` is being dropped."""

    @abc.abstractmethod
    def reaches(self, handle: BufferHandle) -> bool:
        """Can this backend, in this proc, move bytes to and from that buffer?"""

    @abc.abstractmethod
    async def read(self, handle: BufferHandle, offset: int, dst: memoryview) -> None:
        """Copy ``len(dst)`` bytes of the buffer, from ``offset``, into ``dst``."""

    @abc.abstractmethod
    async def write(self, handle: BufferHandle, offset: int, src: memoryview) -> None:
        """Copy ``src`` into the buffer at ``offset``."""

    def move_now(self, handle: BufferHandle, offset: int, view: memoryview, write: bool) -> bool:
        """Do a small transfer right now, synchronously, if this backend can (no task,
        no loop turn); False to go through :meth:`read` / :meth:`write` instead."""
        return False

    async def serve(self, request: dict[str, Any]) -> dict[str, Any]:
        """Owner side: answer a setup request sent through ``Exchange``."""
        raise NotImplementedError(f"backend {self.name} takes no setup requests")

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release what the backend holds (connections, device resources)."""
