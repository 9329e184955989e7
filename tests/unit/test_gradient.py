"""danaus.tensor_engine.gradient: Monarch's gradient generator, on plain CPU tensors."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch
from torch.autograd.graph import get_gradient_edge
from torch.nn.functional import relu

from danaus.tensor_engine.gradient import (
    GradFunction,
    GradGenerator,
    GradientGenerator,
    TensorOrEdge,
    grad_function,
    grad_generator,
    gradient_execution_order,
)


def reference(
    roots: Sequence[TensorOrEdge],
    wrt: Sequence[TensorOrEdge],
    grad_roots: Sequence[torch.Tensor | None] | None = None,
) -> tuple[torch.Tensor | None, ...]:
    return torch.autograd.grad(
        list(roots), list(wrt), grad_roots, allow_unused=True, retain_graph=True
    )


def assert_same(got: Sequence[torch.Tensor | None], want: Sequence[torch.Tensor | None]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if w is None:
            assert g is None, f"item {i}: expected None, got {g}"
        else:
            assert g is not None, f"item {i}: got None, expected {w}"
            assert g.shape == w.shape and g.dtype == w.dtype, i
            torch.testing.assert_close(g, w)


def check(
    roots: Sequence[TensorOrEdge],
    wrt: Sequence[TensorOrEdge],
    grad_roots: Sequence[torch.Tensor | None] = (),
) -> None:
    want = reference(roots, wrt, list(grad_roots) or None)
    assert_same(list(GradientGenerator(roots, wrt, grad_roots)), want)


class Traced(torch.autograd.Function):
    """Identity that notes in ``log`` when its backward runs."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, name: str, log: list[str]) -> torch.Tensor:
        ctx.name, ctx.log = name, log
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.log.append(ctx.name)
        return grad, None, None


def traced(x: torch.Tensor, name: str, log: list[str]) -> torch.Tensor:
    out: torch.Tensor = Traced.apply(x, name, log)  # type: ignore[no-untyped-call]
    return out


# -- equal to torch.autograd.grad --------------------------------------------------------


def test_two_roots_from_std_mean() -> None:
    x, y = torch.rand(4, requires_grad=True), torch.rand(4, requires_grad=True)
    _ = x * y  # a branch the roots do not use
    std, mean = torch.std_mean(x + y)
    check([std, mean], [y, x])


def test_layers_in_a_chain_and_an_unused_tensor() -> None:
    torch.manual_seed(0)
    inp = torch.rand(4, 3, requires_grad=True)
    ws = [torch.rand(3, 3, requires_grad=True) for _ in range(3)]
    vs = [torch.rand(3, 3, requires_grad=True) for _ in range(3)]
    unused = torch.rand(2, requires_grad=True)
    _ = unused.exp()
    h = inp
    for w, v in zip(ws, vs, strict=True):
        h = relu(h @ (w @ v))
    std, _ = torch.std_mean(h)
    loss = 2 * std
    wrt = [inp, ws[2], vs[2], unused, ws[1], vs[1], ws[0]]
    check([loss], wrt)
    assert list(GradientGenerator([loss], wrt))[3] is None


def test_a_tensor_feeding_many_branches() -> None:
    x = torch.rand(3, 3, requires_grad=True)
    a, b, c, d = x + x, x * x, x / (x + 1), x - 2 * x
    total = (a * b + c * d + a * c + b * d).sum()
    # a is not a leaf: its gradient is that of AddBackward's input
    check([total], [a, x, c])


def test_a_tensor_used_twice_by_one_operation() -> None:
    x = torch.rand(5, requires_grad=True)
    check([(x * x).sum()], [x])


def test_a_node_feeding_another_twice_runs_it_once() -> None:
    x = torch.rand(5, requires_grad=True)
    h = x.sin()
    loss = (h * h).exp().sum()  # MulBackward has two edges into SinBackward
    check([loss], [x])
    check([loss], [get_gradient_edge(h), x])


def test_random_graphs() -> None:
    rng = random.Random(7)
    shapes: list[tuple[int, ...]] = [(3,), (2, 3), (1, 3), ()]
    for _ in range(40):
        leaves = [torch.rand(rng.choice(shapes), requires_grad=True) for _ in range(4)]
        values = list(leaves)
        for _ in range(8):
            a, b = rng.choice(values), rng.choice(values)
            op = rng.choice(["add", "mul", "sin", "div", "mean"])
            if op == "add":
                values.append(a + b)
            elif op == "mul":
                values.append(a * b)
            elif op == "sin":
                values.append(a.sin())
            elif op == "div":
                values.append(a / (b * b + 1))
            else:
                values.append(a.mean(-1, keepdim=True) if a.dim() else a * 2)
        roots = [values[-1].sum(), values[-2].sum()]
        pool = [*values[:-2], torch.rand(2, requires_grad=True)]
        wrt: list[TensorOrEdge] = [
            get_gradient_edge(t) if t.grad_fn is not None and rng.random() < 0.3 else t
            for t in rng.sample(pool, k=6)
        ]
        check(roots, wrt)


