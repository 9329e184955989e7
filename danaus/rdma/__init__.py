"""The data plane: ``RDMABuffer`` over ibverbs, shared memory or TCP.

Tensor bytes never ride in control messages: a buffer is a small handle, and
``read_into`` / ``write_from`` move the bytes one-sidedly where the backend allows.
"""

from ._buffer import (
    RDMAAction,
    RDMABuffer,
    RDMAReadTransferWarning,
    RDMATcpFallbackWarning,
    RDMAWriteTransferWarning,
    backends,
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
)
from ._handle import BufferHandle

__all__ = [
    "BufferHandle",
    "RDMAAction",
    "RDMABuffer",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
    "backends",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
]
