"""A live dashboard of a running job, in a browser: ``danaus.dashboard()`` in the
controller, or ``danaus dashboard [--attach ADDR]`` from another process on its host.

One page (``dashboard.html``, plain JS, no build step) shows the topology (hosts, proc
meshes, procs, actors) coloured by health, each actor's message rate and mailbox depth,
the failures with their reports and the stuck-endpoint alerts with their stacks, an
actor's stack on click, and a training view of the controller's ``danaus.parallel``
trainers (plan, stages, loss and tokens/s curves) from the snapshot's ``sections``. It updates through server-sent events (``events``): one snapshot
per interval, taken only while someone watches and shared by every open page.

The server is the standard library's (``http.server``, a daemon thread), reading a
:class:`Source`: :class:`LocalSource` asks this controller in-process,
:class:`AdminSource` asks a controller through its admin endpoint.

Security: the page shows the job's internals (actor names, stacks, failure reports, the
controller's command line) to whoever can reach it. It listens on 127.0.0.1 by default,
and its URL holds a random token (as Jupyter's does): print it only where the job's user
can read it. To look from another machine, tunnel rather than listen on a public address:
``ssh -L 8265:127.0.0.1:PORT host`` and open ``http://127.0.0.1:8265/TOKEN/``.
"""

from __future__ import annotations

import secrets
import signal
import socket
import threading
from typing import Any, Protocol

from ..mesh.seam import set_dashboard_starter

__all__ = ["AdminSource", "DashboardServer", "LocalSource", "Source", "dashboard", "main"]

#: how long one snapshot or stacks request may take before the page is told it failed (s)
REQUEST_TIMEOUT = 30.0


class Source(Protocol):
    """Where a dashboard's data comes from. Both calls block, and may raise; ``stacks``
    raises ``LookupError`` for a proc mesh or rank that does not exist."""

    def snapshot(self) -> dict[str, Any]:
        """Everything the controller runs now (``danaus.mesh._admin.snapshot.snapshot``)."""
        ...

    def stacks(self, procs: str, rank: int) -> list[dict[str, Any]]:
        """The stacks of proc ``rank`` of the proc mesh named ``procs``."""
        ...

    def close(self) -> None: ...


class LocalSource:
    """This controller, in-process: the snapshot runs on danaus's background loop."""

    def __init__(self, timeout: float = REQUEST_TIMEOUT) -> None:
        self.timeout = timeout

    def _run(self, make: Any) -> Any:
        from ..actors.seam import background_runtime, run_task

        fut = run_task(background_runtime(), make)
        try:
            return fut.result(self.timeout)
        except TimeoutError:
            fut.cancel()
            raise

    def snapshot(self) -> dict[str, Any]:
        from ..mesh.seam import snapshot

        return dict(self._run(snapshot))

    def stacks(self, procs: str, rank: int) -> list[dict[str, Any]]:
        from ..mesh.seam import proc_stacks

        return list(self._run(lambda: proc_stacks(procs, rank)))

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return "<LocalSource>"


class AdminSource:
    """A controller reached through its admin endpoint: ``addr`` (None: the newest
    controller of this user on this host) and ``key`` (None: from its admin file, else
    ``DANAUS_AUTH_KEY``). Connects at once, so that a wrong address or key fails here;
    after an error it connects again on the next call."""

    def __init__(
        self, addr: str | None = None, key: bytes | None = None, timeout: float = REQUEST_TIMEOUT
    ) -> None:
        from ..mesh import AdminClient, AdminError

        self._key = key
        self._timeout = timeout
        self._lock = threading.Lock()
        client = AdminClient(addr, key, timeout)
        self.addr = client.addr  # the one found: later connections go to the same one
        hello = client.call("hello")
        if not isinstance(hello, dict):
            client.close()
            raise AdminError(f"{self.addr} answered hello with {type(hello).__name__}")
        self.hello: dict[str, Any] = hello
        self._client: Any = client

    def _call(self, op: str, **args: Any) -> Any:
        from ..mesh import AdminClient

        with self._lock:
            if self._client is None:
                self._client = AdminClient(self.addr, self._key, self._timeout)
            client = self._client
        try:
            return client.call(op, **args)
        except Exception:
            # a timeout can leave a reply half read: start the next call afresh
            with self._lock:
                if self._client is client:
                    self._client = None
            client.close()
            raise

    def snapshot(self) -> dict[str, Any]:
        return dict(self._call("snapshot"))

    def stacks(self, procs: str, rank: int) -> list[dict[str, Any]]:
        from ..mesh import AdminError

        try:
            return list(self._call("stacks", procs=procs, rank=rank))
        except AdminError as e:
            if str(e).startswith("KeyError: "):  # the controller's "no such mesh or rank"
                raise LookupError(str(e).removeprefix("KeyError: ").strip("'\"")) from None
            raise

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __repr__(self) -> str:
        return f"<AdminSource {self.addr}>"


