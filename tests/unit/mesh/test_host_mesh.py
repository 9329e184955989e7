"""Tests of danaus.mesh._host_mesh that need no procs: what a host mesh pickles to."""

from __future__ import annotations

import os
import pickle
import re
import threading
from typing import cast

import pytest

from danaus.mesh import HostMesh, Shape
from danaus.mesh._proc_group import ProcGroup


def test_a_host_mesh_pickles_without_the_proc_meshes_spawned_on_it() -> None:
    # What it spawned is its own to shut down: a lock stands for a proc group here,
    # which could not be pickled if it travelled.
    spawned = [cast(ProcGroup, threading.Lock())]
    hosts = HostMesh(Shape.from_sizes({"hosts": 2}), "hosts", spawned=spawned)
    back = pickle.loads(pickle.dumps(hosts))
    assert isinstance(back, HostMesh)
    assert repr(back) == "HostMesh(hosts, {'hosts': 2})"
    assert back.sizes == {"hosts": 2}
    sub = pickle.loads(pickle.dumps(hosts.slice(hosts=1)))
    assert sub.sizes == {}


def test_an_unpickled_local_host_refuses_to_start_procs_on_another_host() -> None:
    # What this_host() of a controller is, unpickled on a machine of another name.
    elsewhere = HostMesh(Shape.from_sizes({}), origin=f"not-{os.uname().nodename}")
    back = pickle.loads(pickle.dumps(elsewhere))
    with pytest.raises(RuntimeError, match="has no host agent: its procs can be started only"):
        back.spawn_procs(per_host={"procs": 1})


def test_a_default_name_is_reserved_until_its_spawn_is_over_and_then_taken_or_free() -> None:
    from danaus.mesh._live_meshes import LiveMeshes

    names = LiveMeshes()
    first, second = names.default_name(), names.default_name()
    assert (first, second) == ("procs", "procs2")  # two spawns at once: two names
    names.release(first)  # (its spawn failed)
    assert names.default_name() == "procs"
    group = cast(ProcGroup, type("Group", (), {"stopped": False})())
    names.named("procs", group)
    names.release("procs")  # (its spawn is over: the mesh now holds the name)
    names.release("procs2")
    assert names.default_name() == "procs2"  # "procs" runs; "procs2" was freed


@pytest.mark.parametrize(
    ("per_host", "error", "says"),
    [
        ("x", TypeError, "per_host takes a mapping of dim names to procs per host, like "
         "{\"gpus\": 4}; got a str: 'x'"),
        (3, TypeError, "per_host takes a mapping of dim names to procs per host, like "
         "{\"gpus\": 4}; got an int: 3"),
        ({"gpus": 0}, ValueError, "per_host['gpus'] must be a positive int, got 0"),
        ({"gpus": True}, ValueError, "per_host['gpus'] must be a positive int, got True"),
        ({"gpus": "2"}, ValueError, "per_host['gpus'] must be a positive int, got '2'"),
        ({3: 1}, TypeError, "per_host's dim names are non-empty strs; got 3"),
        ({"hosts": 2}, ValueError, "dim 'hosts' is already a dim of the host mesh"),
    ],
)  # fmt: skip
def test_a_bad_per_host_is_named_before_anything_starts(
    per_host: object, error: type[Exception], says: str
) -> None:
    hosts = HostMesh(Shape.from_sizes({"hosts": 2}), "hosts")
    with pytest.raises(error, match=f"^{re.escape(says)}$"):
        hosts.spawn_procs(per_host=per_host)  # type: ignore[arg-type]
    assert hosts.spawned_groups() == []


@pytest.mark.parametrize(
    ("room", "per_host"),
    [
        ([2, 1], 1),  # two hosts of two, one proc lost: one on each, not two on one
        ([2, 2, 0], 2),  # a host gone: as many as before on each host left
        ([4, 1, 1], 4),  # one host of four beats three of one
        ([3, 2, 2], 2),  # six on three hosts beats three on one
        ([0, 0], 0),  # nothing left
        ([], 0),
    ],
)
def test_new_procs_are_spread_as_many_on_each_host_the_most_in_all(
    room: list[int], per_host: int
) -> None:
    from danaus.mesh._proc_mesh import even_spread

    assert even_spread(room) == per_host
