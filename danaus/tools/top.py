"""``danaus top``: a terminal view of a running controller, like top.

``danaus top [--attach ADDR] [--key-file F] [--interval S]`` attaches to a controller's
admin endpoint (without ``--attach``, the newest controller of this user on this host) and
shows its procs and actors, asking for a new snapshot every interval on a thread of its
own, so that a slow controller never freezes the screen. Keys: up/down (j/k) select an
actor, ``n m c h e r`` sort (by name, mailbox, its proc's CPU, handled, errors, running
time; again reverses), ``s`` the selected actor's stack, ``q`` quits.

What is drawn comes from :mod:`._top_model` and :mod:`._top_render` (pure, tested
without a terminal); this module holds the terminal and the connection.
"""

from __future__ import annotations

import argparse
import contextlib
import curses
import os
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, NamedTuple

from ..config import config
from ..mesh import AdminClient, AdminError
from ..mesh.seam import find_controllers
from ._attach import add_attach_options, read_key
from ._top_model import View, actor_rows
from ._top_render import Line, Style, handle_key, render

__all__ = ["Poller", "main"]

#: how long one request may take before the connection is dropped and made again (s)
CALL_TIMEOUT = 15.0
#: a snapshot in flight this long is news (s): a controller asks each proc with a 5 s
#: bound, so a frozen proc alone does not make it "not answering"
SLOW = 6.0


class PollerState(NamedTuple):
    """What the screen shows of the connection: the last snapshot and the news."""

    snapshot: dict[str, Any] | None
    version: int  # counts the snapshots
    status: str
    gone: str | None


def _timed_out(e: BaseException) -> bool:
    return isinstance(e, TimeoutError)  # AdminTimeout is one


class Poller:
    """Asks a controller for a snapshot every ``interval`` seconds on its own thread.

    A request that times out drops the connection and the next one makes a new one
    ("controller not answering"); a closed connection is made again once at once, and if
    that fails the controller is gone (``state().gone`` says why) and the thread ends.
    """

    def __init__(self, client: AdminClient, key: bytes | None, interval: float) -> None:
        self.addr = client.addr
        self._key = key
        self._interval = interval
        self._lock = threading.Lock()
        self._client: AdminClient | None = client
        self._snapshot: dict[str, Any] | None = None
        self._version = 0
        self._last_answer = time.monotonic()
        self._asking_since: float | None = None
        self._problem: str | None = None
        self._gone: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="danaus-top-poller", daemon=True)

    def __repr__(self) -> str:
        state = "gone" if self._gone else "stopped" if self._stop.is_set() else "polling"
        return f"<Poller {self.addr} {state}>"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
        # A request in flight may wait out its timeout (closing a socket does not wake a
        # thread in recv); the thread is a daemon, so one does not wait for it long.
        self._thread.join(1.0)

    def state(self) -> PollerState:
        now = time.monotonic()
        with self._lock:
            status = self._problem or ""
            if self._asking_since is not None and now - self._asking_since > SLOW:
                status = "controller not answering"
            if status == "controller not answering":
                status += f" for {now - self._last_answer:.0f} s; still trying"
            return PollerState(self._snapshot, self._version, status, self._gone)

    def ask_stacks(self, procs: str, rank: int) -> Future[list[dict[str, Any]]]:
        """The stacks of proc ``rank`` of the proc mesh ``procs``, asked on a thread."""
        done: Future[list[dict[str, Any]]] = Future()

        def ask() -> None:
            client = self._client
            try:
                if client is None:
                    raise AdminError("not connected to the controller now")
                stacks = client.call("stacks", procs=procs, rank=rank)
                if not isinstance(stacks, list):
                    raise AdminError(f"stacks came as {type(stacks).__name__}, not a list")
                done.set_result(stacks)
            except (AdminError, OSError) as e:
                done.set_exception(e)

        threading.Thread(target=ask, name="danaus-top-stacks", daemon=True).start()
        return done

    # the thread

    def _connect(self) -> AdminClient:
        return AdminClient(self.addr, self._key, timeout=CALL_TIMEOUT)

    def _run(self) -> None:
        while not self._stop.is_set() and self._gone is None:
            started = time.monotonic()
            self._poll()
            self._stop.wait(max(0.0, self._interval - (time.monotonic() - started)))

    def _poll(self) -> None:
        try:
            client = self._client
            if client is None:
                client = self._connect()
                with self._lock:
                    if self._stop.is_set():  # closed meanwhile
                        client.close()
                        return
                    self._client = client
            with self._lock:
                self._asking_since = time.monotonic()
            snap = client.call("snapshot")
            if not isinstance(snap, dict):
                raise AdminError(f"the snapshot came as {type(snap).__name__}, not an object")
        except (AdminError, OSError) as e:
            if not self._stop.is_set():
                self._failed(e)
            return
        with self._lock:
            self._snapshot = snap
            self._version += 1
            self._last_answer = time.monotonic()
            self._asking_since = None
            self._problem = None

    def _failed(self, e: BaseException) -> None:
        with self._lock:
            client, self._client = self._client, None
            self._asking_since = None
        if client is not None:
            client.close()
        if _timed_out(e):
            with self._lock:
                self._problem = "controller not answering"
            return
        try:  # a closed connection: once more, before calling the controller gone
            client = self._connect()
        except (AdminError, OSError) as again:
            with self._lock:
                if _timed_out(again):
                    self._problem = "controller not answering"
                else:
                    self._gone = f"lost the connection ({e}), and connecting again failed ({again})"
            return
        with self._lock:
            self._client = client
            self._problem = f"the connection was made again after: {e}"


# ------------------------------------------------------------------------------ terminal

