"""PipelineParallelism and get_parameter_udf (Monarch's ``monarch.parallel``) on a real
mesh sliced into two stage meshes, against the same model run locally with torch."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from danaus import this_host
from danaus.errors import RemoteException
from danaus.tensor_engine import DTensor, OpaqueRef, Stream, inspect, remote
from danaus.tensor_engine.pipelining import (
    Action,
    ActionType,
    PipelineParallelism,
    get_parameter_udf,
)

SCHEDULES = ["dora-dfs", "gpipe", "1f1b"]


@pytest.fixture(scope="module")
def meshes() -> Iterator[list[Any]]:
    with this_host().spawn_procs(per_host={"pp": 2}, name="pipelining") as procs:
        yield [procs.slice(pp=0), procs.slice(pp=1)]


def stages() -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        nn.Sequential(nn.Linear(4, 8), nn.Tanh()),
        nn.Sequential(nn.Linear(8, 8), nn.Tanh()),
        nn.Sequential(nn.Linear(8, 6), nn.LayerNorm(6)),
        nn.Linear(6, 2),
    ]


def pipeline(meshes: list[Any], parts: list[nn.Module], **kwargs: Any) -> PipelineParallelism:
    kwargs = {"batch_size": 8, "microbatch_size": 2, **kwargs}
    return PipelineParallelism(meshes, parts, Stream("compute"), Stream("p2p"), **kwargs)


def assert_grads_match(parts: list[nn.Module], ref: nn.Module) -> None:
    got = [p for part in parts for p in part.parameters()]
    want = list(ref.parameters())
    assert len(got) == len(want)
    for p, q in zip(got, want, strict=True):
        assert q.grad is not None and isinstance(p.grad, DTensor)
        torch.testing.assert_close(inspect(p.grad), q.grad)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_run_gives_the_loss_and_gradients_of_the_unpipelined_model(
    meshes: list[Any], schedule: str
) -> None:
    parts = stages()
    ref = nn.Sequential(*copy.deepcopy(parts))
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    pipe = pipeline(meshes, parts, schedule=schedule, loss_fn=nn.MSELoss())
    pipe.initialize()
    assert [pipe.stage_to_rank(i) for i in range(4)] == [0, 1, 0, 1]
    for i, part in enumerate(parts):  # stage i on meshes[i % 2]
        ranks = list(meshes[i % 2].shape.global_ranks())
        assert all(list(p.mesh.shape.global_ranks()) == ranks for p in part.parameters())
    loss = pipe.run(x, y)
    want = nn.functional.mse_loss(ref(x), y)
    want.backward()
    torch.testing.assert_close(inspect(loss), want.detach())
    assert_grads_match(parts, ref)


def test_the_default_loss_a_loss_list_and_accumulation_over_runs(meshes: list[Any]) -> None:
    parts = stages()[:2]
    ref = nn.Sequential(*copy.deepcopy(parts))
    x = torch.randn(8, 4)
    losses: list[Any] = []
    pipe = pipeline(meshes, parts, loss_list=losses)  # loss_fn None: the output's mean
    pipe.initialize()
    first = pipe.run(x)
    assert losses == []  # Monarch's: each microbatch's loss went in, the sum came out
    second = pipe.run(x)
    for _ in range(2):
        ref(x).mean().backward()
    torch.testing.assert_close(inspect(first), ref(x).mean().detach())
    torch.testing.assert_close(inspect(second), inspect(first))
    assert_grads_match(parts, ref)  # .grad accumulates over runs, as loss.backward()'s
    config = SimpleNamespace(
        weight_decay=0.0,
        learning_rate=0.1,
        beta1=0.9,
        beta2=0.99,
        device_type="cpu",
        optimizer="sgd",
    )
    made: list[tuple[Any, ...]] = []
    opts = pipe.configure_optimizers(config, lambda *args: made.append(args) or len(made))
    assert opts == [1, 2] and made[0][:5] == (0.0, 0.1, (0.9, 0.99), "cpu", "sgd")
    assert [list(a[5]) for a in made] == [list(p.parameters()) for p in parts]


def test_get_parameter_udf_and_copy_params_to_new_model(meshes: list[Any]) -> None:
    parts = stages()[:2]
    pipe = pipeline(meshes, parts)
    local_weight = parts[1][0].weight.detach().clone()
    pipe.initialize()
    with meshes[1].activate():
        w = get_parameter_udf(parts[1], "0.weight", (8, 8))
    assert isinstance(w, DTensor) and w.shape == (8, 8) and w.grad_fn is None
    torch.testing.assert_close(inspect(w), local_weight)
    # A module of local tensors: the remote function runs on every worker.
    lin = nn.Linear(2, 3)
    with meshes[0].activate():
        got = get_parameter_udf(lin, "weight", (3, 2))
        missing = get_parameter_udf(lin, "nope", (3, 2))
    torch.testing.assert_close(inspect(got), lin.weight.detach())
    with pytest.raises(RemoteException, match="no parameter 'nope'"):
        inspect(missing)
    fresh = [nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Sequential(nn.Linear(8, 8), nn.Tanh())]
    pipe.copy_params_to_new_model(fresh)
    torch.testing.assert_close(fresh[1][0].weight, local_weight)
    torch.testing.assert_close(fresh[0][0].bias, inspect(parts[0][0].bias))


def test_bad_input_raises_a_clear_error(meshes: list[Any]) -> None:
    with pytest.raises(ValueError, match="3 stages do not divide over 2 meshes"):
        pipeline(meshes, stages()[:3])
    with pytest.raises(ValueError, match="batch_size 7 is not a positive multiple"):
        pipeline(meshes, stages(), batch_size=7, microbatch_size=2)
    with pytest.raises(ValueError, match="'dora-dfs', 'gpipe', '1f1b'"):
        pipeline(meshes, stages(), schedule="zbv")
    with pytest.raises(TypeError, match="stage 1 is a str"):
        pipeline(meshes, [nn.Linear(2, 2), "not a module"])
    pipe = pipeline(meshes, stages()[:2], loss_fn=nn.MSELoss())
    with pytest.raises(RuntimeError, match=r"initialize\(\)"):
        pipe.run(torch.randn(8, 4), torch.randn(8, 8))
    pipe.initialize()
    with pytest.raises(ValueError, match="dim 0 must be the batch_size, 8"):
        pipe.run(torch.randn(6, 4), torch.randn(6, 8))
    with pytest.raises(ValueError, match="without y"):
        pipe.run(torch.randn(8, 4))


@remote(propagate=lambda seed: OpaqueRef(None))
def make_stage(seed: int) -> OpaqueRef:
    torch.manual_seed(seed)
    return OpaqueRef(nn.Sequential(nn.Linear(4, 4), nn.Tanh()))


@remote(propagate=lambda: OpaqueRef(None))
def make_list() -> OpaqueRef:
    return OpaqueRef([])


@remote(propagate=lambda ref, name: torch.empty(4, 4))
def grad_of(ref: OpaqueRef, name: str) -> torch.Tensor:
    return dict(ref.value.named_parameters())[name].grad.clone()  # type: ignore[no-any-return]


def test_opaque_ref_stages_run_on_the_workers_beside_module_stages(meshes: list[Any]) -> None:
    """Stages 1 and 3 live on the workers (OpaqueRef), 0 and 2 on the controller's
    autograd: activations and gradients cross both ways; the loss list is on the workers."""
    local = []
    for seed in range(4):
        torch.manual_seed(seed)
        local.append(nn.Sequential(nn.Linear(4, 4), nn.Tanh()))
    ref = nn.Sequential(*copy.deepcopy(local))
    parts: list[Any] = [local[0], None, local[2], None]
    for i in (1, 3):
        with meshes[i % 2].activate():
            parts[i] = make_stage(i)
    with meshes[1].activate():
        losses = make_list()
    pipe = pipeline(meshes, parts, loss_fn=nn.MSELoss(), loss_list=losses)
    pipe.initialize()
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    loss = pipe.run(x, y)
    want = nn.functional.mse_loss(ref(x), y)
    want.backward()
    torch.testing.assert_close(inspect(loss), want.detach())
    for i in (0, 2):
        torch.testing.assert_close(inspect(parts[i][0].weight.grad), ref[i][0].weight.grad)
    for i in (1, 3):
        with meshes[i % 2].activate():
            g = grad_of(parts[i], "0.weight")
            w = get_parameter_udf(parts[i], "0.weight", (4, 4))
        torch.testing.assert_close(inspect(g), ref[i][0].weight.grad)
        torch.testing.assert_close(inspect(w), ref[i][0].weight.detach())


# ---------------------------------------------------------------- the schedules


def simulate(actions: dict[int, list[Action]], num_stages: int, pp: int) -> list[Action]:
    """Run the ranks' lists, each rank's next action once what it needs has run on any
    rank; the global order, or an assertion error where they deadlock."""

    def needs(a: Action) -> list[tuple[int, str, int]]:
        s, kind, m = a.stage_index, a.computation_type.value, a.microbatch_index
        cross_prev = s > 0 and (s - 1) % pp != s % pp
        cross_next = s < num_stages - 1 and (s + 1) % pp != s % pp
        if kind == "F":
            return ([(s - 1, "F", m)] if s else []) + ([(s, "RECV_F", m)] if cross_prev else [])
        if kind == "B":
            later = [(s + 1, "B", m)] if s < num_stages - 1 else []
            return [(s, "F", m), *later] + ([(s, "RECV_B", m)] if cross_next else [])
        return {
            "W": [(s, "B", m)],
            "SEND_F": [(s, "F", m)],
            "SEND_B": [(s, "B", m)],
            "RECV_F": [(s - 1, "SEND_F", m)],
            "RECV_B": [(s + 1, "SEND_B", m)],
        }[kind]

    queues = {r: list(seq) for r, seq in actions.items()}
    done: set[tuple[int, str, int]] = set()
    order: list[Action] = []
    while any(queues.values()):
        ran = False
        for queue in queues.values():
            if queue and all(n in done for n in needs(queue[0])):
                a = queue.pop(0)
                done.add((a.stage_index, a.computation_type.value, a.microbatch_index))
                order.append(a)
                ran = True
        assert ran, f"deadlock: {queues}"
    return order


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("num_stages", [2, 4])
def test_a_schedule_runs_each_step_once_after_what_it_needs(schedule: str, num_stages: int) -> None:
    actions, stage_to_rank = PipelineParallelism.generate_pipeline_ir_schedule(
        schedule, num_stages, 2, 4, 1
    )
    assert stage_to_rank == {s: s % 2 for s in range(num_stages)}
    for rank, seq in actions.items():
        assert all(stage_to_rank[a.stage_index] == rank for a in seq)
    compute = [a for seq in actions.values() for a in seq if a.computation_type.value in "FBW"]
    want = {(s, k, m) for s in range(num_stages) for k in "FBW" for m in range(4)}
    assert len(compute) == len(want)
    assert {(a.stage_index, a.computation_type.value, a.microbatch_index) for a in compute} == want
    order = simulate(actions, num_stages, 2)  # every dependency ran first, or it deadlocks
    at = {
        (a.stage_index, a.computation_type.value, a.microbatch_index): i
        for i, a in enumerate(order)
    }
    for s in range(num_stages):
        for m in range(4):
            assert at[s, "B", m] < at[s, "W", m]
            if s:
                assert at[s - 1, "F", m] < at[s, "F", m]
            if s < num_stages - 1:
                assert at[s + 1, "B", m] < at[s, "B", m]
    if schedule != "dora-dfs":  # a full backward: each W right after its B
        for seq in actions.values():
            steps = [a for a in seq if a.computation_type in (ActionType.B, ActionType.W)]
            assert all(
                b.computation_type is ActionType.B and w == Action(b[0], ActionType.W, b[2])
                for b, w in zip(steps[::2], steps[1::2], strict=True)
            )


def test_dora_dfs_defers_weight_gradients_into_the_bubbles() -> None:
    actions, _ = PipelineParallelism.generate_pipeline_ir_schedule("dora-dfs", 4, 2, 4, 1)
    rank0 = [str(a) for a in actions[0] if a.computation_type.value in "FBW"]
    # Monarch's depth-first order of forwards and backwards (warm-up of 4, then 1F1B)...
    assert [a for a in rank0 if "W" not in a] == [
        "0F0", "0F1", "2F0", "2F1", "0F2", "2B0", "0F3", "2B1",
        "2F2", "0B0", "2F3", "0B1", "2B2", "2B3", "0B2", "0B3",
    ]  # fmt: skip
    # ...and a W where the next backward waits on rank 1, not right after its B.
    assert rank0.index("2W0") > rank0.index("2B1")
    assert rank0.index("2W0") < rank0.index("2B2")
