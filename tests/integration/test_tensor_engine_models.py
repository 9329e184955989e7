"""nn.Module, autograd and torch.optim on DTensors, against the same training run locally."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

from danaus import this_host
from danaus.errors import RemoteException
from danaus.tensor_engine import (
    DataDependentError,
    DTensor,
    Stream,
    call_on_shard_and_fetch,
    coalescing,
    fetch_shard,
    get_active_mesh,
    get_active_stream,
    inspect,
    no_mesh,
    remote,
    show,
    slice_mesh,
)


@pytest.fixture(scope="module")
def dp() -> Iterator[Any]:
    with this_host().spawn_procs(per_host={"dp": 2}, name="models") as p:
        yield p


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(4, 16), nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 1)
    )


def train_locally(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    steps: int,
) -> list[float]:
    """Data-parallel by hand: the mean of each data shard's gradients, one model."""
    losses = []
    for _ in range(steps):
        total = 0.0
        for x, y in zip(xs, ys, strict=True):
            loss = ((model(x) - y) ** 2).mean() / len(xs)
            loss.backward()
            total += float(loss.detach())
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses


def train_on_mesh(
    procs: Any, make_opt: Callable[[Any], torch.optim.Optimizer], start: dict[str, Any], steps: int
) -> tuple[nn.Module, DTensor, DTensor, list[DTensor]]:
    with procs.activate():
        model = mlp()
        model.load_state_dict(start)
        opt = make_opt(model.parameters())
        x = torch.randn(32, 4)  # each proc its own data shard
        y = torch.randn(32, 1)
        losses = []
        for _ in range(steps):
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            for p in model.parameters():
                p.grad.reduce_("dp", "avg")
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad()
            losses.append(loss.reduce("dp", "avg"))
    return model, x, y, losses


def test_an_mlp_trained_with_adamw_on_two_procs_matches_one_process(dp: Any) -> None:
    torch.manual_seed(0)
    ref = mlp()
    start = {k: v.clone() for k, v in ref.state_dict().items()}
    model, x, y, losses = train_on_mesh(dp, lambda ps: torch.optim.AdamW(ps, lr=0.01), start, 20)
    assert isinstance(model[0].weight, nn.Parameter) and isinstance(model[0].weight, DTensor)
    xs = [inspect(x, dp=r) for r in range(2)]
    ys = [inspect(y, dp=r) for r in range(2)]
    ref_losses = train_locally(ref, torch.optim.AdamW(ref.parameters(), lr=0.01), xs, ys, 20)
    for name, want in ref.state_dict().items():
        for r in range(2):
            got = inspect(model.state_dict()[name], dp=r)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=name)
    got_losses = [float(inspect(v, dp=0)) for v in losses]
    assert got_losses == pytest.approx(ref_losses, abs=1e-5)
    assert got_losses[-1] < got_losses[0]  # it did train
    assert not torch.allclose(inspect(model[0].weight, dp=0), start["0.weight"])


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, fused=True),
    ],
    ids=["sgd-momentum", "adamw-foreach", "adamw-fused"],
)
def test_other_optimizers_and_their_variants_match_one_process(
    dp: Any, make_opt: Callable[[Any], torch.optim.Optimizer]
) -> None:
    torch.manual_seed(1)
    ref = mlp()
    start = {k: v.clone() for k, v in ref.state_dict().items()}
    model, x, y, _ = train_on_mesh(dp, make_opt, start, 3)
    xs = [inspect(x, dp=r) for r in range(2)]
    ys = [inspect(y, dp=r) for r in range(2)]
    train_locally(ref, make_opt(ref.parameters()), xs, ys, 3)
    for name, want in ref.state_dict().items():
        torch.testing.assert_close(inspect(model.state_dict()[name], dp=1), want, msg=name)


