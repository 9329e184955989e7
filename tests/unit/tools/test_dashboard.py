"""The dashboard's server with a made-up source: rates from successive snapshots, what a
dead proc last showed, one snapshot per interval for every open page, and its refusals."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from danaus.tools.dashboard import DashboardServer


class FakeSource:
    """A controller with one proc mesh of two procs, one actor each, handling 10 more
    messages per snapshot, one simulated second apart; ``kill()`` fails proc 1."""

    def __init__(self, gated: bool = False) -> None:
        self.calls = 0
        self.dead = False
        self.broken = False
        self.lock = threading.Lock()
        self.closed = False
        #: when gated, each snapshot waits for a step()
        self.gate = threading.Semaphore(0) if gated else None

    def step(self) -> None:
        assert self.gate is not None
        self.gate.release()

    def snapshot(self) -> dict[str, Any]:
        if self.gate is not None:
            assert self.gate.acquire(timeout=30), "the test took no step"
        with self.lock:
            self.calls += 1
            n = self.calls
        if self.broken:
            raise ConnectionError("the controller went away")
        procs = [{"rank": 0, "point": "{'procs': 0/2}", "health": "ok", "host": "h1", "pid": 10}]
        actors = [_actor(0, 10 * n)]
        if self.dead:
            procs.append({"rank": 1, "point": "{'procs': 1/2}", "health": "failed", "pid": 11})
            procs[1]["failure"] = "killed by SIGKILL"
        else:
            procs.append({"rank": 1, "point": "{'procs': 1/2}", "health": "ok", "host": "h1"})
            actors.append(_actor(1, 10 * n))
        return {
            "time": 1000.0 + n,
            "controller": {"pid": 1, "host": "h1", "argv": ["job.py"]},
            "proc_meshes": [{"name": "procs", "sizes": {"procs": 2}, "procs": procs}],
            "actors": actors,
            "stuck": [{"actor": "procs[0].a[0]", "stack": f"stack {i}"} for i in range(60)],
            "failures": [],
        }

    def stacks(self, procs: str, rank: int) -> list[dict[str, Any]]:
        if procs != "procs" or rank > 1:
            raise LookupError(f"no proc {procs}[{rank}]")
        if self.dead and rank == 1:
            raise ConnectionError("no address to ask")
        return [{"thread": "MainThread", "stack": "  File 'x.py', line 1\n"}]

    def close(self) -> None:
        self.closed = True
        if self.gate is not None:
            self.gate.release(100)


def _actor(rank: int, handled: int) -> dict[str, Any]:
    return {
        "actor": f"procs[{rank}].a[{rank}]",
        "mesh": "a",
        "rank": rank,
        "procs": "procs",
        "proc_rank": rank,
        "handled": {"step": handled},
        "errors": {},
        "mailbox": 2,
        "in_flight": 0,
        "running": [],
        "health": "idle",
    }


@pytest.fixture(params=[False], ids=["free"])
def served(request: pytest.FixtureRequest) -> Any:
    source = FakeSource(gated=request.param)
    server = DashboardServer(source, 0, "127.0.0.1", interval=0.05, token=True)
    yield source, server
    if source.gate is not None:
        source.gate.release(100)  # a snapshot waiting for a step must not hold up close
    server.close()
    assert source.closed


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()


class Events:
    """An open ``events`` stream, read one event at a time."""

    def __init__(self, url: str) -> None:
        self.response = urllib.request.urlopen(url + "events", timeout=30)

    def next(self) -> dict[str, Any]:
        while True:
            line = self.response.readline()
            assert line, "the event stream ended"
            if line.startswith(b"data: "):
                return dict(json.loads(line[6:]))

    def close(self) -> None:
        self.response.close()


@pytest.mark.parametrize("served", [True], ids=["gated"], indirect=True)
def test_rates_come_from_successive_snapshots_and_dead_procs_keep_their_actors(served) -> None:
    source, server = served
    events = Events(server.url)
    try:
        source.step()
        first = events.next()
        assert first["totals"]["rate"] is None  # nothing to compare with yet
        source.step()
        second = events.next()
        # 10 more messages per actor, one (snapshot) second later
        assert [a["rate"] for a in second["actors"]] == [10.0, 10.0]
        assert second["totals"]["rate"] == 20.0
        assert second["totals"]["handled"] == sum(a["handled_total"] for a in second["actors"])
        source.dead = True
        source.step()
        third = events.next()
    finally:
        events.close()
    procs = third["proc_meshes"][0]["procs"]
    assert [p["health"] for p in procs] == ["ok", "failed"]
    assert procs[1]["host"] == "h1"  # where it was last seen
    gone = [a for a in third["actors"] if a.get("stale")]
    assert [(a["actor"], a["health"], a["rate"]) for a in gone] == [
        ("procs[1].a[1]", "failed", None)
    ]


def test_one_snapshot_per_interval_serves_every_open_page(served) -> None:
    source, server = served
    streams = [Events(server.url) for _ in range(4)]
    try:
        seen = [[s.next()["time"] for _ in range(5)] for s in streams]
    finally:
        for s in streams:
            s.close()
    times = {t for ts in seen for t in ts}
    # four pages, five events each: as many snapshots as the slowest page needed, not 20
    assert source.calls <= len(times) + 1 < 12


def test_the_page_its_stacks_and_its_refusals(served) -> None:
    source, server = served
    status, page = _get(server.url)
    assert status == 200 and b"<title>danaus dashboard</title>" in page
    assert b"__NONCE__" not in page
    status, body = _get(server.url + "stacks?procs=procs&rank=0")
    assert status == 200 and json.loads(body)[0]["thread"] == "MainThread"
    root = server.url.rsplit("/", 2)[0]
    for path, code in [
        ("nope", 404),
        ("stacks", 400),
        ("stacks?procs=procs", 400),
        ("stacks?procs=procs&rank=x", 400),
        ("stacks?procs=procs&rank=-1", 400),
        ("stacks?procs=procs&rank=0&rank=1", 400),
        ("stacks?procs=procs&rank=0&&=", 400),
        ("stacks?procs=nope&rank=0", 404),
        ("stacks?procs=procs&rank=9", 404),
    ]:
        status, body = _get(server.url + path)
        assert status == code, (path, status, body)
    assert _get(root + "/snapshot")[0] == 403  # no token
    assert _get(root + "/wrong-token/snapshot")[0] == 403
    source.dead = True
    status, body = _get(server.url + "stacks?procs=procs&rank=1")
    assert status == 502 and b"no address to ask" in body
    status, body = _get(server.url + "snapshot")  # still serving
    assert status == 200 and json.loads(body)["controller"]["pid"] == 1


def test_a_token_less_dashboard_and_close_ends_open_streams() -> None:
    source = FakeSource()
    server = DashboardServer(source, 0, "127.0.0.1", interval=0.05, token=False)
    assert repr(server) == f"<DashboardServer serving {server.url} of {source!r}>"
    assert server.url == f"http://127.0.0.1:{server.port}/"
    events = Events(server.url)
    try:
        events.next()
        server.close()
        with pytest.raises((AssertionError, http.client.IncompleteRead, ConnectionError)):
            while True:
                events.next()
    finally:
        events.close()
    assert repr(server).startswith("<DashboardServer closed")
    server.close()  # twice is fine


def test_a_source_that_fails_gives_an_error_event_and_old_reports_are_cut(served) -> None:
    source, server = served
    status, body = _get(server.url + "snapshot")
    snap = json.loads(body)
    assert status == 200 and snap["stuck_count"] == 60 and snap["failures_count"] == 0
    assert [s["stack"] for s in snap["stuck"]] == [f"stack {i}" for i in range(10, 60)]
    source.broken = True
    events = Events(server.url)
    try:
        event = events.next()
        while "error" not in event:  # (one taken before the break may come first)
            event = events.next()
    finally:
        events.close()
    assert event["error"] == "no snapshot: ConnectionError: the controller went away"
    status, body = _get(server.url + "snapshot")
    assert status == 502 and "went away" in json.loads(body)["error"]
    source.broken = False
    deadline = time.monotonic() + 30  # (the error stays the latest for up to 2 intervals)
    while _get(server.url + "snapshot")[0] != 200:
        assert time.monotonic() < deadline, "no snapshot after the source came back"


def test_import_danaus_does_not_load_the_http_server() -> None:
    code = "import sys, danaus; print('http.server' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