def test_a_tensor_subclass() -> None:
    class Tagged(torch.Tensor):
        pass

    x = torch.rand(3).as_subclass(Tagged).requires_grad_()
    y = torch.rand(3, requires_grad=True)
    loss = (x * y + x.exp()).sum()
    gx, gy = GradientGenerator([loss], [x, y])
    want_x, want_y = reference([loss], [x, y])
    assert gx is not None and gy is not None and want_x is not None and want_y is not None
    torch.testing.assert_close(gx.as_subclass(torch.Tensor), want_x.as_subclass(torch.Tensor))
    torch.testing.assert_close(gy.as_subclass(torch.Tensor), want_y.as_subclass(torch.Tensor))


def test_broadcasting_is_reduced_as_torch_does() -> None:
    x = torch.rand(3, 3, requires_grad=True)
    row = torch.rand(3, requires_grad=True)
    scalar = torch.rand((), requires_grad=True)
    out = (x * (row / row.exp()) + scalar).sum()
    check([out], [x, row, scalar])
    grads = list(GradientGenerator([out], [row, scalar]))
    assert grads[0] is not None and grads[0].shape == (3,)
    assert grads[1] is not None and grads[1].shape == ()


def test_items_the_roots_do_not_reach_are_none() -> None:
    x, y = torch.rand(2, requires_grad=True), torch.rand(2, requires_grad=True)
    elsewhere = torch.rand(2, requires_grad=True)
    other_graph = (elsewhere * 3).sum()
    loss = (x * 2).sum()
    g_elsewhere, gx, gy = GradientGenerator([loss], [elsewhere, x, y])
    assert g_elsewhere is None and gy is None
    assert gx is not None
    torch.testing.assert_close(gx, torch.full((2,), 2.0))
    check([loss], [elsewhere, x, y])
    assert other_graph.requires_grad


def test_gradient_edge_of_an_intermediate() -> None:
    x = torch.rand(4, requires_grad=True)
    h = x.sin()
    out = (h * h + h.exp()).sum()  # three producers write into h's gradient
    edge = get_gradient_edge(h)
    check([out], [edge, x])


def test_item_asked_for_twice_and_a_root_as_item() -> None:
    x = torch.rand(3, requires_grad=True)
    h = x * 3
    loss = h.sum()
    check([loss], [x, h, x, loss])


def test_dtype_of_each_gradient_is_its_input_s() -> None:
    x = torch.rand(3, requires_grad=True)  # float32 into a float64 computation
    loss = (x.double() ** 2).sum()
    check([loss], [x])


def test_custom_function_with_non_tensor_arguments() -> None:
    class Mix(torch.autograd.Function):
        @staticmethod
        def forward(
            ctx: Any, k: int, x: torch.Tensor, tag: str, c: torch.Tensor, y: torch.Tensor
        ) -> torch.Tensor:
            ctx.k = k
            return k * x + c + y * y

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
            return None, ctx.k * g, None, g, None

    x, y = torch.rand(3, requires_grad=True), torch.rand(3, requires_grad=True)
    const = torch.rand(3)  # no grad: its edge is unset
    out = Mix.apply(4, x, "tag", const, y).sum()  # type: ignore[no-untyped-call]
    check([out], [x, y])
    gx, gy = GradientGenerator([out], [x, y])
    assert gx is not None
    torch.testing.assert_close(gx, torch.full((3,), 4.0))
    assert gy is None  # its backward returned None for y


# -- roots and grad_roots ---------------------------------------------------------------


def test_grad_roots_given() -> None:
    x = torch.rand(2, 3, requires_grad=True)
    a, b = x.exp(), x * x
    ga, gb = torch.rand(2, 3), torch.rand(2, 3)
    check([a, b], [x], [ga, gb])


def test_grad_roots_none_or_missing_are_ones() -> None:
    x = torch.rand(3, requires_grad=True)
    a, b, c = x.sum(), (x * 2).sum(), x.exp()
    gc = torch.rand(3)
    want = reference([a, c, b], [x], [None, gc, torch.ones(())])
    got = list(GradientGenerator([a, c, b], [x], [None, gc]))
    assert_same(got, want)


