"""Addresses: ``unix:@name``, ``unix:/path``, ``tcp://host:port``, and TLS for TCP."""

from __future__ import annotations

import secrets
import socket
import ssl

from ..config import config
from ._process import process


def tls_context(*, server: bool) -> ssl.SSLContext | None:
    """Mutual TLS for TCP connections when ``tls_cert``/``tls_key``/``tls_ca`` are set.

    Both ends present a certificate signed by the CA; host names are not checked (peers
    are addressed by IP; the CA is the job's). Unix sockets never use TLS.
    """
    made = process.tls
    if server in made:
        return made[server]
    ctx = None
    if config.tls_cert:
        if not (config.tls_key and config.tls_ca):
            raise ValueError("TLS needs DANAUS_TLS_CERT, DANAUS_TLS_KEY and DANAUS_TLS_CA together")
        purpose = ssl.Purpose.CLIENT_AUTH if server else ssl.Purpose.SERVER_AUTH
        ctx = ssl.create_default_context(purpose, cafile=config.tls_ca)
        ctx.load_cert_chain(config.tls_cert, config.tls_key)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
    made[server] = ctx
    return ctx


def parse_addr(addr: str) -> tuple[str, str | tuple[str, int]]:
    """``unix:@name`` (abstract), ``unix:/path`` or ``tcp://host:port`` -> (family, address)."""
    if addr.startswith("unix:"):
        rest = addr[5:]
        return "unix", ("\0" + rest[1:]) if rest.startswith("@") else rest
    if addr.startswith("tcp://"):
        host, _, port = addr[6:].rpartition(":")
        return "tcp", (host.strip("[]"), int(port))
    raise ValueError(f"unsupported address {addr!r}: use unix:@name, unix:/path or tcp://host:port")


def listen_address(*, proc: bool) -> str:
    """Where a new runtime of this process (``proc=False``) or a proc it starts on this
    host (``proc=True``: ``unix:@`` and ``tcp://host:0`` are bound by the starter) listens,
    as ``config.transport`` says.

    Raises:
        ValueError: the transport is TLS and ``tls_cert``/``tls_key``/``tls_ca`` are unset.
    """
    t = config.transport
    if t == "unix":
        return "unix:@" if proc else f"unix:@danaus-{secrets.token_hex(16)}"
    if t == "tcp(localhost)":
        return "tcp://127.0.0.1:0"
    if t in ("tcp(hostname)", "tls", "metatls(hostname)", "metatls(ipv6)"):
        if t != "tcp(hostname)" and not config.tls_cert:
            raise ValueError(
                f"transport {t!r} is TCP with TLS: set tls_cert, tls_key and tls_ca "
                "(DANAUS_TLS_CERT, ...) to the job's certificates"
            )
        return f"tcp://{socket.gethostname()}:0"
    if t.startswith("tcp://"):
        return t.rpartition(":")[0] + ":0" if proc else t
    if t.startswith(("ipc://", "unix:")):
        if proc:
            return "unix:@"
        return "unix:" + t[len("ipc://") :] if t.startswith("ipc://") else t
    raise ValueError(f"config.transport {t!r} names no transport")
