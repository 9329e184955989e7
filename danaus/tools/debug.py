"""``danaus debug``: the actors of a running job that are paused in pdb, and a prompt to
drive them.

``danaus debug [--attach ADDR] [--key-file F]`` reaches a controller's admin endpoint
(without ``--attach``, the newest controller of this user on this host) and reads
commands (:mod:`danaus.tools._debug_commands`): ``list`` the paused actors, ``attach`` to
one and type pdb commands into it until ``detach``, ``cast`` one pdb command to several,
``continue`` them all, ``quit``.

A thread polls the controller for the sessions' output (``debug.read``, a long poll with
a cursor), which also tells the controller that this debugger is still there: if it goes
away (its terminal closed, the process killed), the sessions it typed into continue
within seconds. ``quit`` leaves them paused for the next attach.
"""

from __future__ import annotations

import argparse
import os
import queue
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from ..mesh import AdminClient, AdminError
from ..mesh.seam import find_controllers, runtime_dir
from ._attach import add_attach_options, read_key
from ._debug_commands import (
    Attach,
    Cast,
    CommandError,
    Continue,
    Empty,
    Help,
    ListSessions,
    Quit,
    parse_command,
    select,
)

__all__ = ["DebugCli", "debug", "main"]

PROMPT = "danaus_dbg> "
#: How long a cast waits for its actors' next prompts before giving the prompt back (s).
CAST_WAIT = 30.0
#: One long poll of the controller at most (s); the controller lets go of a debugger
#: that has not polled for a few of these.
POLL = 1.0

HELP = """\
danaus debugger commands:
  list                          the paused actors (id, mesh, rank, actor, where)
  attach <mesh> <rank>          type pdb commands into that actor; 'detach' (or Ctrl-D)
                                comes back here
  cast <mesh> ranks(R) <cmd>    send one pdb command to several actors of a mesh. R is a
                                rank (ranks(1)), ranks (ranks(1,4,6)), a range
                                (ranks(start:stop:step)), or coordinates
                                (ranks(hosts=0:2, gpus=(1,3)))
  cast <mesh>[R] <cmd>          the same; 'cast <mesh> <cmd>' reaches all its ranks
  cast * <cmd>                  send one pdb command to every paused actor
  continue                      every paused actor clears its breakpoints and goes on
  help                          this text
  quit                          leave; the actors stay paused for the next attach
"""

#: An entry of the controller's output log: (seq, session id, kind, text).
Entry = tuple[int, int, str, str]
_GONE: Entry = (-1, -1, "gone", "")