def test_printing_shows_mesh_shape_and_dtype_and_values_raise_a_clear_error(dp: Any) -> None:
    with dp.activate():
        w = nn.Linear(3, 2).weight
        loss = (w * 2).sum()
        assert get_active_mesh() is dp
        with no_mesh.activate():
            local = torch.ones(2)  # runs here again
        local.add_(1)  # changing a local tensor changes it here
    assert type(local) is torch.Tensor and torch.equal(local, torch.full((2,), 2.0))
    assert repr(loss) == (
        "DTensor(mesh={'dp': 2}, shape=(), dtype=torch.float32, grad_fn=SumBackward0)"
    )
    assert "shape=(2, 3)" in str(w) and "requires_grad=True" in str(w)
    assert loss.mesh is dp
    for read in (
        loss.item,
        lambda: bool(loss > 0),
        lambda: float(loss),
        loss.tolist,
        lambda: torch.equal(torch.ones(()), loss),
    ):
        with pytest.raises(DataDependentError, match="fetch it first"):
            read()
    with pytest.raises(DataDependentError, match=r"torch\.equal \(torch's aten\.equal"):
        torch.equal(loss, loss)
    assert inspect(loss, dp=0).shape == ()
    with dp.activate():
        with pytest.raises(DataDependentError, match="depends on the values"):
            torch.nonzero(w)
        with pytest.raises(NotImplementedError, match="@remote function with propagate="):
            w.masked_select(w > 0)


def test_module_to_a_dtype_moves_the_shards_too(dp: Any) -> None:
    with dp.activate():
        m = nn.Linear(3, 2)
        w = m.weight
        m.to(torch.float64)
        y = m(torch.ones(4, 3, dtype=torch.float64))
        plain = m.weight.data
    assert m.weight is w and w.dtype == torch.float64 and not plain.requires_grad
    assert inspect(y, dp=1).dtype == torch.float64 and inspect(w, dp=1).dtype == torch.float64
    torch.testing.assert_close(inspect(plain, dp=0), inspect(w, dp=0))


@pytest.fixture(scope="module")
def pp() -> Iterator[Any]:
    with this_host().spawn_procs(per_host={"pp": 2, "dp": 1}, name="pipe") as p:
        yield p


def test_a_two_stage_pipeline_across_pp_slices_gives_the_unpipelined_loss_and_grads(
    pp: Any,
) -> None:
    torch.manual_seed(2)
    first, second = nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Linear(8, 1)
    x_local, y_local = torch.randn(8, 4), torch.randn(8, 1)
    want = ((second(first(x_local)) - y_local) ** 2).mean()
    stages = [pp.slice(pp=i) for i in range(2)]
    with stages[0].activate():
        s0 = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        s0.load_state_dict(first.state_dict())
        h = s0(torch.as_tensor(x_local))
    with stages[1].activate():
        s1 = nn.Linear(8, 1)
        s1.load_state_dict(second.state_dict())
        h1 = h.to_mesh(stages[1]).requires_grad_()  # the activation crosses stages
        loss = ((s1(h1) - y_local) ** 2).mean()
        loss.backward()
        back = loss.to_mesh(stages[0])  # and the other way
    h.backward(h1.grad.to_mesh(stages[0]))  # the gradient crosses back
    torch.testing.assert_close(inspect(loss, dp=0), want.detach())
    torch.testing.assert_close(inspect(back, dp=0), want.detach())
    want.backward()
    torch.testing.assert_close(inspect(s1.weight.grad, dp=0), second.weight.grad)
    torch.testing.assert_close(inspect(s0[0].weight.grad, dp=0), first[0].weight.grad)
    # the whole mesh's shards to one slice of it
    with pp.activate():
        ranks = torch.arange(3.0) + torch.rand(3)
    on_stage1 = ranks.to_mesh(stages[1])
    torch.testing.assert_close(inspect(on_stage1, dp=0), inspect(ranks, pp=1, dp=0))
    # a reduction landing on one slice; one slice's shard copied to every proc
    total = ranks.reduce("pp", "sum", mesh=stages[0])
    everywhere = slice_mesh(ranks, pp=1).to_mesh(pp)
    r0, r1 = inspect(ranks, pp=0, dp=0), inspect(ranks, pp=1, dp=0)
    torch.testing.assert_close(inspect(total), r0 + r1)  # a one-proc mesh: no coordinates
    for i in range(2):
        torch.testing.assert_close(inspect(everywhere, pp=i, dp=0), r1)
    with pytest.raises(ValueError, match="same shape"):
        with this_host().spawn_procs(per_host={"dp": 3}, name="odd") as odd:
            ranks.to_mesh(odd)


