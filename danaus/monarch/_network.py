"""``monarch.tools.network``: a host's address for a TCP port, IPv6 first.

A resolved name whose first address is link-local (``fe80::/10``, ``169.254.0.0/16``) is
passed over: another host or a container cannot reach it.
"""

from __future__ import annotations

import enum
import ipaddress
import socket

__all__ = ["AddrType", "get_ipaddr", "get_sockaddr"]


class AddrType(enum.Enum):
    """Which address family to resolve to: ``Default`` tries IPv6, then IPv4."""

    Default = enum.auto()
    IPv4 = enum.auto()
    IPv6 = enum.auto()


_FAMILIES = {
    AddrType.Default: (socket.AF_INET6, socket.AF_INET),
    AddrType.IPv4: (socket.AF_INET,),
    AddrType.IPv6: (socket.AF_INET6,),
}


def _first(hostname: str, port: int, family: socket.AddressFamily) -> str | None:
    try:
        found = socket.getaddrinfo(hostname, port, family, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return None
    if not found:
        return None
    addr = str(found[0][4][0])
    return None if ipaddress.ip_address(addr).is_link_local else addr


def get_ipaddr(hostname: str, port: int, addr_type: AddrType = AddrType.Default) -> str:
    """The address of ``hostname`` that a TCP socket on ``port`` can use.

    Raises:
        ValueError: ``addr_type`` is not an :class:`AddrType`.
        RuntimeError: no address of the families asked for resolves.
    """
    if not isinstance(addr_type, AddrType):
        raise ValueError(f"addr_type must be an AddrType, not {addr_type!r}")
    for family in _FAMILIES[addr_type]:
        if (addr := _first(hostname, port, family)) is not None:
            return addr
    raise RuntimeError(
        f"{hostname!r} resolves to no {addr_type.name} address for a TCP socket on port "
        f"{port}: check the host's network configuration"
    )


def get_sockaddr(hostname: str, port: int) -> str:
    """``ADDR:PORT`` (IPv4) or ``[ADDR]:PORT`` (IPv6) of ``hostname``, IPv6 first."""
    addr = get_ipaddr(hostname, port)
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