def test_roots_that_depend_on_each_other() -> None:
    x = torch.rand(3, requires_grad=True)
    h = (x * x).sum()
    loss = h * 3
    check([loss, h], [x, h])


def test_a_leaf_as_root() -> None:
    x = torch.rand((), requires_grad=True)
    y = torch.rand((), requires_grad=True)
    check([x], [x, y])
    check([x, x * 3 + y], [x, y])  # the other root reaches x too: 1 + 3


def test_grad_generator_takes_one_tensor() -> None:
    x = torch.rand(3, requires_grad=True)
    loss = (x * x).sum()
    (g,) = grad_generator(loss, [x])
    assert g is not None
    torch.testing.assert_close(g, 2 * x.detach())
    assert list(grad_generator()) == []


# -- laziness ---------------------------------------------------------------------------


def test_each_next_runs_only_what_that_gradient_needs() -> None:
    log: list[str] = []
    w1, w2, w3 = (torch.rand(3, requires_grad=True) for _ in range(3))
    a = traced(w1 * 2, "first", log)
    b = traced(a * w2, "second", log)
    loss = (b * w3).sum()
    gen = GradientGenerator([loss], [w3, w2, w1])
    g3 = next(gen)
    assert log == []  # the last layer's gradient needs neither backward
    g2 = next(gen)
    assert log == ["second"]
    g1 = next(gen)
    assert log == ["second", "first"]
    assert_same([g3, g2, g1], reference([loss], [w3, w2, w1]))


def test_nodes_no_item_needs_never_run() -> None:
    log: list[str] = []
    w1, w2 = torch.rand(3, requires_grad=True), torch.rand(3, requires_grad=True)
    loss = (traced(w1.exp(), "w1 branch", log) + w2 * w2).sum()
    assert_same(list(GradientGenerator([loss], [w2])), reference([loss], [w2]))
    assert log == []


def test_leaves_grad_is_not_written_and_graph_is_kept() -> None:
    x = torch.rand(3, requires_grad=True)
    loss = (x.exp() * x).sum()
    first = list(GradientGenerator([loss], [x]))
    assert x.grad is None
    second = list(GradientGenerator([loss], [x]))  # saved tensors are still there
    assert_same(first, second)
    loss.backward()
    assert x.grad is not None


def test_context_restorer_wraps_each_node() -> None:
    calls: list[tuple[str, Any]] = []

    def restorer(t: torch.Tensor | None, sequence_nr: int | None, last: bool) -> Iterator[None]:
        calls.append(("enter", (t is not None, sequence_nr, last)))
        yield
        calls.append(("exit", sequence_nr))

    x = torch.rand(3, requires_grad=True)
    h = x.exp()
    loss = h.sum()
    gen = GradientGenerator([loss], [x], context_restorer=restorer)
    assert h.grad_fn is not None and loss.grad_fn is not None
    seq_loss, seq_h = loss.grad_fn._sequence_nr(), h.grad_fn._sequence_nr()
    # the root's gradient is made in the context of the root's node
    assert calls == [("enter", (False, seq_loss, False)), ("exit", seq_loss)]
    (g,) = gen
    assert g is not None
    torch.testing.assert_close(g, x.exp().detach())
    assert calls[2:] == [
        ("enter", (False, seq_loss, True)),
        ("exit", seq_loss),
        ("enter", (False, seq_h, True)),
        ("exit", seq_h),
    ]


# -- grad_function, GradGenerator, gradient_execution_order -----------------------------


