"""Tests that need hardware this machine may not have: they skip, saying why, unless the
run requires the hardware (``make test-rdma`` sets ``DANAUS_REQUIRE_RDMA_DEVICE=1``: there
a missing device is a failure, so that no ibverbs test passes by skipping)."""

from __future__ import annotations

import os

import pytest

__all__ = ["need_rdma_device", "rdma_device_missing"]


def rdma_device_missing() -> str | None:
    """Why the ibverbs backend cannot run here, or ``None`` where it can."""
    try:
        from danaus.rdma._ibverbs import IbverbsBackend
    except ImportError as e:
        return f"ibverbs backend not importable: {e}"
    return IbverbsBackend.probe()


def need_rdma_device() -> None:
    """Skip the calling test where there is no RDMA device (fail where one is required)."""
    why = rdma_device_missing()
    if why is None:
        return
    if os.environ.get("DANAUS_REQUIRE_RDMA_DEVICE") == "1":
        pytest.fail(f"DANAUS_REQUIRE_RDMA_DEVICE=1, but there is no usable RDMA device: {why}")
    pytest.skip(f"needs an RDMA NIC (ibverbs device): {why}")
