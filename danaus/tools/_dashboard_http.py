"""The dashboard's HTTP side (standard library only): the page, its event stream, a
snapshot as JSON, and a proc's stacks. Every path is under the server's prefix (its
token); anything else is refused."""

from __future__ import annotations

import contextlib
import hmac
import http.server
import importlib.resources
import json
import logging
import secrets
import socket
import urllib.parse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._dashboard_feed import Feed
    from .dashboard import Source

log = logging.getLogger("danaus.dashboard")

__all__ = ["HTTPServer"]

#: an event stream with nothing new for this long gets a comment, so dead ones are noticed
KEEPALIVE = 15.0
#: how long a one-off snapshot request waits for one (s)
SNAPSHOT_WAIT = 35.0


def _page() -> bytes:
    return importlib.resources.files(__package__).joinpath("dashboard.html").read_bytes()


class _BadRequest(Exception):
    pass


class _Handler(http.server.BaseHTTPRequestHandler):
    server: HTTPServer
    server_version = "danaus-dashboard"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        try:
            self._route()
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:
            log.warning("dashboard: %s failed", self.path, exc_info=True)
            with contextlib.suppress(OSError):
                self._send(500, f"{type(e).__name__}: {e}\n")

    def _send(self, code: int, body: str | bytes, kind: str = "text/plain; charset=utf-8") -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        prefix = self.server.prefix
        if url.path == prefix.rstrip("/") and prefix != "/":
            self.send_response(302)
            self.send_header("Location", prefix)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if not hmac.compare_digest(url.path[: len(prefix)].encode(), prefix.encode()):
            self._send(403, "this dashboard's address holds a token: use the URL it printed\n")
            return
        route = url.path[len(prefix) :]
        try:
            if route == "":
                self._index()
            elif route == "events":
                self._events()
            elif route == "snapshot":
                self._snapshot()
            elif route == "stacks":
                self._stacks(url.query)
            else:
                self._send(404, f"no page {route!r} here\n")
        except _BadRequest as e:
            self._send(400, f"{e}\n")

    def _index(self) -> None:
        nonce = secrets.token_urlsafe(16)
        page = self.server.page.replace(b"__NONCE__", nonce.encode())
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")  # the URL holds the token
        self.send_header(
            "Content-Security-Policy",
            f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; "
            "connect-src 'self'; img-src data:; frame-ancestors 'none'; base-uri 'none'",
        )
        self.end_headers()
        self.wfile.write(page)

    def _events(self) -> None:
        feed = self.server.feed
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(b"retry: 2000\n\n")
        self.wfile.flush()
        with feed.wanted():
            seq = feed.start()
            while True:
                try:
                    got = feed.after(seq, KEEPALIVE)
                except EOFError:
                    return
                if got is None:
                    self.wfile.write(b": keepalive\n\n")
                else:
                    seq = got.seq
                    self.wfile.write(b"data: " + got.data + b"\n\n")
                self.wfile.flush()

    def _snapshot(self) -> None:
        feed = self.server.feed
        with feed.wanted():
            got = feed.after(feed.start(), SNAPSHOT_WAIT + feed.interval)
        if got is None:
            self._send(504, "no snapshot in time\n")
        else:  # (an error is JSON too: {"error", "time"})
            self._send(502 if got.failed else 200, got.data, "application/json")

    def _stacks(self, query: str) -> None:
        try:
            args = urllib.parse.parse_qs(query, keep_blank_values=True, strict_parsing=True)
        except ValueError:
            raise _BadRequest(f"a malformed query: {query!r}") from None
        procs, rank = args.get("procs", []), args.get("rank", [])
        if len(procs) != 1 or not procs[0] or len(rank) != 1:
            raise _BadRequest("stacks wants one procs=NAME and one rank=N")
        try:
            r = int(rank[0])
        except ValueError:
            raise _BadRequest(f"rank={rank[0]!r} is not a number") from None
        if r < 0:
            raise _BadRequest(f"rank={r} is negative")
        try:
            stacks = self.server.source.stacks(procs[0], r)
        except LookupError as e:
            self._send(404, f"{e}\n")
            return
        except Exception as e:
            self._send(502, f"proc {procs[0]}[{r}] did not give its stacks: {e}\n")
            return
        self._send(200, json.dumps(stacks, default=str), "application/json")


class HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, where: tuple[str, int], source: Source, feed: Feed, prefix: str) -> None:
        self.address_family = socket.AF_INET6 if ":" in where[0] else socket.AF_INET
        self.source, self.feed, self.prefix = source, feed, prefix
        self.page = _page()
        super().__init__(where, _Handler)
