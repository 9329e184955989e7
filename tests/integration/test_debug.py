"""The distributed debugger: ``breakpoint()`` in an endpoint (sync or async) and, with
``DANAUS_DEBUG_ON_ERROR``, an endpoint that raises, stop in pdb; ``danaus debug``, run in
a real terminal (pexpect), lists them, attaches, steps, casts, continues.

Each test runs a controller program (``debug_program``) in a subprocess with its own
runtime dir, and synchronizes on its output and on the admin endpoint's long poll.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from danaus.actors._debugging.sessions import HOLD
from danaus.mesh import AdminClient

from ..ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ACTORS = Path(__file__).with_name("debug_actors.py")
PROMPT = "danaus_dbg> "
PDB = r"\(Pdb\) "


def _line_of(marker: str) -> int:
    """The line of debug_actors.py holding ``marker`` (where pdb stops)."""
    lines = ACTORS.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


class Job:
    """The controller program, its output, and a connection to its admin endpoint."""

    def __init__(self, runtime_dir: Path, endpoint: str, env: dict[str, str]) -> None:
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DANAUS_RUNTIME_DIR": str(runtime_dir),
            **env,
        }
        self.output = io.StringIO()
        self.ctl = pexpect.spawn(
            sys.executable,
            ["-m", "tests.integration.debug_program", endpoint],
            env=self.env,
            cwd=str(ROOT),
            encoding="utf-8",
            timeout=60,
        )
        self.ctl.logfile_read = self.output
        self.debuggers: list[pexpect.spawn] = []
        self.admin: AdminClient | None = None
        self.ctl.expect("READY")
        info = json.loads((runtime_dir / f"admin-{self.ctl.pid}.json").read_text())
        self.admin = AdminClient(info["addr"], bytes.fromhex(info["key"]))

    def sessions(self) -> list[dict[str, Any]]:
        assert self.admin is not None
        return list(self.admin.call("debug.list")["sessions"])

    def wait_paused(self, n: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Wait (on the admin endpoint's long poll) until ``n`` actors wait at a prompt."""
        assert self.admin is not None
        deadline = time.monotonic() + timeout
        cursor = 0
        while True:
            found = [s for s in self.sessions() if s["state"] == "waiting"]
            if len(found) >= n:
                return found
            assert time.monotonic() < deadline, f"{len(found)} of {n} paused: {found}"
            cursor = self.admin.call("debug.read", cursor=cursor, wait=1.0)["cursor"]

    def debugger(self, *argv: str) -> pexpect.spawn:
        """``danaus debug`` (or ``python argv...``) in a terminal, at its prompt."""
        dbg = pexpect.spawn(
            sys.executable,
            list(argv) or ["-m", "danaus", "debug"],
            env=self.env,
            cwd=str(ROOT),
            encoding="utf-8",
            timeout=30,
        )
        self.debuggers.append(dbg)
        dbg.expect(PROMPT)
        return dbg

    def result(self, timeout: float = 60.0) -> str:
        """The program's last line: ``RESULT [...]`` or ``ERROR ...``."""
        self.ctl.expect(r"((?:RESULT|ERROR) [^\r\n]*)\r?\n", timeout=timeout)
        return str(self.ctl.match.group(1))

    def end(self) -> None:
        """Let the program stop its procs and exit."""
        self.ctl.sendline("")
        self.ctl.expect(pexpect.EOF)

    def close(self) -> None:
        if self.admin is not None:
            self.admin.close()
        for p in [*self.debuggers, self.ctl]:
            if p.isalive():
                p.kill(signal.SIGKILL)
            p.close(force=True)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Any]:
    jobs: list[Job] = []

    def start(endpoint: str, **env: str) -> Job:
        j = Job(tmp_path, endpoint, env)
        jobs.append(j)
        return j

    yield start
    for j in jobs:
        j.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("endpoint", "marker"),
    [("sync_point", "where pdb stops: the line"), ("async_point", "where pdb stops, async")],
)
def test_list_attach_step_and_cast_continue(job: Any, endpoint: str, marker: str) -> None:
    j = job(endpoint)
    line = _line_of(marker)
    j.wait_paused(2)
    assert j.admin is not None  # what danaus top and the dashboard show of them
    snap = j.admin.call("snapshot")
    healths = {a["actor"]: a["health"] for a in snap["actors"] if a["mesh"] == "busy"}
    assert healths == {"procs[0].busy[0]": "paused", "procs[1].busy[1]": "paused"}
    assert sorted(s["rank"] for s in snap["debug"]) == [0, 1]
    dbg = j.debugger()
    dbg.sendline("list")
    dbg.expect(PROMPT)
    table = str(dbg.before)
    for rank in (0, 1):
        assert re.search(
            rf"busy\s+{rank}\s+procs\[{rank}\]\.busy\[{rank}\]\s+\S*debug_actors\.py:{line}\s",
            table,
        ), table
    dbg.sendline("attach busy 0")
    dbg.expect(PDB)
    assert f"debug_actors.py({line}){endpoint}()" in str(dbg.before)
    dbg.sendline("p secret")
    dbg.expect(PDB)
    assert re.search(r"\n40\r?\n", str(dbg.before)), dbg.before  # rank 0: 4 * 10 + 0
    dbg.sendline("n")
    dbg.expect(PDB)
    assert "-> return secret" in str(dbg.before)
    dbg.sendline("p secret")
    dbg.expect(PDB)
    assert re.search(r"\n41\r?\n", str(dbg.before)), dbg.before
    dbg.sendline("detach")
    dbg.expect(PROMPT)
    dbg.sendline("cast busy[0,1] continue")
    dbg.expect(PROMPT)
    assert j.result() == "RESULT [41, 42]"
    assert j.sessions() == []
    dbg.sendline("quit")
    dbg.expect(pexpect.EOF)
    dbg.close()
    assert dbg.exitstatus == 0
    j.end()