class DebugCli:
    """One ``danaus debug`` prompt, driving a controller through two admin connections:
    commands on one, the output poll on the other (a long poll never delays a command)."""

    def __init__(
        self,
        connect: Callable[[], AdminClient],
        out: TextIO = sys.stdout,
        read_line: Callable[[str], str] = input,
    ) -> None:
        self._cmd = connect()
        self._poll = connect()
        self._out = out
        self._input = read_line
        self.client = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._entries: queue.SimpleQueue[Entry] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._gone: str | None = None
        listing = _obj(self._cmd.call("debug.list"))
        self._poller = threading.Thread(
            target=self._run_poll, args=(int(listing["cursor"]),), name="poll", daemon=True
        )
        self._poller.start()

    def __repr__(self) -> str:
        return f"<DebugCli {self._cmd.addr} {'gone' if self._gone else 'attached'}>"

    # ------------------------------------------------------------ the poll thread

    def _run_poll(self, cursor: int) -> None:
        while not self._stop.is_set():
            try:
                r = _obj(
                    self._poll.call("debug.read", cursor=cursor, client=self.client, wait=POLL)
                )
            except (AdminError, OSError) as e:
                if not self._stop.is_set():
                    self._gone = str(e)
                    self._entries.put(_GONE)
                return
            cursor = int(r["cursor"])
            if r.get("dropped"):
                self._entries.put((cursor, -1, "out", "[some output was dropped]\n"))
            for x in r["entries"]:
                self._entries.put((int(x["seq"]), int(x["id"]), str(x["kind"]), str(x["text"])))

    def _next(self, timeout: float) -> Entry | None:
        try:
            return self._entries.get(timeout=timeout)
        except queue.Empty:
            return None

    def _discard(self) -> None:
        while self._next(0) is not None:
            pass

    # ------------------------------------------------------------ the prompt

    def run(self) -> int:
        """Read and run commands until ``quit`` (or end of input); the exit status."""
        self._say("danaus debugger: 'help' for the commands, 'list' for the paused actors.\n")
        try:
            while self._gone is None:
                self._discard()  # (output of sessions nobody is looking at)
                try:
                    line = self._input(PROMPT)
                except EOFError:
                    self._say("\n")
                    break
                except KeyboardInterrupt:
                    self._say("\n")
                    continue
                if not self.do(line):
                    break
        finally:
            self.close()
        if self._gone is not None:
            self._say(f"the controller went away: {self._gone}\n")
            return 1
        return 0

    def do(self, line: str) -> bool:
        """Run one command; False to leave."""
        try:
            cmd = parse_command(line)
        except CommandError as e:
            self._say(f"{e}\n")
            return True
        try:
            match cmd:
                case Empty():
                    pass
                case Quit():
                    return False
                case Help():
                    self._say(HELP)
                case ListSessions():
                    self._say(format_sessions(self._sessions()))
                case Attach(mesh=mesh, rank=rank):
                    self.attach(mesh, rank)
                case Cast():
                    self.cast(cmd)
                case Continue():
                    done = _obj(self._cmd.call("debug.continue"))["continued"]
                    self._say(f"continued {len(done)} paused actor(s)\n")
        except AdminError as e:
            self._say(f"{e}\n")
        return True

    def _sessions(self) -> list[dict[str, Any]]:
        return list(_obj(self._cmd.call("debug.list"))["sessions"])

    # ------------------------------------------------------------ attach

    def attach(self, mesh: str, rank: int) -> None:
        """Type into one session until ``detach``, end of input, or its end."""
        found = [s for s in self._sessions() if s["mesh"] == mesh and s["rank"] == rank]
        if not found:
            self._say(f"no paused actor at {mesh} {rank}: 'list' shows them\n")
            return
        sid = int(found[0]["id"])
        got = _obj(self._cmd.call("debug.attach", id=sid, client=self.client))
        s, cursor = got["session"], int(got["cursor"])
        self._say(
            f"Attached to {s['actor']} (mesh {mesh}, rank {rank}) at {s['where']}; "
            "'detach' comes back\n"
        )
        self._say(got["backlog"])
        waiting = s["state"] == "waiting"
        while True:
            while not waiting:
                e = self._next(POLL)
                if e is None:
                    continue
                if e is _GONE:
                    return
                seq, eid, kind, text = e
                if eid != sid or seq <= cursor:
                    continue
                if kind == "out":
                    self._say(text)
                elif kind == "prompt":
                    waiting = True
                elif kind == "close":
                    self._say(f"\n[{mesh} {rank}: the session ended; the actor goes on]\n")
                    return
            try:
                line = self._input("")
            except (EOFError, KeyboardInterrupt):
                line = "detach"
                self._say("\n")
            if line.strip() == "detach":
                self._say(f"Detached from {mesh} {rank} (it stays paused)\n")
                return
            try:
                self._cmd.call("debug.send", ids=[sid], line=line, client=self.client)
            except AdminError as e:  # it ended meanwhile
                self._say(f"{e}\n")
                return
            waiting = False

    # ------------------------------------------------------------ cast

    def cast(self, cast: Cast) -> None:
        """Send one command to the sessions ``cast`` reaches, and show their output until
        each prompts again or ends (at most ``CAST_WAIT`` s)."""
        sessions = self._sessions()
        ids = select(sessions, cast)
        if not ids:
            self._say("no paused actor matches: 'list' shows them\n")
            return
        names = {int(s["id"]): f"{s['mesh']} {s['rank']}" for s in sessions}
        self._discard()
        sent = _obj(self._cmd.call("debug.send", ids=ids, line=cast.command, client=self.client))
        pending = {int(i) for i in sent["sent"]}
        deadline = time.monotonic() + CAST_WAIT
        partial: dict[int, str] = {}
        while pending and time.monotonic() < deadline:
            e = self._next(min(POLL, max(0.0, deadline - time.monotonic())))
            if e is None:
                continue
            if e is _GONE:
                return
            _, sid, kind, text = e
            if sid not in pending:
                continue
            if kind == "out":
                self._say(_prefixed(names[sid], partial, sid, text))
            elif kind in ("prompt", "close"):
                if kind == "close":
                    self._say(f"[{names[sid]}] (the session ended; the actor goes on)\n")
                pending.discard(sid)
        if pending:
            still = ", ".join(names[i] for i in sorted(pending))
            self._say(f"still running: {still}\n")

    # ------------------------------------------------------------ the end

    def close(self) -> None:
        """Leave: the sessions this debugger held stay paused, held by nobody."""
        self._stop.set()
        if self._gone is None:
            try:
                self._cmd.call("debug.release", client=self.client)
            except (AdminError, OSError):
                pass
        self._cmd.close()
        self._poll.close()
        self._poller.join(POLL + 1.0)

    def _say(self, text: str) -> None:
        if text:
            self._out.write(text)
            self._out.flush()


