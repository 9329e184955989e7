"""Tests of danaus.mesh._proc_group: what a proc mesh pickles to (a GroupRef: names,
addresses, shape) and the reference group it is unpickled as, without any runtime."""

from __future__ import annotations

import io
import pickle
import threading
from concurrent.futures import Future as ThreadFuture

import pytest

from danaus import Actor, ClosedError, SerializationError
from danaus.actors._loops import all_runtimes
from danaus.mesh import ProcMesh, Shape
from danaus.mesh._proc_group import GroupRef, GroupState, ProcGroup
from danaus.mesh._procs.handles import RemoteProcHandle
from danaus.mesh._procs.logs import LogOptions

SHAPE = Shape.from_sizes({"x": 2, "y": 2})
ADDRS = tuple(f"unix:@danaus-test-{r}" for r in range(4))


def reference_mesh(failed: dict[int, str] | None = None, stopped: str | None = None) -> ProcMesh:
    ref = GroupRef("grid", SHAPE, ADDRS, failed or {}, stopped)
    return ProcMesh(SHAPE, ProcGroup.from_reference(ref))


class _Recorder(pickle.Unpickler):
    """Unpickles, noting every global the pickle names."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.globals: set[str] = set()

    def find_class(self, module: str, name: str) -> object:
        self.globals.add(f"{module}.{name}")
        return super().find_class(module, name)


def test_a_reference_mesh_pickles_to_its_name_addresses_and_shape() -> None:
    mesh = reference_mesh()
    sub = mesh.slice(x=1)
    u = _Recorder(pickle.dumps(sub))
    back = u.load()
    assert u.globals <= {
        "danaus.mesh._proc_mesh._rebuild",
        "danaus.mesh._proc_group.GroupRef",
        "danaus.geometry._shape.Shape",
    }
    assert isinstance(back, ProcMesh)
    assert repr(back) == "ProcMesh(grid, {'y': 2}, running)"
    assert back.proc_group.addrs() == list(ADDRS)  # the whole mesh's procs travel
    assert back.proc_group.shape == SHAPE
    assert back.proc_group.is_reference
    assert back.proc_group.owner is None  # until an actor spawns on it
    assert back.pids == [-1, -1]  # another process's procs: their pids are not known here
    assert "address" in back.to_table()


def test_unpickling_a_proc_mesh_starts_no_runtime_and_no_thread() -> None:
    data = pickle.dumps(reference_mesh())
    runtimes, threads = list(all_runtimes()), threading.active_count()
    back = pickle.loads(data)
    assert isinstance(back, ProcMesh)
    assert list(all_runtimes()) == runtimes
    assert threading.active_count() == threads


def test_failed_ranks_and_a_stop_travel_with_the_mesh() -> None:
    back = pickle.loads(pickle.dumps(reference_mesh(failed={3: "killed by SIGKILL"})))
    assert back.failed_ranks == {"{'x': 1/2, 'y': 1/2}": "killed by SIGKILL"}
    stopped = pickle.loads(pickle.dumps(reference_mesh(stopped="done with it")))
    assert stopped.proc_group.phase is GroupState.STOPPED
    assert repr(stopped) == "ProcMesh(grid, {'x': 2, 'y': 2}, stopped)"
    with pytest.raises(ClosedError, match="was stopped"):
        stopped.spawn("a", Actor)


def test_claiming_a_reference_group_once() -> None:
    group = reference_mesh().proc_group

    class Owner:
        owned: list[object] = []
        stopped = False

    first, second = Owner(), Owner()
    assert group.claim(first)  # type: ignore[arg-type]
    assert not group.claim(second)  # type: ignore[arg-type]
    assert group.owner is first
    assert group.state.owner is first


async def test_a_mesh_whose_procs_have_not_started_is_refused_on_a_loop() -> None:
    # A host agent's proc learns its address when the agent answers, on this very loop:
    # pickling cannot wait for that here, and says what to do instead.
    pending: ThreadFuture[None] = ThreadFuture()
    group = ProcGroup(
        "remote",
        Shape.from_sizes({"hosts": 1}),
        [RemoteProcHandle(0, "tcp://[::1]:1")],
        pending,
        LogOptions(),
    )
    with pytest.raises(SerializationError, match=r"await procs\.initialized"):
        pickle.dumps(ProcMesh(group.shape, group))