@pytest.mark.timeout(180)
def test_cast_by_ranks_and_continue_all(job: Any) -> None:
    j = job("sync_point")
    j.wait_paused(2)
    dbg = j.debugger()
    dbg.sendline("cast busy ranks(1) p secret + 100")
    dbg.expect(PROMPT)
    assert "[busy 1] 141" in str(dbg.before)
    assert "[busy 0]" not in str(dbg.before)
    dbg.sendline("cast * p secret")
    dbg.expect(PROMPT)
    assert "[busy 0] 40" in str(dbg.before) and "[busy 1] 41" in str(dbg.before)
    dbg.sendline("continue")
    dbg.expect(PROMPT)
    assert "continued 2 paused actor(s)" in str(dbg.before)
    assert j.result() == "RESULT [41, 42]"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_actors_go_on_when_their_debugger_disappears(job: Any) -> None:
    j = job("async_point")
    j.wait_paused(2)
    dbg = j.debugger()
    dbg.sendline("cast * p secret")  # it holds both sessions now
    dbg.expect(PROMPT)
    dbg.kill(signal.SIGKILL)  # no goodbye: the controller notices it stopped polling
    assert j.result(timeout=HOLD + 30) == "RESULT [41, 42]"
    assert "stopped answering: they continue" in j.output.getvalue()


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("endpoint", ["sync_point", "async_point"])
def test_a_paused_actor_outlives_the_heartbeat_timeout(job: Any, endpoint: str) -> None:
    timeout = 2.0
    j = job(
        endpoint,
        DANAUS_HEARTBEAT_TIMEOUT=str(timeout),
        DANAUS_HEARTBEAT_INTERVAL="0.25",
        DANAUS_STUCK_WARN_AFTER="0.5",
    )
    j.wait_paused(2)
    # A deliberate pause, not a wait for something: the actors must stay paused past the
    # heartbeat timeout (and the stuck-endpoint threshold), and no event marks "past it".
    threading.Event().wait(3 * timeout)
    assert [s["state"] for s in j.sessions()] == ["waiting", "waiting"]
    dbg = j.debugger()
    dbg.sendline("cast * p secret")
    dbg.expect(PROMPT)
    assert "[busy 0] 40" in str(dbg.before) and "[busy 1] 41" in str(dbg.before)
    dbg.sendline("continue")
    dbg.expect(PROMPT)
    assert j.result() == "RESULT [41, 42]"
    out = j.output.getvalue()
    assert "did not answer" not in out and "SupervisionError" not in out, out
    assert "has been running" not in out, out  # (paused is not stuck)


