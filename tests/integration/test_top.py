"""``danaus top``, the real terminal program in a real tmux, against a real controller
(``top_controller.py``, a subprocess): what is on the screen, its keys, a killed proc,
and what it says when there is no controller or the key is wrong."""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..faults import danaus_procs
from .test_robustness import _wait_gone

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


def _env(runtime_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DANAUS_AUTH_KEY"}
    env["DANAUS_RUNTIME_DIR"] = str(runtime_dir)
    env["PYTHONPATH"] = str(ROOT)
    return env


class Controller:
    """``top_controller.py --block`` in a subprocess; ``info`` is its READY line."""

    def __init__(self, runtime_dir: Path, log: Path) -> None:
        self.log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.top_controller", "--block"],
                cwd=ROOT,
                env=_env(runtime_dir),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        out = self.proc.stdout
        self._reader = threading.Thread(target=lambda: [lines.put(ln) for ln in out], daemon=True)
        self._reader.start()
        try:
            line = lines.get(timeout=60)
        except queue.Empty:
            self.close()
            raise AssertionError(f"the controller did not start: {log.read_text()}") from None
        assert line.startswith("READY "), line + log.read_text()
        self.info: dict[str, Any] = json.loads(line[len("READY ") :])

    def close(self) -> None:
        """Ask it to exit (unless it is dead already); no proc of it may be left."""
        pid = self.proc.pid
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # it releases its blocked endpoint and stops its procs
            self.proc.wait(60)
        except (subprocess.TimeoutExpired, OSError):
            self.proc.kill()
            self.proc.wait(10)
        finally:
            self._reader.join(10)  # (it reads to the end of the closed pipe)
            assert self.proc.stdout is not None
            self.proc.stdout.close()
            # its procs die with it (PDEATHSIG): wait a bounded while for them to go
            left = _wait_gone(danaus_procs(pid, servers=True), 30)
            for p in left:
                os.kill(p, signal.SIGKILL)
        assert self.proc.returncode in (0, -signal.SIGKILL), self.log.read_text()
        assert not left, f"the controller left procs running: {left}"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Controller, Path]]:
    base = tmp_path_factory.mktemp("top")
    runtime_dir = base / "runtime"
    runtime_dir.mkdir(mode=0o700)
    controller = Controller(runtime_dir, base / "controller.log")
    try:
        yield controller, runtime_dir
    finally:
        controller.close()


class Terminal:
    """A command running in a 160x50 tmux pane of a private tmux server."""

    def __init__(self, command: list[str], env: dict[str, str], workdir: Path) -> None:
        self.socket = f"danaus-top-test-{uuid.uuid4().hex[:8]}"
        self.status = workdir / "status"
        self.errors = workdir / "stderr"
        exports = " ".join(
            f"{k}={shlex.quote(env[k])}" for k in ("DANAUS_RUNTIME_DIR", "PYTHONPATH")
        )
        script = (
            f"cd {shlex.quote(str(ROOT))} && env -u DANAUS_AUTH_KEY {exports} "
            f"{shlex.join(command)} 2>{shlex.quote(str(self.errors))}; "
            f"echo $? > {shlex.quote(str(self.status))}"
        )
        self._tmux("new-session", "-d", "-x", "160", "-y", "50", "-s", "top", script)

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout

    def screen(self) -> str:
        try:
            return self._tmux("capture-pane", "-p", "-t", "top")
        except subprocess.CalledProcessError:  # the pane has gone: the program ended
            return ""

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "top", *keys)

    def wait_for(self, check: Callable[[str], bool], what: str, timeout: float = 30) -> str:
        """The screen, once ``check`` holds for it (polled, up to ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if check(screen):
                return screen
            if time.monotonic() > deadline:
                errors = self.errors.read_text() if self.errors.exists() else ""
                raise AssertionError(f"{what}: not on screen in {timeout} s:\n{screen}\n{errors}")
            time.sleep(0.1)  # (a bounded poll of the screen)

    def exit_status(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while not (self.status.exists() and self.status.read_text().strip()):
            assert time.monotonic() < deadline, f"still running:\n{self.screen()}"
            time.sleep(0.1)  # (a bounded poll)
        return int(self.status.read_text())

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def _row(screen: str, text: str) -> str:
    return next((ln for ln in screen.splitlines() if text in ln), "")


def _above(screen: str, first: str, second: str) -> bool:
    """Both are on the screen, ``first`` on a line above ``second``'s."""
    lines = screen.splitlines()
    at = [next((i for i, ln in enumerate(lines) if t in ln), None) for t in (first, second)]
    return at[0] is not None and at[1] is not None and at[0] < at[1]


