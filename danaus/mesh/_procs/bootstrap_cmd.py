"""How a proc is started: Monarch's ``BootstrapCommand`` and ``proc_bind``, for local procs."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping, Sequence

from ...geometry import Point

__all__ = ["BootstrapCommand", "cpu_set", "default_bootstrap_cmd", "resolve_commands"]

#: What a proc runs after its program: danaus's proc entry point.
PROC_ARGS = ("-m", "danaus.actors._proc_main")


@dataclasses.dataclass(frozen=True)
class BootstrapCommand:
    """The command that starts a proc (Monarch's): ``program`` (a Python with danaus
    importable), ``arg0``, ``args`` and extra ``env``.

    danaus starts every proc with ``program -m danaus.actors._proc_main ...``: ``program`` and
    ``env`` may change (another Python, a wrapper script that ``exec``s one, variables
    per proc); ``args`` must stay the default's.
    """

    program: str
    arg0: str | None = None
    args: Sequence[str] = PROC_ARGS
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def with_env(self, env: Mapping[str, str]) -> BootstrapCommand:
        """A copy with ``env`` merged over this command's environment."""
        return dataclasses.replace(self, env={**self.env, **env})


def default_bootstrap_cmd() -> BootstrapCommand:
    """The command danaus starts procs with here: this Python, ``-m danaus.actors._proc_main``."""
    return BootstrapCommand(sys.executable, None, list(PROC_ARGS), {})


def resolve_commands(
    command: BootstrapCommand | Callable[[Point], BootstrapCommand] | None,
    points: Sequence[Point],
) -> list[BootstrapCommand | None]:
    """The command of each proc (None: the default), checked."""
    out: list[BootstrapCommand | None] = []
    for point in points:
        cmd = command(point) if callable(command) else command
        if cmd is not None:
            if not isinstance(cmd, BootstrapCommand):
                raise TypeError(f"bootstrap_command for {point} must be a BootstrapCommand")
            if tuple(cmd.args) != PROC_ARGS:
                raise ValueError(
                    f"bootstrap_command args must be {list(PROC_ARGS)} (danaus's proc entry "
                    f"point; change program or env instead), got {list(cmd.args)}"
                )
        out.append(cmd)
    return out


def _parse_cpus(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"bad CPU list {text!r}: use e.g. '0-3,6'")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def cpu_set(bind: Mapping[str, object]) -> set[int]:
    """The CPUs a ``proc_bind`` entry pins its proc to (``cpus`` or ``physcpubind``).

    NUMA keys (``cpunodebind``, ``membind``) need numactl, which danaus does not use: they
    are refused, rather than silently ignored.
    """
    unknown = set(bind) - {"cpus", "physcpubind"}
    if unknown:
        raise ValueError(
            f"proc_bind keys {sorted(unknown)} are not supported (danaus binds CPUs with "
            "'cpus' or 'physcpubind'; NUMA binding needs numactl)"
        )
    text = str(bind.get("cpus", bind.get("physcpubind", "")))
    cpus = _parse_cpus(text)
    available = os.sched_getaffinity(0)
    if not cpus <= available:
        raise ValueError(f"proc_bind CPUs {sorted(cpus - available)} are not available here")
    return cpus
