"""Free TCP ports for tests that must name a port before something listens on it."""

from __future__ import annotations

import socket

__all__ = ["free_port", "free_ports"]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports that were free on ``host`` a moment ago (held together while
    chosen, so they differ; another process may still take one before the test does)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One port that was free on ``host`` a moment ago."""
    return free_ports(1, host)[0]
