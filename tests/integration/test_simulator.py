"""The tensor engine's simulator: a mesh that records and times instead of computing
(Monarch's ``Simulator``), its summary, its Chrome trace, and its costs."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from danaus.tensor_engine import Simulator, Stream, fetch_shard, grad_generator  # noqa: E402
from danaus.tensor_engine._simulator import SimulationWarning  # noqa: E402


def _ddp_steps(mesh: Any, steps: int = 2) -> Any:
    """A DDP loop (gradients averaged over dp) on ``mesh``; the last loss."""
    with mesh.activate():
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(64, 16), torch.randn(64, 1)
        for _ in range(steps):
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            for p in model.parameters():
                p.grad.reduce_("dp", "avg")
            opt.step()
            opt.zero_grad()
    return loss


def test_a_ddp_loop_is_simulated_per_worker_with_a_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    sim = Simulator(
        hosts=1, gpus=4, trace_mode="stream_and_memory", trace_path=trace, cost_cache=tmp_path
    )
    mesh = sim.mesh.rename(gpu="dp")
    assert mesh.sizes == {"host": 1, "dp": 4}
    loss = _ddp_steps(mesh)
    assert tuple(loss.shape) == () and loss.dtype == torch.float32  # shapes, no values
    [m] = sim.summary()["meshes"]
    assert m["workers"] == 4 and m["collectives"] == 2 * 4  # 4 parameters, 2 steps
    main = m["streams"]["main"]
    assert 0 < main["busy_s"] <= main["end_s"] == m["end_s"]
    # the weights, their gradients and the activations of 64 rows are held at the peak
    weights = (16 * 32 + 32 + 32 + 1) * 4
    assert 2 * weights < m["peak_bytes"] < 100 * weights
    sim.display()
    events = json.loads(trace.read_text())["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert procs[2] == "worker 2 (host=0, dp=2)" and len(procs) == 4
    ops = [e for e in events if e["ph"] == "X"]
    assert len(ops) == 4 * (m["operations"] + m["collectives"])
    assert {e["cat"] for e in ops} == {"compute", "collective"}
    flows = [e for e in events if e["ph"] in "sf" and e.get("cat") == "collective"]
    # each collective linked across the workers: an arrow from worker 0 to each other
    assert len(flows) == 2 * 3 * m["collectives"]
    assert {e["id"] for e in flows if e["ph"] == "s"} == {e["id"] for e in flows if e["ph"] == "f"}
    memory = [e for e in events if e["ph"] == "C"]
    assert max(e["args"]["bytes"] for e in memory) == m["peak_bytes"]
    # costs measured here were kept for the next simulator
    assert list(tmp_path.glob("simulator-costs-*.json"))


def test_fetching_a_simulated_tensor_warns_and_gives_zeros_of_its_shape(tmp_path: Path) -> None:
    sim = Simulator(hosts=2, gpus=2, trace_path=None, cost_cache=None)
    with sim.mesh.activate():
        t = torch.ones(3, 5, dtype=torch.float64) * 2
    with pytest.warns(SimulationWarning, match="not computed"):
        got = fetch_shard(t, host=1).get()
    assert got.shape == (3, 5) and got.dtype == torch.float64 and not got.any()
    with pytest.raises(ValueError, match=r"\['rack'\] are not dims"):
        fetch_shard(t, rack=0)


def test_given_costs_time_the_operations_and_links_the_collectives() -> None:
    # every matmul 1 ms, a copy 50 us, a collective's own work 10 us, links of 1 GB/s and
    # 0 latency: the figures follow from them
    costs = {"aten::mm.default": 1e-3, "aten::clone.default": 5e-5, "danaus::collective": 1e-5}
    sim = Simulator(
        hosts=1, gpus=2, trace_path=None, cost_cache=None, link_bandwidth=1e9, link_latency=0.0,
        costs=costs,
    )  # fmt: skip
    with sim.mesh.activate():
        a, b = torch.randn(256, 256), torch.randn(256, 256)
        c = a @ b
        c.reduce("gpu", "sum")
    tl = sim.clients[0].timeline
    [mm] = [e for e in tl.events if e.name == "mm"]
    assert mm.end - mm.start == pytest.approx(1e-3)
    [red] = [e for e in tl.events if e.collective is not None]
    # a ring all-reduce of 256 KiB over 2 moves 2 (n - 1) / n of it: 256 KiB at 1 GB/s;
    # the worker first copies the tensor to reduce into, and the engine's collective is
    # two (a flag saying whether any rank's input failed, then the tensor)
    assert red.end - red.start == pytest.approx(256 * 256 * 4 / 1e9 + 5e-5 + 2e-5, rel=1e-6)
    assert red.start >= mm.end  # it waited for its input


def _give_back(param: Any, grad: Any, borrow: Any) -> None:
    borrow.drop()  # the main stream waits for the reduction from here
    param += 0.01 * grad


def _overlap(late_drop: bool, tmp_path: Path) -> float:
    """The end of a DDP step whose reductions run on a comms stream, the borrow of each
    gradient dropped before (or after) the next one's backward."""
    sim = Simulator(
        hosts=1, gpus=4, trace_path=None, cost_cache=tmp_path, link_bandwidth=2e8,
        link_latency=1e-4,
    )  # fmt: skip
    comms = Stream("comms")
    with sim.mesh.activate():
        model = nn.Sequential(*(nn.Linear(64, 64) for _ in range(6)))
        loss = model(torch.randn(32, 64)).sum()
        params = list(reversed(list(model.parameters())))
        with torch.no_grad():
            held: tuple[Any, Any, Any] | None = None  # the last gradient, lent to comms
            # each step of the generator runs the next part of the backward pass
            for param, grad in zip(params, grad_generator(loss, params), strict=True):
                if held is not None:  # late: after the next backward step was issued
                    _give_back(*held)
                    held = None
                lent, borrow = comms.borrow(grad, mutable=True)
                with comms.activate():
                    lent.reduce_("gpu", "sum")
                if late_drop:
                    held = (param, grad, borrow)
                else:  # early: before the next backward step
                    _give_back(param, grad, borrow)
            if held is not None:
                _give_back(*held)
    [m] = sim.summary()["meshes"]
    assert set(m["streams"]) == {"main", "comms"}
    return float(m["span_s"])


def test_streams_overlap_reductions_with_the_backward_pass(tmp_path: Path) -> None:
    early, late = _overlap(False, tmp_path), _overlap(True, tmp_path)
    assert late < early  # the reduction overlaps the next backward step (the work's span)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="trace_mode must be one of"):
        Simulator(trace_mode="everything")
    with pytest.raises(ValueError, match="gpus must be a positive int"):
        Simulator(gpus=0)
    sim = Simulator(hosts=1, gpus=2, trace_path=None, cost_cache=None)
    with pytest.raises(ValueError, match=r"\['gpus'\] are not dims"):
        sim.mesh.rename(gpus="dp")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert repr(sim.mesh) == "SimulatedMesh({'host': 1, 'gpu': 2})"
