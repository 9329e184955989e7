"""The tensor engine against the same computations done locally, shard by shard."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from danaus import this_host
from danaus.errors import RemoteException
from danaus.tensor_engine import fetch_shard, inspect, remote


@pytest.fixture(scope="module")
def procs() -> Iterator[Any]:
    with this_host().spawn_procs(per_host={"procs": 2}, name="te") as p:
        yield p


def shards(t: Any) -> list[torch.Tensor]:
    return [inspect(t, procs=r) for r in range(2)]


def test_elementwise_matmul_views_inplace_and_indexing_match_local(procs: Any) -> None:
    with procs.activate():
        torch.manual_seed(1)
        a = torch.rand(4, 6)
        b = torch.randn(6, 3)
        c = (a * 2 + 1).sigmoid() @ b
        v = a.view(2, 12).T
        d = a.clone()
        d.mul_(3)
        d[1] = 0.5
        e = a[:, 2:5].sum(1)
    for r, (la, lb) in enumerate(zip(shards(a), shards(b), strict=True)):
        torch.testing.assert_close(inspect(c, procs=r), (la * 2 + 1).sigmoid() @ lb)
        torch.testing.assert_close(inspect(v, procs=r), la.view(2, 12).T)
        ld = la * 3
        ld[1] = 0.5
        torch.testing.assert_close(inspect(d, procs=r), ld)
        torch.testing.assert_close(inspect(e, procs=r), la[:, 2:5].sum(1))
    assert c.shape == (4, 3) and v.shape == (12, 2) and e.dtype == torch.float32
    assert not torch.equal(shards(a)[0], shards(a)[1])  # each shard draws its own numbers


def test_shape_errors_raise_on_the_controller_at_the_line(procs: Any) -> None:
    with procs.activate(), pytest.raises(RuntimeError, match="must have same reduction dim"):
        torch.ones(3, 4) @ torch.ones(5, 5)


def test_random_shards_are_reproducible_with_manual_seed(procs: Any) -> None:
    with procs.activate():
        torch.manual_seed(7)
        x = torch.rand(5)
        torch.manual_seed(7)
        y = torch.rand(5)
    assert all(torch.equal(p, q) for p, q in zip(shards(x), shards(y), strict=True))


def test_reduce_over_the_mesh(procs: Any) -> None:
    with procs.activate():
        x = torch.arange(4.0) + torch.rand(4)
        total = x.reduce("procs", "sum")
        mean = x.reduce("procs", "avg")
        hi = x.reduce("procs", "max")
        stacked = x.reduce("procs", "stack")
        part = x.reduce("procs", "sum", scatter=True)
        y = x.clone()
        y.reduce_("procs", "min")
    s0, s1 = shards(x)
    for r in range(2):
        torch.testing.assert_close(inspect(total, procs=r), s0 + s1)
        torch.testing.assert_close(inspect(mean, procs=r), (s0 + s1) / 2)
        torch.testing.assert_close(inspect(hi, procs=r), torch.maximum(s0, s1))
        torch.testing.assert_close(inspect(stacked, procs=r), torch.stack([s0, s1]))
        torch.testing.assert_close(inspect(y, procs=r), torch.minimum(s0, s1))
    torch.testing.assert_close(inspect(part, procs=1), (s0 + s1)[2:])
    assert stacked.shape == (2, 4) and part.shape == (2,)


def _reference_train(
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    w1: torch.Tensor,
    w2: torch.Tensor,
    steps: int,
    lr: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    w1, w2 = w1.clone(), w2.clone()
    for _ in range(steps):
        grads = []
        for x, y in zip(xs, ys, strict=True):
            a, b = w1.clone().requires_grad_(), w2.clone().requires_grad_()
            loss = ((torch.tanh(x @ a) @ b - y) ** 2).mean()
            loss.backward()
            grads.append((a.grad, b.grad))
        with torch.no_grad():
            w1 -= lr * (grads[0][0] + grads[1][0]) / 2
            w2 -= lr * (grads[0][1] + grads[1][1]) / 2
    return w1, w2


def test_data_parallel_training_matches_a_single_process_run(procs: Any) -> None:
    torch.manual_seed(0)
    w1_0, w2_0 = torch.randn(4, 8) * 0.5, torch.randn(8, 1) * 0.5
    with procs.activate():
        x = torch.randn(16, 4)  # each proc its own data shard
        y = torch.randn(16, 1)
        w1 = w1_0.clone().requires_grad_()
        w2 = w2_0.clone().requires_grad_()
        for _ in range(20):
            loss = ((torch.tanh(x @ w1) @ w2 - y) ** 2).mean()
            loss.backward()
            with torch.no_grad():
                g1 = w1.grad.reduce("procs", "avg")
                g2 = w2.grad.reduce("procs", "avg")
                w1 -= 0.1 * g1
                w2 -= 0.1 * g2
            w1.grad = None
            w2.grad = None
    ref1, ref2 = _reference_train(shards(x), shards(y), w1_0, w2_0, 20, 0.1)
    for r in range(2):
        torch.testing.assert_close(inspect(w1, procs=r), ref1, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(inspect(w2, procs=r), ref2, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ref1, w1_0)  # it did train


@remote
def explode(t: torch.Tensor) -> torch.Tensor:
    if t.device.type != "meta":
        raise ValueError("the remote function failed on purpose")
    return t + 1


@remote
def scale(t: torch.Tensor, k: float) -> torch.Tensor:
    return t * k


def test_failures_raise_remote_exception_and_later_work_succeeds(procs: Any) -> None:
    with procs.activate():
        x = torch.ones(3)
        bad = explode(x)
        worse = bad * 2  # depends on the failure: inherits it, does not run
        good = scale(x, 4.0)
    with pytest.raises(RemoteException) as info:
        inspect(worse, procs=1)
    err = info.value
    assert err.exc_type == "ValueError" and "failed on purpose" in err.message
    assert "test_tensor_engine.py" in err.issued_at
    assert "in explode" in err.remote_traceback
    assert "ValueError: the remote function failed on purpose" in err.remote_traceback
    assert torch.equal(inspect(good, procs=0), torch.full((3,), 4.0))


def test_an_op_on_a_freed_tensor_fails_on_fetch_only(procs: Any) -> None:
    with procs.activate() as client:
        x = torch.ones(2)
        y = x + 1
        client.free(x.ref_id)  # freed on the workers while the controller still holds x
        client.flush()
        w = x * 2
        ok = y * 3
    with pytest.raises(RemoteException, match="KeyError"):
        inspect(w, procs=0)
    assert torch.equal(inspect(ok, procs=0), torch.full((2,), 6.0))


def test_dropping_the_last_reference_frees_the_shards(procs: Any) -> None:
    with procs.activate() as client:
        xs = [torch.ones(1000) for _ in range(50)]
    before = client.workers.slice(procs=0).table_stats.call_one().get(timeout=20)["live"]
    del xs
    client.flush()
    after = client.workers.slice(procs=0).table_stats.call_one().get(timeout=20)["live"]
    assert before - after >= 50


def test_fetch_shard_is_a_future(procs: Any) -> None:
    with procs.activate():
        x = torch.full((2,), 3.0)
    assert torch.equal(fetch_shard(x, procs=1).get(timeout=20), torch.full((2,), 3.0))
    with pytest.raises(ValueError, match=r"\['gpus'\] are not dims of this mesh"):
        fetch_shard(x, gpus=0)


def test_a_shard_not_named_is_rank_zeros_as_in_monarch(procs: Any) -> None:
    with procs.activate():
        x = torch.rand(8)  # each shard draws its own numbers
    zero, one = inspect(x, procs=0), inspect(x, procs=1)
    assert not torch.equal(zero, one)
    assert torch.equal(inspect(x), zero)  # no coordinates: rank 0's copy
    assert torch.equal(inspect(x, {"procs": 1}), one)  # Monarch's shard= dict
    assert torch.equal(fetch_shard(x, shard={"procs": 0}, procs=1).get(timeout=20), one)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none on this machine")
def test_training_on_gpu(procs: Any) -> None:
    with procs.activate():
        x = torch.randn(16, 4)
        w = torch.randn(4, 1).requires_grad_()
        (x @ w).sum().backward()
        g = w.grad.reduce("procs", "avg")
    assert inspect(g, procs=0).shape == (4, 1)


def test_to_mesh_moves_every_shard_over_the_data_plane(procs: Any) -> None:
    from danaus.tensor_engine import Stream

    with this_host().spawn_procs(per_host={"procs": 2}, name="te2") as other:
        with procs.activate():
            x = torch.rand(64, 64)
        y = x.to_mesh(other)
        with other.activate():
            z = y * 2
        for r in range(2):
            torch.testing.assert_close(inspect(z, procs=r), inspect(x, procs=r) * 2)
        with pytest.raises(ValueError, match="same shape"):
            x.to_mesh(other.slice(procs=0))
        side = Stream("side")
        with procs.activate():
            with side.activate():
                borrowed, borrow = side.borrow(x)  # Monarch's return: (tensor, Borrow)
                w = borrowed + 1
                borrow.drop()
            v = w * 3
        torch.testing.assert_close(inspect(v, procs=1), (inspect(x, procs=1) + 1) * 3)


def _numpy_sum(t: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(t.numpy().sum(0, keepdims=True))  # cannot run on meta tensors


numpy_sum = remote(_numpy_sum, propagate=lambda t: t.sum(0, keepdim=True))


def test_remote_with_propagate_for_functions_meta_tensors_cannot_run(procs: Any) -> None:
    with procs.activate():
        x = torch.rand(3, 2)
        s = numpy_sum(x)
    assert s.shape == (1, 2)
    torch.testing.assert_close(inspect(s, procs=1), inspect(x, procs=1).sum(0, keepdim=True))


def test_values_shapes_and_tuples_the_review_found_wrong(procs: Any) -> None:
    with procs.activate():
        x = torch.rand(3, 4)
        hi, where = torch.max(x, 0)  # a named tuple
        (one,) = torch.chunk(x, 1)  # a one-element tuple
        ints = torch.full((3,), 1)
        bools = torch.full((3,), True)  # True == 1 as a key: must not share a shape/dtype
        r1 = torch.arange(0, 2.5)
        r2 = torch.arange(0, 4.5)  # floats differ: different lengths
        m = torch.zeros(4, 4)
        flat = m.t().t().view(16)  # contiguous again: view must work
        p = torch.zeros(1, 4)
        p.squeeze_()
        q = torch.zeros(1, 4)
        q.squeeze_()  # the cached in-place op still updates the shape
        w = torch.rand(3, requires_grad=True)
    lx = inspect(x, procs=1)
    torch.testing.assert_close(inspect(hi, procs=1), lx.max(0).values)
    assert torch.equal(inspect(where, procs=1), lx.max(0).indices)
    torch.testing.assert_close(inspect(one, procs=1), lx)
    assert ints.dtype == torch.int64 and bools.dtype == torch.bool
    assert inspect(bools, procs=0).dtype == torch.bool
    assert r1.shape == (3,) and r2.shape == (5,) and inspect(r2, procs=0).shape == (5,)
    assert flat.shape == (16,)
    assert p.shape == (4,) and q.shape == (4,) and inspect(q, procs=0).shape == (4,)
    assert w.requires_grad


def test_fetched_values_are_snapshots(procs: Any) -> None:
    with procs.activate():
        x = torch.zeros(1 << 20)
    f = fetch_shard(x, procs=0)
    with procs.activate():
        x.add_(1)
    got = f.get(timeout=20)
    assert float(got.min()) == float(got.max())  # all old or all new, never torn


@remote
def fail_if_big(t: torch.Tensor) -> torch.Tensor:
    if t.device.type != "meta" and float(t[0]) > 0.5:
        raise ValueError("this shard's value is big")
    return t.clone()


def _seed_where_one_rank_is_big() -> int:
    """A controller seed under which torch.rand(1) is > 0.5 on exactly one of 2 shards
    (the engine's rule: each random op draws a seed s; shard r uses Generator(s + r))."""
    for s in range(100):
        torch.manual_seed(s)
        drawn = int(torch.randint(0, 2**62, (1,)).item())
        vals = [
            float(torch.rand(1, generator=torch.Generator().manual_seed(drawn + r)))
            for r in range(2)
        ]
        if (vals[0] > 0.5) != (vals[1] > 0.5):
            return s
    raise AssertionError("no such seed below 100")


def test_a_collective_with_a_failed_input_on_one_rank_fails_everywhere_without_hanging(
    procs: Any,
) -> None:
    seed = _seed_where_one_rank_is_big()
    with procs.activate():
        torch.manual_seed(seed)
        u = torch.rand(1)
        z = fail_if_big(u)  # fails on one rank only
        total = z.reduce("procs", "sum")
        fine = (u * 0).reduce("procs", "sum")
    for rank in range(2):
        with pytest.raises(RemoteException):
            fetch_shard(total, procs=rank).get(timeout=30)
    assert torch.equal(inspect(fine, procs=0), torch.zeros(1))