def test_grad_function_forward_and_backward() -> None:
    def scaled_product(x: torch.Tensor, y: torch.Tensor) -> Any:
        result = x * y * 3

        def backward(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return grad * y * 3, grad * x * 3

        return result, backward

    f = grad_function(scaled_product)
    x, y = torch.rand(3, requires_grad=True), torch.rand(3, requires_grad=True)
    out = f(x, y)
    torch.testing.assert_close(out, x.detach() * y.detach() * 3)
    assert out.grad_fn is not None and "GradFunction" in out.grad_fn.name()
    go = torch.rand(3)
    gx, gy = GradientGenerator([out], [x, y], [go])
    assert gx is not None and gy is not None
    torch.testing.assert_close(gx, go * y.detach() * 3)
    torch.testing.assert_close(gy, go * x.detach() * 3)
    assert_same([gx, gy], reference([out], [x, y], [go]))


def test_grad_function_single_gradient_and_keyword() -> None:
    def power(x: torch.Tensor, *, n: int) -> Any:
        saved = {"x": x, "n": n}

        def backward(grad: torch.Tensor) -> torch.Tensor:
            return grad * saved["n"] * saved["x"] ** (saved["n"] - 1)

        return x**n, backward

    x = torch.rand(4, requires_grad=True)
    out = grad_function(power)(x, n=3).sum()
    (gx,) = torch.autograd.grad(out, x)
    torch.testing.assert_close(gx, 3 * x.detach() ** 2)
    assert issubclass(GradFunction, torch.autograd.Function)


def test_grad_generator_class_gives_trees_last_asked_first() -> None:
    w1, w2 = torch.rand(3, requires_grad=True), torch.rand(3, requires_grad=True)
    b2 = torch.rand(3, requires_grad=True)
    loss = ((w1.exp() * w2) + b2).sum()
    gg = GradGenerator()
    gg.root(loss)
    gg.grad({"w": w1})
    gg.grad({"w": w2, "b": b2, "note": "layer 2"})
    second, first = list(gg)
    want_w1, want_w2, want_b2 = reference([loss], [w1, w2, b2])
    assert first.keys() == {"w"} and second["note"] == "layer 2"
    torch.testing.assert_close(first["w"], want_w1)
    torch.testing.assert_close(second["w"], want_w2)
    torch.testing.assert_close(second["b"], want_b2)


def test_gradient_execution_order_is_backward_order() -> None:
    x = torch.rand(3, 3, requires_grad=True)
    w1, w2, w3 = (torch.rand(3, 3, requires_grad=True) for _ in range(3))
    elsewhere = torch.rand(2, requires_grad=True)
    h1 = relu(x @ w1)
    h2 = relu(h1 @ w2)
    h3 = relu(h2 @ w3)
    loss = h3.mean() * 2
    # the last layer's gradients complete first; what the roots never reach comes first
    order = gradient_execution_order([loss], [w1, h3, w2, elsewhere, w3, h1])
    assert order == [3, 1, 4, 2, 5, 0]


# -- errors -----------------------------------------------------------------------------


def test_root_that_does_not_require_grad() -> None:
    x = torch.rand(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"roots\[1\] does not require grad"):
        GradientGenerator([x.sum(), torch.rand(())], [x])


def test_item_that_does_not_require_grad() -> None:
    x = torch.rand(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"with_respect_to\[1\] does not require grad"):
        GradientGenerator([x.sum()], [x, torch.rand(3)])


def test_item_of_the_wrong_type() -> None:
    x = torch.rand(3, requires_grad=True)
    with pytest.raises(TypeError, match=r"with_respect_to\[0\] must be a Tensor or a GradientEdge"):
        GradientGenerator([x.sum()], ["x"])  # type: ignore[list-item]


def test_implicit_gradient_of_a_non_scalar_root() -> None:
    x = torch.rand(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"roots\[0\] has shape \(3,\).*grad_roots\[0\]"):
        GradientGenerator([x * 2], [x])


def test_grad_roots_of_the_wrong_shape_or_number() -> None:
    x = torch.rand(3, requires_grad=True)
    with pytest.raises(ValueError, match=r"grad_roots\[0\] has shape \(2,\)"):
        GradientGenerator([x * 2], [x], [torch.ones(2)])
    with pytest.raises(ValueError, match="2 grad_roots for 1 roots"):
        GradientGenerator([x.sum()], [x], [None, None])


def test_next_past_the_end_and_repr() -> None:
    x = torch.rand(3, requires_grad=True)
    gen = GradientGenerator([(x * 2).sum()], [x, x])
    assert repr(gen) == "<GradientGenerator 0/2 given, 0 nodes run>"
    next(gen)
    assert repr(gen) == "<GradientGenerator 1/2 given, 2 nodes run>"
    next(gen)
    assert repr(gen) == "<GradientGenerator exhausted, 2 nodes run>"
    with pytest.raises(StopIteration):
        next(gen)
    assert iter(gen) is gen


def test_a_failing_backward_stops_the_generator() -> None:
    class Broken(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    x = torch.rand(3, requires_grad=True)
    loss = Broken.apply(x).sum()  # type: ignore[no-untyped-call]
    gen = GradientGenerator([loss], [x])
    with pytest.raises(ValueError, match="boom"):
        next(gen)
    assert repr(gen).startswith("<GradientGenerator failed: ValueError('boom')")
    with pytest.raises(RuntimeError, match="failed earlier"):
        next(gen)
