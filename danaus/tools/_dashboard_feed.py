"""The dashboard's feed: one snapshot per interval, taken while anyone waits for one,
with message rates (from the previous snapshot's counts) and what procs that stopped
answering last showed; every waiter gets the same encoded event."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .dashboard import Source

log = logging.getLogger("danaus.dashboard")

__all__ = ["Event", "Feed"]

#: how long closing waits for a snapshot in progress (s)
WAIT = 30.0
#: the newest stuck reports and failures sent (the controller keeps 256 of each)
SHOWN = 50


class Event(NamedTuple):
    """One snapshot as sent: its number, its JSON, and whether it is an error instead."""

    seq: int
    data: bytes
    failed: bool


def _total(counts: Any) -> int:
    return sum(counts.values()) if isinstance(counts, dict) else 0


class Feed:
    """Takes a snapshot every ``interval`` while anyone waits for one, adds message rates
    (from the last snapshot's counts) and what dead procs last showed, and hands the same
    encoded event to every waiter."""

    def __init__(self, source: Source, interval: float) -> None:
        self.source = source
        self.interval = interval
        self._cond = threading.Condition()
        self._latest = Event(0, b"", False)
        self._taken = 0.0
        self._wanted = 0  # open event streams and one-shot requests
        self._closed = False
        #: (procs, proc rank, actor) -> (snapshot time, messages handled) last time
        self._counts: dict[tuple[str, int, str], tuple[float, int]] = {}
        #: (procs, proc rank) -> (host, actors) it last showed, for when it stops answering
        self._seen: dict[tuple[str, int], tuple[str | None, list[dict[str, Any]]]] = {}
        self._thread = threading.Thread(target=self._run, name="danaus-dashboard-feed", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._wanted > 0)
                if self._closed:
                    return
            started = time.monotonic()
            picture = self._take()
            data = json.dumps(picture, default=str).encode()
            with self._cond:
                self._latest = Event(self._latest.seq + 1, data, "error" in picture)
                self._taken = started
                self._cond.notify_all()
                self._cond.wait_for(
                    lambda: self._closed, started + self.interval - time.monotonic()
                )

    def _take(self) -> dict[str, Any]:
        try:
            return self._annotate(self.source.snapshot())
        except Exception as e:
            log.debug("dashboard: no snapshot", exc_info=True)
            return {"error": f"no snapshot: {type(e).__name__}: {e}", "time": time.time()}

    def _annotate(self, snap: dict[str, Any]) -> dict[str, Any]:
        now = float(snap.get("time") or time.time())
        counts: dict[tuple[str, int, str], tuple[float, int]] = {}
        total_rate: float | None = None
        by_proc: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for a in snap.get("actors", []):
            key = (str(a.get("procs")), int(a.get("proc_rank", -1)), str(a.get("actor")))
            handled = _total(a.get("handled"))
            counts[key] = (now, handled)
            before = self._counts.get(key)
            a["handled_total"] = handled
            a["errors_total"] = _total(a.get("errors"))
            a["rate"] = None
            # a rate over a long gap (nobody watched) would be an average: show none
            if before is not None and 0 < now - before[0] <= 3 * self.interval + 5:
                a["rate"] = max(handled - before[1], 0) / (now - before[0])
                total_rate = (total_rate or 0.0) + a["rate"]
            by_proc.setdefault(key[:2], []).append(a)
        self._counts = counts
        seen: dict[tuple[str, int], tuple[str | None, list[dict[str, Any]]]] = {}
        for pm in snap.get("proc_meshes", []):
            for p in pm.get("procs", []):
                where = (str(pm.get("name")), int(p.get("rank", -1)))
                host, last = self._seen.get(where, (None, []))
                if p.get("host") is None:
                    p["host"] = host
                mine = by_proc.get(where, [])
                if not mine and p.get("health") != "ok":
                    # it cannot answer: show what ran there, marked as not current
                    health = "failed" if p.get("health") == "failed" else "unknown"
                    gone = {"health": health, "stale": True, "rate": None, "mailbox": None}
                    mine = [{**a, **gone, "in_flight": 0, "running": []} for a in last]
                    snap.setdefault("actors", []).extend(mine)
                seen[where] = (p.get("host"), [a for a in mine if not a.get("stale")] or last)
        self._seen = seen
        for kind in ("stuck", "failures"):  # the newest only: each event carries them
            reports = list(snap.get(kind, []))
            snap[kind], snap[f"{kind}_count"] = reports[-SHOWN:], len(reports)
        snap["totals"] = {
            "rate": total_rate,
            "handled": sum(c for _, c in counts.values()),
            "interval": self.interval,
        }
        return snap

    @contextlib.contextmanager
    def wanted(self) -> Iterator[None]:
        """While inside, snapshots are taken."""
        with self._cond:
            self._wanted += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._wanted -= 1

    def start(self) -> int:
        """The sequence number a new watcher starts after: the latest event's if it is
        fresh, else the one before it."""
        with self._cond:
            seq = self._latest.seq
            fresh = seq > 0 and time.monotonic() - self._taken < 2 * self.interval
            return seq - 1 if fresh else seq

    def after(self, seq: int, timeout: float) -> Event | None:
        """The latest event if it is newer than ``seq``, waiting up to ``timeout`` for
        one; None if none came. Raises ``EOFError`` once the feed is closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._latest.seq > seq, timeout)
            if self._closed:
                raise EOFError("the dashboard is closed")
            return self._latest if self._latest.seq > seq else None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(WAIT)