@pytest.mark.timeout(180)
def test_top_shows_the_job_sorts_shows_a_stack_and_a_killed_proc(
    job: tuple[Controller, Path], tmp_path: Path
) -> None:
    controller, runtime_dir = job
    addr = controller.info["addr"]
    pids = [str(p) for p in controller.info["pids"]]
    zero, one = controller.info["actors"]  # procs[0].busy[0] (blocked), procs[1].busy[1]
    term = Terminal(
        [sys.executable, "-m", "danaus", "top", "--attach", addr, "--interval", "0.5"],
        _env(runtime_dir),
        tmp_path,
    )
    try:
        screen = term.wait_for(
            lambda s: all(t in s for t in [zero, one, *pids]), "the actors and the procs' pids"
        )
        assert f"controller pid {controller.proc.pid}" in screen
        assert all(" ok " in _row(screen, f" {pid} ") for pid in pids)
        assert _above(screen, zero, one)  # by name
        term.keys("h")  # rank 1 handled more
        term.wait_for(
            lambda s: "sort: handled descending" in s and _above(s, one, zero), "by handled"
        )
        term.keys("m")  # rank 0 has 3 messages waiting behind its blocked one
        screen = term.wait_for(
            lambda s: "sort: mailbox descending" in s and _above(s, zero, one), "by mailbox"
        )
        assert _row(screen, zero).startswith(">"), "the top row is selected"
        assert "block" in _row(screen, zero)
        term.keys("s")
        screen = term.wait_for(lambda s: "_gate.wait(60)" in s, "the blocked endpoint's stack")
        assert f"stacks of procs[0], for {zero}" in screen
        titles = [ln for ln in screen.splitlines() if ln.startswith(("thread ", "task "))]
        assert f"{zero} block running" in titles[0], "the actor's own thread comes first"
        term.keys("Escape")
        term.wait_for(lambda s: "ACTOR" in s and zero in s, "back to the table")

        os.kill(int(pids[1]), signal.SIGKILL)
        screen = term.wait_for(
            lambda s: "failed" in _row(s, f" {pids[1]} ") and "failed" in _row(s, one),
            "the killed proc and its actor failed",
        )
        assert "killed by SIG" in _row(screen, f" {pids[1]} ")
        assert " ok " in _row(screen, f" {pids[0]} ")
        term.keys("q")
        assert term.exit_status() == 0
    finally:
        term.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_frozen_controller_is_not_answering_and_a_dead_one_is_gone(tmp_path: Path) -> None:
    runtime_dir = tmp_path / "runtime"
    runtime_dir.mkdir(mode=0o700)
    controller = Controller(runtime_dir, tmp_path / "controller.log")
    term = None
    try:
        term = Terminal(
            [sys.executable, "-m", "danaus", "top", "--interval", "0.2"],  # the newest one
            _env(runtime_dir),
            tmp_path,
        )
        term.wait_for(lambda s: controller.info["actors"][1] in s, "the actors")
        os.kill(controller.proc.pid, signal.SIGSTOP)
        try:
            term.wait_for(lambda s: "controller not answering for" in s, "not answering")
        finally:
            os.kill(controller.proc.pid, signal.SIGCONT)
        term.wait_for(lambda s: "keys: " in s, "answering again")
        controller.proc.kill()
        assert term.exit_status() == 1
        said = term.errors.read_text()
        assert f"controller gone ({controller.info['addr']})" in said
        assert "Connection refused" in said
    finally:
        if term is not None:
            term.close()
        controller.close()


def _top(*args: str, runtime_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "danaus", "top", *args],
        cwd=ROOT,
        env=_env(runtime_dir),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_a_wrong_key_is_refused_with_a_clear_message(
    job: tuple[Controller, Path], tmp_path: Path
) -> None:
    controller, runtime_dir = job
    key_file = tmp_path / "key"
    key_file.write_text("ab" * 32)
    done = _top(
        "--attach", controller.info["addr"], "--key-file", str(key_file), runtime_dir=runtime_dir
    )
    assert done.returncode == 1
    assert "refused this key (not the job's key)" in done.stderr
    key_file.write_text("not hex")
    done = _top("--key-file", str(key_file), runtime_dir=runtime_dir)
    assert done.returncode != 0 and "does not hold a hex key" in done.stderr


def test_no_controller_is_said_and_exits_nonzero(tmp_path: Path) -> None:
    done = _top(runtime_dir=tmp_path)
    assert done.returncode == 1
    assert f"no running danaus controller found (no admin file in {tmp_path})" in done.stderr
    done = _top("--attach", "unix:@danaus-admin-nobody-here", runtime_dir=tmp_path)
    assert done.returncode == 1
    assert "no key for the admin endpoint" in done.stderr
    key_file = tmp_path / "key"
    key_file.write_text("ab" * 32)
    done = _top(
        "--attach",
        "unix:@danaus-admin-nobody-here",
        "--key-file",
        str(key_file),
        runtime_dir=tmp_path,
    )
    assert done.returncode == 1
    assert "cannot reach the admin endpoint unix:@danaus-admin-nobody-here" in done.stderr


def test_admin_files_of_dead_controllers_are_removed_zombies_included(tmp_path: Path) -> None:
    """A SIGKILLed controller that its parent has not reaped yet (a zombie) is gone:
    ``danaus top`` says no controller runs, and its admin file goes."""
    runtime_dir = tmp_path / "runtime"
    runtime_dir.mkdir(mode=0o700)
    controller = Controller(runtime_dir, tmp_path / "controller.log")
    try:
        pid = controller.proc.pid
        files = list(runtime_dir.glob("admin-*.json"))
        assert [f.name for f in files] == [f"admin-{pid}.json"]
        os.kill(pid, signal.SIGKILL)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # dead, and left unreaped
        with open(f"/proc/{pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "Z"
        done = _top(runtime_dir=runtime_dir)
        assert done.returncode == 1
        assert "no running danaus controller found" in done.stderr
        assert list(runtime_dir.glob("admin-*.json")) == []
    finally:
        controller.close()


def test_a_file_whose_pid_another_process_took_is_not_a_controller(tmp_path: Path) -> None:
    """An admin file written before the process with its pid started (the pid was reused)
    names no controller."""
    from danaus.config import config
    from danaus.mesh._admin.wire import find_controllers

    runtime_dir = tmp_path / "runtime"
    runtime_dir.mkdir(mode=0o700)
    stale = runtime_dir / f"admin-{os.getpid()}.json"
    stale.write_text(
        json.dumps(
            {"addr": "unix:@x", "key": "ab", "pid": os.getpid(), "host": "h", "argv": [],
             "started": time.time() - 10 * 24 * 3600}
        )
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as m:
        m.setattr(config, "runtime_dir", str(runtime_dir))
        assert find_controllers() == []
    assert not stale.exists()
