"""The memory a proc's cgroup lets it use: of its group and every group above it (the
memory controller of cgroup v1, or v2), the one with the least room left under its
limit, and that room. A proc the kernel's OOM killer would end at its group's limit
must be planned under that limit, not under the host's free RAM."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
#: limits at or above this are "no limit" (v1 writes 2^63 rounded to a page)
UNLIMITED = 1 << 60


@dataclass(frozen=True)
class GroupMemory:
    """The tightest memory limit over a proc.

    Attributes:
        group: the group's path in its hierarchy (``/`` for the hierarchy's root, which
            in a container is the container's own group).
        limit: its limit in bytes.
        free: the limit less what the group's procs use now (file pages the kernel can
            drop, the inactive page cache, not counted as used).
    """

    group: str
    limit: int
    free: int


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _stat(path: Path, key: str) -> int:
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def own_group(cgroup_file: str, controller: str, v2: bool) -> str | None:
    """The group a process is in under ``controller`` (its ``/proc/<pid>/cgroup`` is
    ``cgroup_file``): a path below the hierarchy's root, v1's or v2's; None where the
    file does not say."""
    for line in (_read(Path(cgroup_file)) or "").splitlines():
        _, names, path = line.split(":", 2)
        if (v2 and names == "") or (not v2 and controller in names.split(",")):
            return path
    return None


def _v2_root() -> Path | None:
    for root in (ROOT, ROOT / "unified"):
        controllers = _read(root / "cgroup.controllers")
        if controllers is not None and "memory" in controllers.split():
            return root
    return None


def group_memory(cgroup_file: str = "/proc/self/cgroup") -> GroupMemory | None:
    """The tightest memory limit over the proc whose ``/proc/<pid>/cgroup`` is
    ``cgroup_file`` (this proc's by default): of its group and each group above it,
    the one with the least room left; None where no group over it has a limit (or
    where cgroups cannot be read)."""
    v1 = ROOT / "memory"
    if (v1 / "memory.limit_in_bytes").exists():
        path = own_group(cgroup_file, "memory", v2=False)
        names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        base: Path | None = v1
    else:
        base = _v2_root()
        path = own_group(cgroup_file, "memory", v2=True) if base is not None else None
        names = ("memory.max", "memory.current", "inactive_file")
    if base is None or path is None:
        return None
    limit_name, usage_name, inactive_name = names
    best: GroupMemory | None = None
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        group = base.joinpath(*parts[:depth])
        raw = _read(group / limit_name)
        if raw is None or raw == "max" or int(raw) >= UNLIMITED:
            continue
        usage = int(_read(group / usage_name) or 0)
        used = max(0, usage - _stat(group / "memory.stat", inactive_name))
        here = GroupMemory("/" + "/".join(parts[:depth]), int(raw), max(0, int(raw) - used))
        if best is None or here.free < best.free:
            best = here
    return best