@remote
def explode(t: torch.Tensor) -> torch.Tensor:
    if t.device.type != "meta":
        raise ValueError("the backward failed on purpose")
    return t.clone()


class _Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return explode(g)  # type: ignore[no-any-return]


def test_a_failing_op_inside_backward_raises_remote_exception_naming_the_line(dp: Any) -> None:
    with dp.activate():
        w = torch.ones(3, requires_grad=True)
        loss = (_Boom.apply(w * 2) * 3).sum()
        loss.backward()
        after = w.grad * 2  # depends on the failure: inherits it
        fine = w.detach() + 1
    with pytest.raises(RemoteException) as info:
        fetch_shard(after, dp=1).get(timeout=30)
    err = info.value
    assert err.exc_type == "ValueError" and "failed on purpose" in err.message
    assert "test_tensor_engine_models.py" in err.issued_at and "in backward" in err.issued_at
    assert torch.equal(inspect(fine, dp=0), torch.full((3,), 2.0))


def test_a_dtensor_argument_reaches_each_actor_as_its_local_shard(dp: Any) -> None:
    from tests.integration.te_actors import ShardReader

    readers = dp.spawn("readers", ShardReader)
    with dp.activate():
        x = torch.rand(5)
        y = x * 2  # not yet sent when the call below is made: the call sends it first
    got = readers.total.call(y, 10.0).get(timeout=30)
    got_async = readers.total_async.call(y).get(timeout=30)
    for r in range(2):
        want = float(inspect(x, dp=r).sum()) * 2
        assert got.item(dp=r) == pytest.approx(want * 10, rel=1e-5)
        assert got_async.item(dp=r) == pytest.approx(want, rel=1e-5)


@remote
def plus(t: torch.Tensor, k: float) -> torch.Tensor:
    return t + k


def test_monarchs_tensor_engine_names(pp: Any, capsys: Any) -> None:
    one = pp.slice(pp=0)
    side = Stream("side")
    assert get_active_stream().name == "main"
    with one.activate(), coalescing():
        x = torch.ones(2)
        with side.activate():
            assert get_active_stream() is side
            y, borrow = side.borrow(x, mutable=True)
            y.mul_(3)
            borrow.drop()
    assert repr(borrow) == "Borrow(Stream('side'), mutable=True, dropped)"
    assert torch.equal(call_on_shard_and_fetch(plus, y, 1.0).get(timeout=30), torch.full((2,), 4.0))
    assert torch.equal(inspect(plus(y, 2.0)), torch.full((2,), 5.0))
    # Monarch's remote(f).call(): run on every proc, each result fetched
    fetched = plus.call(y, 2.0).get(timeout=30)
    assert [torch.equal(v, torch.full((2,), 5.0)) for v in fetched.values()] == [True]
    show(y)  # a one-proc mesh: no coordinates needed
    assert "tensor([3., 3.])" in capsys.readouterr().out


def test_every_public_name_is_exported_once() -> None:
    import danaus.tensor_engine as te

    assert len(te.__all__) == len(set(te.__all__))
    missing = [n for n in te.__all__ if not hasattr(te, n)]
    assert not missing
    for name in ("get_active_mesh", "no_mesh", "slice_mesh", "get_active_stream", "coalescing"):
        assert name in te.__all__


def test_rref_makes_an_actors_results_a_dtensor(dp: Any) -> None:
    from tests.integration.te_actors import LinearActor

    linear = dp.spawn("linear", LinearActor)
    with dp.activate():
        t = torch.rand(2, 3)
        o = torch.relu(linear.forward.rref(t))  # no wait: usable at once
        assert isinstance(o, DTensor) and tuple(o.shape) == (2, 3)
    w = linear.weights.call().get(timeout=30).item(dp=0)
    for r in range(2):
        want = torch.relu(inspect(t, dp=r) @ w)
        assert torch.allclose(inspect(o, dp=r), want)
    assert linear.count.call().get(timeout=30).values() == [1, 1]  # through each mailbox
    with pytest.raises(ValueError, match=r"needs @endpoint\(propagate=fn\)"):
        linear.no_propagate.rref(t)
