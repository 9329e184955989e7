"""Turning user objects (tensors, arrays, memoryviews) into raw byte ranges, and copying
between processes with ``process_vm_readv`` / ``process_vm_writev``."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
from typing import Any

from ..errors import RDMABufferError


def is_cuda_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor in CUDA memory (without importing torch)."""
    if "torch" not in sys.modules:
        return False
    import torch

    return isinstance(obj, torch.Tensor) and obj.device.type == "cuda"


def byte_view(obj: Any, *, writable: bool, what: str) -> tuple[memoryview, int, Any]:
    """``(1-D unsigned-byte view, address, object to keep alive)`` of ``obj``'s memory.

    Accepts a 1-D contiguous CPU ``torch.Tensor``, a C-contiguous numpy array, or a
    memoryview / bytes-like object. Nothing is copied.

    Raises:
        RDMABufferError: not contiguous, not 1-D (tensors), not writable when it must be,
            or on a device this function cannot address (CUDA: see RDMABuffer).
    """
    if "torch" in sys.modules:
        import torch

        if isinstance(obj, torch.Tensor):
            if obj.device.type != "cpu":
                raise RDMABufferError(
                    f"{what}: a {obj.device.type} tensor needs staging "
                    "(handled by RDMABuffer), not a raw view"
                )
            if obj.dim() != 1 or not obj.is_contiguous():
                raise RDMABufferError(
                    f"{what} must be a 1-D contiguous tensor (got shape {tuple(obj.shape)}, "
                    f"contiguous={obj.is_contiguous()}); view others with "
                    "t.view(torch.uint8).flatten()"
                )
            obj = obj.detach()
            if obj.dtype != torch.uint8:
                obj = obj.view(torch.uint8)
            arr = obj.numpy()
            return memoryview(arr).cast("B"), arr.ctypes.data, (arr, obj)
    import numpy as np

    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise RDMABufferError(
                f"{what} must be a C-contiguous array (got strides {obj.strides})"
            )
        if writable and not obj.flags.writeable:
            raise RDMABufferError(f"{what} must be writable")
        flat = obj.reshape(-1).view(np.uint8)
        return memoryview(flat), flat.ctypes.data, (flat, obj)  # type: ignore[arg-type]
    try:
        mv = memoryview(obj)
    except TypeError:
        raise RDMABufferError(
            f"{what} must be a torch.Tensor, a numpy array or a memoryview, "
            f"not {type(obj).__name__}"
        ) from None
    if not mv.c_contiguous:
        raise RDMABufferError(f"{what} must be contiguous")
    if writable and mv.readonly:
        raise RDMABufferError(f"{what} must be writable (got a read-only {type(obj).__name__})")
    flat = np.frombuffer(mv, dtype=np.uint8) if mv.nbytes else np.empty(0, np.uint8)
    return (
        mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv,
        flat.ctypes.data,
        (flat, mv, obj),
    )


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc: Any = None


def _lib() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        for name in ("process_vm_readv", "process_vm_writev"):
            fn = getattr(_libc, name)
            fn.restype = ctypes.c_ssize_t
            fn.argtypes = [
                ctypes.c_int,
                ctypes.POINTER(_IOVec),
                ctypes.c_ulong,
                ctypes.POINTER(_IOVec),
                ctypes.c_ulong,
                ctypes.c_ulong,
            ]
    return _libc


def vm_available() -> str | None:
    """None if ``process_vm_readv`` exists here, else why not."""
    if not sys.platform.startswith("linux"):
        return "process_vm_readv is Linux-only"
    try:
        _lib().process_vm_readv  # noqa: B018
    except (OSError, AttributeError) as e:
        return f"process_vm_readv unavailable: {e}"
    return None


#: at most this many bytes per syscall (the kernel caps a call at about 2 GiB anyway)
_MAX_CALL = 1 << 30


def vm_copy(pid: int, local: int, remote: int, n: int, *, write: bool) -> None:
    """Copy ``n`` bytes between our address ``local`` and ``remote`` in process ``pid``.

    Raises:
        OSError: with the errno (ESRCH: no such process; EPERM: ptrace rules forbid it;
            EFAULT: the remote range is not mapped).
    """
    fn = _lib().process_vm_writev if write else _lib().process_vm_readv
    done = 0
    lio, rio = _IOVec(), _IOVec()
    while done < n:
        step = min(n - done, _MAX_CALL)
        lio.iov_base, lio.iov_len = local + done, step
        rio.iov_base, rio.iov_len = remote + done, step
        got = fn(pid, ctypes.byref(lio), 1, ctypes.byref(rio), 1, 0)
        if got < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        if got == 0:
            raise OSError(errno.EFAULT, "process_vm transfer made no progress")
        done += got


def read_word(pid: int, remote: int) -> int:
    """Read one u64 from ``remote`` in process ``pid``."""
    word = ctypes.c_uint64()
    vm_copy(pid, ctypes.addressof(word), remote, 8, write=False)
    return word.value
