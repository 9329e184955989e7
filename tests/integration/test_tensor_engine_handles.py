"""Handles to things on the workers: OpaqueRef, RemoteProcessGroup, remote functions by
import path (Monarch's OpaqueRef, RemoteProcessGroup and function_resolvers)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from danaus import this_host
from danaus.errors import RemoteException
from danaus.tensor_engine import (
    OpaqueRef,
    RemoteProcessGroup,
    function_resolvers,
    inspect,
    remote,
)


@pytest.fixture(scope="module")
def procs() -> Iterator[Any]:
    with this_host().spawn_procs(per_host={"procs": 2}, name="handles") as p:
        yield p


@remote(propagate=lambda: OpaqueRef(None))
def make_linear() -> OpaqueRef:
    torch.manual_seed(7)
    return OpaqueRef(torch.nn.Linear(3, 2))


@remote(propagate=lambda ref, x: torch.empty(x.shape[0], 2))
def apply(ref: OpaqueRef, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ref.value(x)  # type: ignore[no-any-return]


@remote(propagate=lambda ref: torch.empty(()))
def bump(ref: OpaqueRef) -> torch.Tensor:
    ref.value = ref.value + 1 if isinstance(ref.value, int) else 1
    return torch.tensor(float(ref.value))


@remote(propagate=lambda t, pg: t)
def all_sum(t: torch.Tensor, pg: Any) -> torch.Tensor:
    out = t.clone()
    pg.allreduce([out]).wait()
    return out


def test_an_opaque_ref_is_the_same_object_on_each_worker_across_calls(procs: Any) -> None:
    torch.manual_seed(7)
    local = torch.nn.Linear(3, 2)
    with procs.activate():
        model = make_linear()
        x = torch.ones(4, 3)
        y = apply(model, x)
        counter = make_linear()
        first, second = bump(counter), bump(counter)
    assert isinstance(model, OpaqueRef)
    for r in range(2):
        with torch.no_grad():
            torch.testing.assert_close(inspect(y, procs=r), local(torch.ones(4, 3)))
        assert inspect(first, procs=r).item() == 1.0
        assert inspect(second, procs=r).item() == 2.0


def test_the_controller_cannot_make_or_read_an_opaque_ref(procs: Any) -> None:
    with pytest.raises(RuntimeError, match="lives on the workers"):
        OpaqueRef(torch.nn.Linear(1, 1))
    with procs.activate():
        ref = make_linear()
    with pytest.raises(RuntimeError, match="inside a @remote function"):
        _ = ref.value
    assert "OpaqueRef" in repr(ref)


def test_an_opaque_refs_object_goes_when_the_controller_drops_the_handle(procs: Any) -> None:
    @remote(propagate=lambda: OpaqueRef(None))
    def make() -> OpaqueRef:
        return OpaqueRef(object())

    @remote
    def alive() -> int:
        from danaus.tensor_engine import opaque_ref

        return len(opaque_ref._values)

    with procs.activate():
        before = alive.call().get().item(procs=0)
        ref = make()
        assert alive.call().get().item(procs=0) == before + 1
        del ref
        gc.collect()
        assert alive.call().get().item(procs=0) == before


def test_a_remote_process_group_is_the_groups_torch_process_group(procs: Any) -> None:
    pg = procs.process_group("procs")
    assert isinstance(pg, RemoteProcessGroup) and pg.size() == 2
    with procs.activate():
        t = torch.full((3,), 1.0)
        from danaus.tensor_engine import remote as r

        rank_t = r(lambda x: x + float(__import__("danaus").current_rank().rank))(t)
        total = all_sum(rank_t, pg)
    for r_ in range(2):
        torch.testing.assert_close(inspect(total, procs=r_), torch.full((3,), 3.0))
    with pytest.raises(ValueError, match="not dims of"):
        RemoteProcessGroup(("gpus",), procs)


def test_remote_takes_an_import_path_resolved_on_the_workers(procs: Any) -> None:
    relu = remote("torch.nn.functional.relu", propagate=lambda x: x)
    with procs.activate():
        x = torch.tensor([-1.0, 2.0])
        y = relu(x)
    torch.testing.assert_close(inspect(y, procs=1), torch.tensor([0.0, 2.0]))
    missing = remote("torch.nn.functional.no_such_fn", propagate=lambda x: x)
    with procs.activate():
        z = missing(torch.ones(1))
    with pytest.raises(RemoteException, match="no_such_fn"):
        inspect(z)
    with pytest.raises(ValueError, match="not a function for a remote call"):
        remote(42)


def test_a_resolver_of_ones_own_is_consulted(procs: Any) -> None:
    def doubled(arg: object) -> Any:
        return (lambda x: x * 2) if arg == "double" else None

    function_resolvers.insert(0, doubled)
    try:
        double = remote("double", propagate=lambda x: x)
    finally:
        function_resolvers.remove(doubled)
    with procs.activate():
        y = double(torch.ones(2))
    torch.testing.assert_close(inspect(y), torch.full((2,), 2.0))


def test_world_mesh_is_a_host_by_gpu_device_mesh() -> None:
    from danaus.tensor_engine import world_mesh

    mesh = world_mesh(None, None, 2)
    try:
        assert mesh.sizes == {"host": 1, "gpu": 2}
        with mesh.activate():
            t = torch.ones(2)
            total = t.reduce("gpu", "sum")
        torch.testing.assert_close(inspect(total), torch.full((2,), 2.0))
    finally:
        mesh.stop().get(timeout=30)
    with pytest.raises(ValueError, match="gpu_per_host must be a positive int"):
        world_mesh(None, None, 0)


def test_the_gradient_generator_yields_the_grads_of_dtensors(procs: Any) -> None:
    from danaus.tensor_engine import grad_generator

    with procs.activate():
        torch.manual_seed(3)
        w1 = torch.rand(4, 3, requires_grad=True)
        w2 = torch.rand(3, 1, requires_grad=True)
        x = torch.rand(5, 4)
        loss = ((x @ w1).relu() @ w2).sum()
        expected = torch.autograd.grad([loss], [w2, w1], retain_graph=True)
        got = list(grad_generator(loss, [w2, w1]))
    assert len(got) == 2
    for r in range(2):
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(inspect(g, procs=r), inspect(e, procs=r))


def test_rank_tensors_hold_each_procs_rank_along_dims() -> None:
    with this_host().spawn_procs(per_host={"a": 2, "b": 3}, name="ranks") as p:
        r = p.rank_tensors()
        ab = p.rank_tensor(["a", "b"])
        for a in range(2):
            for b in range(3):
                assert inspect(r["a"], a=a, b=b).item() == a
                assert inspect(r["b"], a=a, b=b).item() == b
                assert inspect(ab, a=a, b=b).item() == a * 3 + b
        with pytest.raises(ValueError, match="not dims of"):
            p.rank_tensor("c")


def test_a_one_proc_meshs_host_mesh_spawns_on_its_host() -> None:
    with this_host().spawn_procs(per_host={"procs": 2}, name="hm") as p:
        host = p.slice(procs=1).host_mesh
        assert host.sizes == {}
        more = host.spawn_procs(per_host={"more": 1}, name="hm_more")
        more.stop().get(timeout=30)
        with pytest.raises(NotImplementedError, match="one proc"):
            _ = p.host_mesh
