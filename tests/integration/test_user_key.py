"""One user's host agents and controllers on one machine need no key: they share the
user's default key (a 0600 file in the runtime directory). Another user, or a program of
another runtime directory (another default key), is refused."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from danaus.config import config
from danaus.mesh._procs.host_agent import USER_KEY_FILE, user_key

from .agents_kit import host_agents

CONTROLLER = """
import sys
from danaus import Actor, attach_to_hosts, endpoint

class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x

procs = attach_to_hosts(sys.argv[1:]).spawn_procs(per_host={"procs": 2})
echo = procs.spawn("echo", Echo)
print(echo.echo.call(b"\\xff not utf-8").get(timeout=60).values(), flush=True)
procs.stop().get(timeout=60)
"""


def _env(runtime_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DANAUS_AUTH_KEY"}
    env.update(DANAUS_RUNTIME_DIR=str(runtime_dir), PYTHONPATH=os.getcwd())
    return env


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A host agent given no key, in a runtime directory of its own."""
    home = tmp_path / "rt"
    home.mkdir(mode=0o700)
    with host_agents(["tcp://127.0.0.7:0"], [_env(home)], stderr=subprocess.PIPE) as [(addr, _)]:
        yield addr, home


def _control(addr: str, runtime_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CONTROLLER, addr],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(runtime_dir),
    )


def test_same_user_same_machine_needs_no_key(agent: tuple[str, Path]) -> None:
    addr, home = agent
    key = home / USER_KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_uid == os.getuid()
    assert len(bytes.fromhex(key.read_text().strip())) == 32
    out = _control(addr, home)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == r"[b'\xff not utf-8', b'\xff not utf-8']"
    assert key.read_text() == (home / USER_KEY_FILE).read_text()  # made once, kept


def test_another_default_key_is_refused(agent: tuple[str, Path], tmp_path: Path) -> None:
    addr, _ = agent
    other = tmp_path / "someone-else"
    other.mkdir(mode=0o700)
    out = _control(addr, other)
    assert out.returncode != 0
    assert "SupervisionError" in out.stderr, out.stderr[-2000:]
    assert (other / USER_KEY_FILE).exists()  # it made its own, which the agent refuses


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_another_user_cannot_read_the_key(agent: tuple[str, Path]) -> None:
    _, home = agent
    nobody = pwd.getpwnam("nobody")

    def become_nobody() -> None:
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)

    out = subprocess.run(
        ["cat", str(home / USER_KEY_FILE)],
        capture_output=True,
        text=True,
        timeout=30,
        preexec_fn=become_nobody,
    )
    assert out.returncode != 0 and "Permission denied" in out.stderr


def test_a_key_others_may_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "rt"
    home.mkdir(mode=0o700)
    monkeypatch.setattr(config, "runtime_dir", str(home))
    key, path = user_key()
    assert user_key() == (key, path)
    path.chmod(0o644)
    with pytest.raises(PermissionError, match=rf"key file {path} must .* private"):
        user_key()
    path.chmod(0o600)
    home.chmod(0o755)
    with pytest.raises(PermissionError, match=rf"directory {home} must .* private"):
        user_key()
    home.chmod(0o700)
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")  # a planted link is not followed
    with pytest.raises(PermissionError, match="must belong to this user"):
        user_key()


MONARCH_BOOTSTRAP = """
import subprocess, sys, tempfile
from danaus import Actor, endpoint
from danaus.mesh import attach_to_workers

class Hello(Actor):
    @endpoint
    def doit(self):
        return "hello!"

with tempfile.TemporaryDirectory() as d:
    workers = [f"ipc://{d}/{i}" for i in range(2)]
    agents = [
        subprocess.Popen([sys.executable, "-c",
            "from danaus.mesh import run_worker_loop_forever; "
            f"run_worker_loop_forever(address={w!r}, ca='trust_all_connections')"])
        for w in workers
    ]
    try:
        # attached before the workers listen: dialing waits for their sockets
        hosts = attach_to_workers(ca="trust_all_connections", workers=workers)
        hello = hosts.spawn_procs().spawn("hello", Hello)
        print(sorted(hello.doit.call().get(timeout=60).values()), flush=True)
    finally:
        for a in agents:
            a.kill()
            a.wait(timeout=30)
"""


def test_monarchs_simple_bootstrap_on_ipc_addresses_needs_no_key(tmp_path: Path) -> None:
    # Monarch's test_simple_bootstrap, in our words: workers on ipc:// sockets, no key
    home = tmp_path / "rt"
    home.mkdir(mode=0o700)
    out = subprocess.run(
        [sys.executable, "-c", MONARCH_BOOTSTRAP],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(home),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[-1] == "['hello!', 'hello!']"
    assert sorted(lines[:-1]) == [
        f"danaus host agent listening on unix:{d}/{i}"
        for d in [lines[0].rsplit(" unix:", 1)[1].rsplit("/", 1)[0]]
        for i in range(2)
    ]
