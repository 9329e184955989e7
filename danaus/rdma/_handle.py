"""What an RDMABuffer handle carries to other procs: owner, id, size, per-backend keys."""

from __future__ import annotations

import msgspec


class BufferHandle(msgspec.Struct, frozen=True, array_like=True):
    """The wire form of an :class:`~danaus.rdma.RDMABuffer`: small, plain, picklable.

    Attributes:
        owner: the owner proc's control-plane address (its runtime's).
        owner_pid: the owner's pid (for ``process_vm_readv``).
        host: an id of the owner's host (same host means the ``shm`` backend can work).
        buf_id: the buffer's id in the owner's registry.
        addr: the virtual address of the bytes in the owner.
        size: the number of bytes.
        valid_addr: address in the owner of this buffer's validity word (1 while
            registered): one-sided readers check it before and after a transfer.
        data_addr: the owner's data-plane address for the ``tcp`` backend.
        keys: per-backend keys, e.g. ``{"ibverbs": {...}}`` (rkey, gid, qp info).
        writable: whether the owner's memory may be written.
    """

    owner: str
    owner_pid: int
    host: str
    buf_id: int
    addr: int
    size: int
    valid_addr: int
    data_addr: str
    keys: dict[str, dict[str, int | str]] = {}
    #: False for read-only memory (bytes, a non-writable array): write_from is refused
    writable: bool = True