_KEYS = {
    curses.KEY_UP: "up",
    curses.KEY_DOWN: "down",
    curses.KEY_PPAGE: "pgup",
    curses.KEY_NPAGE: "pgdn",
    curses.KEY_HOME: "home",
    curses.KEY_END: "end",
    27: "esc",
}


def _key_name(ch: int) -> str:
    if ch in _KEYS:
        return _KEYS[ch]
    return chr(ch) if 0 <= ch < 0x110000 else ""


def _styles() -> dict[Style, int]:
    """Terminal attributes per style: colours where the terminal has them, else bold."""
    styles: dict[Style, int] = {
        "plain": curses.A_NORMAL,
        "title": curses.A_BOLD,
        "heading": curses.A_BOLD,
        "failed": curses.A_BOLD,
        "warn": curses.A_BOLD,
    }
    if not curses.has_colors():
        return styles
    with contextlib.suppress(curses.error):
        curses.start_color()
        background = -1
        try:
            curses.use_default_colors()
        except curses.error:
            background = curses.COLOR_BLACK
        curses.init_pair(1, curses.COLOR_RED, background)
        curses.init_pair(2, curses.COLOR_YELLOW, background)
        curses.init_pair(3, curses.COLOR_CYAN, background)
        styles["failed"] = curses.color_pair(1) | curses.A_BOLD
        styles["warn"] = curses.color_pair(2) | curses.A_BOLD
        styles["title"] = curses.color_pair(3) | curses.A_BOLD
    return styles


def _draw(scr: Any, lines: list[Line], styles: dict[Style, int]) -> None:
    height, width = scr.getmaxyx()
    scr.erase()
    for y, line in enumerate(lines[:height]):
        text = line.text.ljust(width) if line.selected else line.text
        if y == height - 1:
            text = text[: width - 1]  # (the bottom-right cell cannot be written)
        attr = styles[line.style] | (curses.A_REVERSE if line.selected else 0)
        with contextlib.suppress(curses.error):
            scr.addstr(y, 0, text[:width], attr)
    scr.refresh()


def _screen(scr: Any, poller: Poller, view: View) -> int:
    """The terminal's loop: draw what changed, act on keys; 0 on ``q``, 1 when the
    controller is gone."""
    with contextlib.suppress(curses.error):
        curses.curs_set(0)
    scr.keypad(True)
    scr.timeout(100)  # ms: keys wait no longer than this for news, and news for keys
    styles = _styles()
    drawn: list[Line] | None = None
    shown: tuple[Any, ...] | None = None  # what ``drawn`` was drawn from, but the view
    stacks: Future[list[dict[str, Any]]] | None = None
    while True:
        state = poller.state()
        if state.gone is not None:
            return 1
        view.status = state.status
        if stacks is not None and stacks.done() and view.stacks is not None:
            try:
                view.stacks.entries = stacks.result()
            except (AdminError, OSError) as e:
                view.stacks.error = str(e)
            stacks, shown = None, None
        height, width = scr.getmaxyx()
        now = (state.version, state.status, width, height)
        if now != shown:
            lines = render(state.snapshot, view, width, height)
            if lines != drawn:
                _draw(scr, lines, styles)
                drawn = lines
            shown = now
        ch = scr.getch()
        if ch == -1:
            continue
        shown = None  # a key changes the view
        if ch == curses.KEY_RESIZE:
            curses.update_lines_cols()
            drawn = None
            continue
        action = handle_key(view, _key_name(ch), actor_rows(state.snapshot), max(1, height - 4))
        if action == "quit":
            return 0
        if action == "stacks" and view.stacks is not None:
            stacks = poller.ask_stacks(view.stacks.procs, view.stacks.rank)


# ----------------------------------------------------------------------------------- cli


def _key_of(addr: str) -> bytes | None:
    """The key to connect to ``addr`` again, read now while its file is there."""
    for info in find_controllers():
        if info.get("addr") == addr:
            return bytes.fromhex(str(info["key"]))
    return bytes.fromhex(config.auth_key) if config.auth_key else None


def main(argv: list[str] | None = None) -> int:
    """``danaus top``; returns the exit status (1: no controller, or it went away)."""
    parser = argparse.ArgumentParser(
        prog="danaus top",
        description="A live view of a running danaus controller: its procs and actors.",
    )
    add_attach_options(parser)
    parser.add_argument(
        "--interval", metavar="S", type=float, default=1.0, help="seconds between refreshes"
    )
    ns = parser.parse_args(argv)
    if ns.interval <= 0:
        parser.error("--interval must be positive")
    key = read_key("danaus top", ns.key_file) if ns.key_file else None
    try:
        client = AdminClient(ns.attach, key, timeout=CALL_TIMEOUT)
    except (AdminError, ValueError) as e:  # (ValueError: an address of no known form)
        print(f"danaus top: {e}", file=sys.stderr)
        return 1
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        client.close()
        print("danaus top: needs a terminal", file=sys.stderr)
        return 2
    poller = Poller(client, key if key is not None else _key_of(client.addr), ns.interval)
    poller.start()
    os.environ.setdefault("ESCDELAY", "25")  # esc goes back at once, not after a second
    for name in ("LINES", "COLUMNS"):  # curses would take them over the window's size
        os.environ.pop(name, None)
    try:
        status = curses.wrapper(_screen, poller, View(source=client.addr))
    except KeyboardInterrupt:
        status = 130
    finally:
        poller.close()
    gone = poller.state().gone
    if status == 1 and gone is not None:
        print(f"danaus top: controller gone ({poller.addr}): {gone}", file=sys.stderr)
    return int(status)