@pytest.mark.timeout(180)
def test_post_mortem_stops_at_the_raising_frame_before_the_caller_hears(job: Any) -> None:
    j = job("fails", DANAUS_DEBUG_ON_ERROR="1")
    line = _line_of('raise ValueError(f"doomed is {doomed}")')
    paused = j.wait_paused(2)
    assert sorted(s["reason"] for s in paused) == [
        "post-mortem: ValueError: doomed is 400",
        "post-mortem: ValueError: doomed is 401",
    ]
    assert all(s["where"].endswith(f"debug_actors.py:{line}") for s in paused)
    assert "RESULT" not in j.output.getvalue() and "ERROR" not in j.output.getvalue()
    dbg = j.debugger()
    dbg.sendline("attach busy 1")
    dbg.expect(PDB)
    dbg.sendline("p doomed")
    dbg.expect(PDB)
    assert re.search(r"\n401\r?\n", str(dbg.before)), dbg.before
    dbg.sendline("c")
    dbg.expect(PROMPT)
    assert "the session ended" in str(dbg.before)
    dbg.sendline("continue")
    dbg.expect(PROMPT)
    got = j.result()
    assert got.startswith("ERROR ActorError") and "doomed is 40" in got, got


@pytest.mark.timeout(180)
def test_sessions_of_a_nested_mesh_reach_the_controller(job: Any) -> None:
    j = job("nested")  # each actor spawns a mesh of its own, whose actor stops
    paused = j.wait_paused(2)
    assert [(s["mesh"], s["rank"]) for s in paused] == [("inner", 0), ("inner", 0)]
    assert len({s["proc"] for s in paused}) == 2
    dbg = j.debugger()
    dbg.sendline("cast inner[0] p secret")
    dbg.expect(PROMPT)
    assert str(dbg.before).count("[inner 0] 40") == 2
    dbg.sendline("cast * c")
    dbg.expect(PROMPT)
    assert j.result() == "RESULT [41, 41]"
    assert j.sessions() == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("endpoint", ["sync_point", "async_point"])
def test_pythonbreakpoint_0_turns_breakpoints_off(job: Any, endpoint: str) -> None:
    j = job(endpoint, PYTHONBREAKPOINT="0")
    assert j.result() == "RESULT [41, 42]"


@pytest.mark.timeout(180)
def test_monarchs_debug_command_reaches_a_controller_by_host_and_port(job: Any) -> None:
    port = free_port()  # for the admin endpoint
    j = job("sync_point", DANAUS_ADMIN=f"tcp://127.0.0.1:{port}")
    j.wait_paused(2)
    dbg = j.debugger("-c", f"from danaus.tools.debug import debug; debug('127.0.0.1', {port})")
    dbg.sendline("continue")
    dbg.expect(PROMPT)
    assert "continued 2 paused actor(s)" in str(dbg.before)
    assert j.result() == "RESULT [41, 42]"
    dbg.sendline("quit")
    dbg.expect(pexpect.EOF)
    dbg.close()
    assert dbg.exitstatus == 0
    j.end()


def test_monarchs_debug_command_says_when_nothing_answers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from danaus.tools.debug import debug

    port = free_port()  # nobody listens there
    with pytest.raises(RuntimeError, match="ended with status 1"):
        debug("127.0.0.1", port)
    assert "no key for the admin endpoint" in capsys.readouterr().err
    from danaus.config import config

    monkeypatch.setattr(config, "auth_key", "00" * 32)  # as DANAUS_AUTH_KEY sets it
    with pytest.raises(RuntimeError, match="ended with status 1"):
        debug("127.0.0.1", port)
    assert "cannot reach the admin endpoint" in capsys.readouterr().err
