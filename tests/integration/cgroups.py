"""Real cgroup limits for tests: procs put under a CPU quota (the cpu controller) or a
memory limit (the memory controller), cgroup v1 or v2, and taken out again after.

Needs root and the controller mounted; :func:`skip_unless` says why a test skips where
either is missing. Every group made here is removed on exit, its procs moved back to
the group they came from (a proc that has died meanwhile is simply gone from it)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path("/sys/fs/cgroup")
V2 = ROOT / "unified" if (ROOT / "unified" / "cgroup.controllers").exists() else ROOT


def _v1(controller: str) -> Path | None:
    path = ROOT / controller
    marker = "cpu.cfs_quota_us" if controller == "cpu" else "memory.limit_in_bytes"
    return path if (path / marker).exists() else None


def _v2(controller: str) -> Path | None:
    try:
        controllers = (V2 / "cgroup.controllers").read_text().split()
    except OSError:
        return None
    return V2 if controller in controllers else None


def why_not(controller: str) -> str | None:
    """Why procs cannot be put under ``controller`` ("cpu", "memory") here, or None."""
    if os.geteuid() != 0:
        return "cgroup limits need root"
    if _v1(controller) is None and _v2(controller) is None:
        return f"no cgroup {controller} controller is mounted (v1 or v2)"
    return None


def skip_unless(controller: str) -> None:
    """Skip the test, saying why, where a group under ``controller`` cannot be made here
    (not root, no such controller, or a hierarchy this process may not write: a
    container's read-only cgroup mount)."""
    why = why_not(controller)
    if why is None:
        try:
            with _group(controller, [], {}):
                pass
        except OSError as e:
            why = f"cannot make a cgroup under the {controller} controller here: {e}"
    if why is not None:
        pytest.skip(why)


def _own_group(pid: int, controller: str, v2: bool) -> str:
    """The group ``pid`` is in for ``controller`` (a path below the hierarchy's root)."""
    from danaus.parallel._cgroup import own_group

    return own_group(f"/proc/{pid}/cgroup", controller, v2) or "/"


@contextlib.contextmanager
def _group(controller: str, pids: list[int], settings: dict[str, str]) -> Iterator[Path]:
    v1 = _v1(controller)
    hierarchy = v1 if v1 is not None else _v2(controller)
    assert hierarchy is not None, why_not(controller)
    v2 = v1 is None
    if v2:  # a v2 group's controllers are those its parent hands down
        (hierarchy / "cgroup.subtree_control").write_text(f"+{controller}")
    home = {pid: _own_group(pid, controller, v2) for pid in pids}
    group = hierarchy / f"danaus-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        for name, value in settings.items():
            (group / name).write_text(value)
        for pid in pids:
            (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        for pid, path in home.items():
            with contextlib.suppress(OSError):  # gone: it died (or was killed) meanwhile
                (hierarchy / path.lstrip("/") / "cgroup.procs").write_text(str(pid))
        group.rmdir()


@contextlib.contextmanager
def cpu_quota(pids: list[int], fraction: float, period_us: int = 100_000) -> Iterator[Path]:
    """``pids`` (each with all its threads) share ``fraction`` of one CPU, in one group."""
    quota = max(1000, int(fraction * period_us))
    if _v1("cpu") is not None:
        settings = {"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota)}
    else:
        settings = {"cpu.max": f"{quota} {period_us}"}
    with _group("cpu", pids, settings) as group:
        yield group


@contextlib.contextmanager
def each_cpu_quota(pids: list[int], fraction: float) -> Iterator[list[Path]]:
    """Each of ``pids`` under its own quota of ``fraction`` of one CPU."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(cpu_quota([pid], fraction)) for pid in pids]


@contextlib.contextmanager
def memory_limit(pids: list[int], limit: int) -> Iterator[Path]:
    """``pids`` share ``limit`` bytes of memory, in one group (swap not counted)."""
    key = "memory.limit_in_bytes" if _v1("memory") is not None else "memory.max"
    with _group("memory", pids, {key: str(limit)}) as group:
        yield group


@contextlib.contextmanager
def each_memory_limit(pids: list[int], limit: int) -> Iterator[list[Path]]:
    """Each of ``pids`` alone under its own limit of ``limit`` bytes."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(memory_limit([pid], limit)) for pid in pids]


def _memory_file(group: Path, v1: str, v2: str) -> Path:
    """``group``'s memory-controller file ``v1`` (cgroup v1) or ``v2``, whichever it has."""
    path = group / v1
    return path if path.exists() else group / v2


def oom_kills(group: Path) -> int:
    """How many of ``group``'s procs the OOM killer has killed."""
    path = _memory_file(group, "memory.oom_control", "memory.events")
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


def peak_usage(group: Path) -> int:
    """The most bytes ``group``'s procs have been charged at once."""
    return int(_memory_file(group, "memory.max_usage_in_bytes", "memory.peak").read_text())


def usage(group: Path) -> int:
    """The bytes ``group``'s procs are charged now."""
    return int(_memory_file(group, "memory.usage_in_bytes", "memory.current").read_text())


def set_limit(group: Path, limit: int) -> None:
    """Change ``group``'s memory limit."""
    _memory_file(group, "memory.limit_in_bytes", "memory.max").write_text(str(limit))