def _obj(value: object) -> dict[str, Any]:
    """A debug op's answer: always a JSON object."""
    if not isinstance(value, dict):
        raise AdminError(f"the controller answered with {type(value).__name__}, not an object")
    return value


def _prefixed(name: str, partial: dict[int, str], sid: int, text: str) -> str:
    """Whole lines of ``text`` prefixed ``[name] ``; an unfinished last line (pdb's
    prompt) is held back until its end arrives, and a lone prompt is dropped."""
    text = partial.pop(sid, "") + text
    lines = text.split("\n")
    rest = lines.pop()
    if rest and rest != "(Pdb) ":
        partial[sid] = rest
    return "".join(f"[{name}] {line}\n" for line in lines)


def format_sessions(sessions: Sequence[dict[str, Any]]) -> str:
    """The ``list`` table."""
    if not sessions:
        return "no actor is paused\n"
    head = ("ID", "MESH", "RANK", "ACTOR", "WHERE", "FUNCTION", "STATE", "WHY")
    rows = [head] + [
        (
            str(s["id"]),
            s["mesh"] or "-",
            str(s["rank"]),
            s["actor"],
            s["where"],
            s["function"],
            s["state"],
            s["reason"],
        )
        for s in sessions
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] + "\n"
        for r in rows
    )


def main(argv: list[str] | None = None) -> int:
    """``danaus debug``; returns the exit status (1: no controller, or it went away)."""
    parser = argparse.ArgumentParser(
        prog="danaus debug",
        description="List the actors of a running job that are paused in pdb, and drive them.",
    )
    add_attach_options(parser)
    ns = parser.parse_args(argv)
    key = read_key("danaus debug", ns.key_file) if ns.key_file else None
    try:
        addr = ns.attach or _newest()  # (once: both connections reach the same controller)
        cli = DebugCli(lambda: AdminClient(addr, key))
    except (AdminError, ValueError) as e:  # (ValueError: an address of no known form)
        print(f"danaus debug: {e}", file=sys.stderr)
        return 1
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
    return cli.run()


def debug(host: str, port: int) -> None:
    """Monarch's ``monarch.tools.commands.debug(host, port)``: the debugger prompt of
    the controller whose admin endpoint listens at ``tcp://host:port`` (``danaus debug
    --attach tcp://host:port``), on this terminal, until ``quit``. The key is the
    controller's admin file's where one is on this host, else ``$DANAUS_AUTH_KEY``.

    Raises:
        RuntimeError: no controller answers there (the reason, as ``danaus debug`` says).
    """
    code = main(["--attach", f"tcp://{host}:{int(port)}"])
    if code:
        raise RuntimeError(f"debug({host!r}, {port}): the debugger ended with status {code}")


def _newest() -> str:
    found = find_controllers()
    if not found:
        raise AdminError(f"no running danaus controller found (no admin file in {runtime_dir()})")
    return str(found[0]["addr"])
