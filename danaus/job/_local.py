"""``LocalJob``: Monarch's job whose every host mesh is this machine (``this_host()``), so
that a program switches between a cluster and a laptop by changing only its job."""

from __future__ import annotations

from collections.abc import Sequence

from ._job import JobState, JobTrait

__all__ = ["LocalJob"]


class LocalJob(JobTrait):
    """A job of this machine: ``LocalJob(("trainers", "workers")).state().trainers`` is
    ``this_host()``, as is ``.workers``. Applying it starts nothing and ``kill()`` ends
    nothing (the procs spawned on it end with their controller, as usual).

    Args:
        hosts: the names of the host meshes the job's state has.
    """

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        if isinstance(hosts, str):
            raise TypeError(f"LocalJob takes a sequence of mesh names, not the text {hosts!r}")
        for name in hosts:
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"LocalJob's host mesh names are identifiers; got {name!r}")
        self._host_names = tuple(hosts)

    def mesh_sizes(self) -> dict[str, dict[str, int]]:
        return {name: {} for name in self._host_names}  # this_host(): no dims

    def _create(self) -> None:
        pass  # this machine is always there

    def _state(self) -> JobState:
        from ..mesh import this_host

        return JobState({name: this_host() for name in self._host_names})

    def _kill(self) -> None:
        pass

    def can_run(self, spec: JobTrait) -> bool:
        # nothing saved is worth reusing: the spec itself says which meshes it wants
        return False
