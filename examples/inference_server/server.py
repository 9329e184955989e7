"""An HTTP model server (aiohttp) on a danaus mesh: streaming, live reload, failover.

Run it::

    python -m examples.inference_server.server --port 8080 --replicas 2

Routes:

- ``POST /generate`` ``{"prompt": "...", "max_tokens": 64, "stream": true}``: the tokens
  as Server-Sent Events (``data: "c"`` per token, then ``event: done``), or one JSON
  answer with ``"stream": false``. 503 when no replica can answer. A client that leaves
  mid-stream cancels its call: the replica stops generating.
- ``GET /health``: each replica's state; 200 while at least one replica serves.
- ``GET /metrics``: request counts and latency quantiles, Prometheus text format.
- ``POST /reload`` ``{"train_steps": 0}``: the trainer (optionally trains, then)
  publishes its weights as an ``RDMABuffer``; every replica reads them into its
  parameters. Answers the bytes moved and the time.

danaus lives inside aiohttp's event loop: the meshes are spawned in the app's startup
hook and stopped in its cleanup hook, every danaus call is awaited, nothing blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from .replicas import InferenceServer, Unavailable

__all__ = ["SERVER", "main", "make_app"]

log = logging.getLogger("inference_server")

MAX_TOKENS = 512
MAX_PROMPT = 2000


SERVER = web.AppKey("server", InferenceServer)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _parse(request: web.Request) -> tuple[str, int, bool]:
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text="the body must be JSON") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="the body must be a JSON object")
    prompt = body.get("prompt", "")
    n = body.get("max_tokens", 64)
    stream = body.get("stream", True)
    if not isinstance(prompt, str) or len(prompt) > MAX_PROMPT:
        raise web.HTTPBadRequest(text=f"prompt must be a string of at most {MAX_PROMPT} chars")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_TOKENS:
        raise web.HTTPBadRequest(text=f"max_tokens must be an int in 1..{MAX_TOKENS}")
    if not isinstance(stream, bool):
        raise web.HTTPBadRequest(text="stream must be true or false")
    return prompt, n, stream


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


async def generate(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER]
    metrics = server.metrics
    prompt, max_tokens, stream = await _parse(request)
    t0 = time.perf_counter()
    tokens = server.tokens(prompt, max_tokens)
    text: list[str] = []
    try:
        # Headers wait for the first token, so a request that fails before it gets a
        # real 503; once streaming, a failure can only be an `error` event.
        try:
            first = await anext(tokens)
        except Unavailable as e:
            metrics.observe(503, time.perf_counter() - t0)
            return _error(503, str(e))
        metrics.first_token.append(time.perf_counter() - t0)
        text.extend(first)
        if not stream:
            try:
                async for batch in tokens:
                    text.extend(batch)
            except Unavailable as e:
                metrics.observe(503, time.perf_counter() - t0)
                return _error(503, str(e))
            metrics.tokens += len(text)
            metrics.observe(200, time.perf_counter() - t0)
            return web.json_response({"text": "".join(text), "tokens": len(text)})
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        try:
            await resp.write(b"".join(_sse(tok) for tok in first))
            try:
                async for batch in tokens:
                    text.extend(batch)
                    await resp.write(b"".join(_sse(tok) for tok in batch))
            except Unavailable as e:
                metrics.observe(503, time.perf_counter() - t0)
                await resp.write(_sse({"status": 503, "error": str(e)}, "error"))
                return resp
            metrics.tokens += len(text)
            await resp.write(_sse({"text": "".join(text), "tokens": len(text)}, "done"))
            await resp.write_eof()
        except ConnectionResetError:
            metrics.observe(499, time.perf_counter() - t0)
            return resp
        metrics.observe(200, time.perf_counter() - t0)
        return resp
    finally:
        await tokens.aclose()


async def health(request: web.Request) -> web.Response:
    status, body = await request.app[SERVER].health()
    return web.json_response(body, status=status)


async def metrics(request: web.Request) -> web.Response:
    server = request.app[SERVER]
    return web.Response(
        text=server.metrics.render(server.healthy(), server.size),
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Prometheus-Format": "0.0.4"},
    )


async def reload(request: web.Request) -> web.Response:
    steps = 0
    if request.can_read_body:
        try:
            body = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(text="the body must be JSON") from None
        asked = body.get("train_steps", 0) if isinstance(body, dict) else None
        if not isinstance(asked, int) or isinstance(asked, bool) or not 0 <= asked <= 1000:
            raise web.HTTPBadRequest(text="train_steps must be an int in 0..1000")
        steps = asked
    try:
        return web.json_response(await request.app[SERVER].reload(steps))
    except Unavailable as e:
        return _error(503, str(e))


def make_app(replicas: int = 2, **options: Any) -> web.Application:
    """The aiohttp application; its startup hook spawns the meshes, cleanup stops them.

    Args:
        replicas: model replicas (one proc each).
        options: passed to :class:`InferenceServer` (``seed``, ``trainer_seed``,
            ``drain_timeout``, ``spawn_timeout``).
    """
    app = web.Application()
    server = InferenceServer(replicas, **options)
    app[SERVER] = server

    async def on_startup(app: web.Application) -> None:
        await server.start()

    async def on_shutdown(app: web.Application) -> None:
        # aiohttp stopped accepting; it now waits (up to its shutdown_timeout) for the
        # requests in flight, which still have their replicas. New ones get 503.
        server.drain()

    async def on_cleanup(app: web.Application) -> None:
        await server.aclose()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/reload", reload)
    return app


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until SIGINT/SIGTERM; then drain in-flight requests (bounded) and stop."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("PORT", "8080")),
        help="0 picks a free port (printed at startup)",
    )
    parser.add_argument("--replicas", type=int, default=int(os.environ.get("REPLICAS", "2")))
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=10.0,
        help="seconds in-flight requests get at shutdown",
    )
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    web.run_app(
        make_app(ns.replicas, drain_timeout=ns.drain_timeout),
        host=ns.host,
        port=ns.port,
        shutdown_timeout=ns.drain_timeout,
        loop=loop,
        print=functools.partial(print, flush=True),
        access_log=None,
    )


if __name__ == "__main__":
    main()