class DashboardServer:
    """A running dashboard: open ``url``; ``close()`` stops it (also as a context manager)."""

    def __init__(self, source: Source, port: int, addr: str, interval: float, token: bool) -> None:
        self.source = source
        self.closed = False
        self._token = secrets.token_urlsafe(24) if token else ""
        prefix = f"/{self._token}/" if token else "/"
        # (imported here: ``import danaus`` need not load http.server)
        from ._dashboard_feed import Feed
        from ._dashboard_http import HTTPServer

        self._feed = Feed(source, interval)
        try:
            self._http = HTTPServer((addr, port), source, self._feed, prefix)
        except BaseException:
            self._feed.close()
            raise
        self.port: int = self._http.server_address[1]
        host = socket.gethostname() if addr in ("", "0.0.0.0", "::") else addr
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}{prefix}"
        self._thread = threading.Thread(
            target=self._http.serve_forever, name="danaus-dashboard", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving: open pages lose their event stream; the source is closed."""
        if self.closed:
            return
        self.closed = True
        self._http.shutdown()
        self._feed.close()
        self._http.server_close()
        self._thread.join(5)
        self.source.close()

    def __enter__(self) -> DashboardServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "serving"
        return f"<DashboardServer {state} {self.url} of {self.source!r}>"


def dashboard(
    port: int = 0, addr: str = "127.0.0.1", *, interval: float = 1.0, token: bool = True
) -> DashboardServer:
    """Serve a live dashboard of this controller's meshes; open the returned ``.url``.

    Args:
        port: the port to listen on; 0 picks a free one (see ``.port``).
        addr: the address to listen on. The default, 127.0.0.1, is this host only; the
            page shows the job's internals to anyone who reaches it (see the module's
            docstring: use an ssh tunnel to look from elsewhere).
        interval: seconds between snapshots while a page is open.
        token: put a random token in the URL's path, so that only who has the URL sees
            the page (as Jupyter does).
    """
    return DashboardServer(LocalSource(), port, addr, interval, token)


def _start_for_job(port: int) -> str:
    """A job's dashboard (``enable_telemetry(include_dashboard=True)``): on ``port`` of
    this host only (127.0.0.1), with a token in the URL; it serves until the program
    ends."""
    return dashboard(port).url


set_dashboard_starter(_start_for_job)


def main(argv: list[str] | None = None) -> None:
    """``danaus dashboard``: serve the dashboard of a controller found through its admin
    endpoint, until interrupted."""
    import argparse

    from ..mesh import AdminError
    from ._attach import add_attach_options, read_key

    parser = argparse.ArgumentParser(
        prog="danaus dashboard",
        description="Serve a live dashboard of a running danaus controller. The page shows "
        "the job's internals to whoever reaches it: it listens on 127.0.0.1 and its URL "
        "holds a token; from elsewhere, use an ssh tunnel (ssh -L PORT:127.0.0.1:PORT host).",
    )
    add_attach_options(parser)
    parser.add_argument(
        "--port", type=int, default=0, help="port to serve on (default: a free one)"
    )
    parser.add_argument(
        "--addr", default="127.0.0.1", help="address to serve on (default: %(default)s)"
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between snapshots (default: 1)"
    )
    parser.add_argument(
        "--no-token", action="store_true", help="no token in the URL: anyone who reaches it sees it"
    )
    ns = parser.parse_args(argv)
    try:
        key = read_key("danaus dashboard", ns.key_file) if ns.key_file else None
        source = AdminSource(ns.attach, key)
    except (OSError, ValueError, AdminError) as e:
        raise SystemExit(f"danaus dashboard: {e}") from None
    server = DashboardServer(source, ns.port, ns.addr, ns.interval, not ns.no_token)
    hello = source.hello
    print(
        f"danaus dashboard of the controller at {source.addr} "
        f"(pid {hello.get('pid')} on {hello.get('host')}); open:",
        flush=True,
    )
    print(server.url, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
