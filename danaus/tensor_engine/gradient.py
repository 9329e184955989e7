"""Monarch's gradient generator: the gradients of a backward pass one at a time.

``GradientGenerator(roots, with_respect_to)`` is an iterator whose ``next()`` gives the
gradient of ``roots`` with respect to the next item of ``with_respect_to``, running the
backward graph only as far as that gradient needs. A training loop can then start work on
the gradients that are ready first (e.g. an all-reduce of the last layer's weights) while
the rest of the backward pass is still to run::

    for param, grad in zip(params, grad_generator(loss, params)):
        reduce_(grad, "dp")          # issued before the next gradient is computed

The values are those of ``torch.autograd.grad(roots, with_respect_to, grad_roots,
allow_unused=True, retain_graph=True)``: ``None`` for an item the roots do not depend on.

The executor is written here, in Python, on torch's public view of the autograd graph:
nodes (``grad_fn``), their ``next_functions`` and their sequence numbers. It counts, for
each input of each node, the producers that will write into it, runs ready nodes in
decreasing sequence-number order (the order of torch's engine), and stops as soon as the
requested input is complete. It never runs ``AccumulateGrad`` nodes, so no ``.grad`` is
written, and it keeps the graph (as ``retain_graph=True``). Backward nodes are called
with their gradients whatever the tensor type, so tensor subclasses (danaus's ``DTensor``)
go through it as plain tensors do.

What it does not do that torch's engine does: run hooks registered on nodes or tensors
(``register_hook``, ``register_prehook``), skip the gradients of a node's inputs that no
item needs (torch's nodes compute every output the graph connects), and ``create_graph``.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from types import CellType, FunctionType
from typing import Any, TypeAlias, cast

import torch
from torch.autograd.function import BackwardCFunction
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = [
    "ContextRestorer",
    "GradFunction",
    "GradGenerator",
    "GradientGenerator",
    "TensorOrEdge",
    "grad_function",
    "grad_generator",
    "gradient_execution_order",
]

#: A tensor, or the place its gradient arrives at (``get_gradient_edge(t)``), which also
#: names an input of a node whose output tensor is gone.
TensorOrEdge: TypeAlias = torch.Tensor | GradientEdge

#: Monarch's hook, called as ``restorer(example, sequence_nr, last)`` around the running
#: of each node (``example`` None, ``sequence_nr`` the node's, ``last`` True: each node
#: runs once here) and the setting up of each root's gradient (``example`` the root's
#: gradient or None, ``sequence_nr`` the root's node's or None for a leaf, ``last``
#: False). It returns a generator: its first ``next()`` enters the context (e.g. the
#: device mesh and stream of the forward operation), the second leaves it.
ContextRestorer: TypeAlias = Callable[[torch.Tensor | None, int | None, bool], Iterator[object]]

_Slot: TypeAlias = tuple[Node, int]  # (node, input_nr): the input a gradient flows into

# AccumulateGrad nodes (leaves) have no sequence number; torch reports UINT64_MAX
_NO_SEQUENCE_NR = 2**64 - 1


def _sequence_nr(node: Node) -> int:
    return cast(int, cast(Any, node)._sequence_nr())  # noqa: SLF001 (torch's)


def _input_metadata(node: Node) -> tuple[Any, ...]:
    """Shape, dtype and device of each input (each forward output) of ``node``."""
    return tuple(cast(Any, node)._input_metadata)  # noqa: SLF001 (torch's)


def _as_slot(item: object, what: str) -> _Slot | torch.Tensor:
    """The (node, input_nr) that ``item``, a tensor or a gradient edge, names; a leaf
    tensor as it is, to be found by :func:`_leaf_slot` among the graph's leaves."""
    if isinstance(item, torch.Tensor):
        if not item.requires_grad:
            raise RuntimeError(
                f"{what} does not require grad and has no grad_fn: it is not part of an "
                "autograd graph"
            )
        if item.grad_fn is None:
            return item
        return item.grad_fn, item.output_nr
    if (
        isinstance(item, tuple)
        and len(item) >= 2
        and isinstance(item[0], Node)
        and isinstance(item[1], int)
    ):
        return item[0], item[1]
    raise TypeError(
        f"{what} must be a Tensor or a GradientEdge (node, output_nr), not {type(item).__name__}"
    )


def _leaf_slot(leaf: torch.Tensor) -> _Slot:
    """The AccumulateGrad input of a leaf no walked graph reaches (a leaf as a root)."""
    # get_gradient_edge makes a view to find the node; a torch-function subclass would
    # give the view's node in its place
    with torch._C.DisableTorchFunctionSubclass():  # noqa: SLF001 (torch's)
        edge = get_gradient_edge(leaf)
    return edge.node, edge.output_nr


def _variable(node: Node) -> torch.Tensor | None:
    """The leaf an AccumulateGrad node writes ``.grad`` of; None for other nodes."""
    variable = getattr(node, "variable", None)
    return variable if isinstance(variable, torch.Tensor) else None


class _NodeState:
    """What the generator knows of one node of the backward graph."""

    __slots__ = (
        "buffer",
        "context_nr",
        "metadata",
        "node",
        "outputs",
        "pending",
        "ran",
        "sequence_nr",
        "stage",
        "unready",
        "users",
    )

    def __init__(self, node: Node) -> None:
        self.node = node
        self.metadata = _input_metadata(node)
        self.sequence_nr = _sequence_nr(node)
        # what the context restorer gets: None for an AccumulateGrad node
        self.context_nr = None if self.sequence_nr >= _NO_SEQUENCE_NR else self.sequence_nr
        n = len(self.metadata)
        self.users: list[list[_NodeState]] = [[] for _ in range(n)]  # producers, per input
        self.pending = [0] * n  # producers per input that have yet to run
        self.unready = 0  # pending, summed over the inputs
        self.buffer: dict[int, torch.Tensor] = {}  # input_nr -> gradient so far
        self.outputs: list[_NodeState | None] = []  # per next edge: the node it feeds
        # the first item this node leads to: it runs when that item is asked for; None
        # for a node that leads to no item, which never runs
        self.stage: int | None = None
        self.ran = False

    def add(self, input_nr: int, grad: torch.Tensor) -> None:
        old = self.buffer.get(input_nr)
        self.buffer[input_nr] = grad if old is None else old + grad


def _fit(grad: torch.Tensor, metadata: Any, producer: Node, index: int) -> torch.Tensor:
    """``grad`` reduced over broadcast dimensions and cast to the input it flows into,
    as torch's engine does to what a node returns (``validate_outputs``)."""
    if not metadata.is_nested_tensor:
        shape = torch.Size(metadata.shape)
        if grad.shape != shape:
            if not _expandable(shape, grad.shape):
                raise RuntimeError(
                    f"{producer.name()} returned a gradient of shape {tuple(grad.shape)} "
                    f"at index {index}, where a shape of {tuple(shape)} was expected"
                )
            grad = grad.sum_to_size(shape)
    if grad.dtype != metadata.dtype:
        grad = grad.to(metadata.dtype)
    return grad


def _expandable(shape: torch.Size, to: torch.Size) -> bool:
    if len(shape) > len(to):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(to), strict=False))


def _run_node(state: _NodeState, grads: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Call the node with its input gradients: one gradient (or None) per next edge."""
    node = state.node
    if isinstance(node, BackwardCFunction):  # a custom autograd.Function's backward
        # torch fills missing gradients with zeros unless the Function said not to
        # (ctx.set_materialize_grads(False)), which cannot be read back: zeros are right
        # for both
        grads = [
            g if g is not None else torch.zeros(m.shape, dtype=m.dtype, device=m.device)
            for g, m in zip(grads, state.metadata, strict=True)
        ]
        out = node.apply(*grads)
        return _function_outputs(state, out if isinstance(out, tuple) else (out,))
    out = cast(Any, node)(*grads)  # torch's C++ nodes are callable
    outs = list(out) if isinstance(out, tuple) else [out]  # a lone gradient comes bare
    if len(outs) != len(state.outputs):
        raise RuntimeError(
            f"{node.name()} returned {len(outs)} gradients, expected {len(state.outputs)}"
        )
    return outs


def _function_outputs(state: _NodeState, out: tuple[Any, ...]) -> list[torch.Tensor | None]:
    """A custom Function's backward returns a gradient per forward argument (tensors or
    not); its next edges are one per tensor argument, those not requiring grad unset.
    The arguments that need a gradient are exactly those with a set edge, in order."""
    node = cast(Any, state.node)
    needs: tuple[bool, ...] = node.needs_input_grad
    if len(out) < len(needs) or any(g is not None for g in out[len(needs) :]):
        raise RuntimeError(
            f"{node.name()} returned {len(out)} gradients; its forward took {len(needs)} "
            "arguments, so it must return as many (None for the non-tensor ones)"
        )
    wanted = iter([g for g, need in zip(out, needs, strict=False) if need])
    return [next(wanted, None) if edge is not None else None for edge in state.outputs]


class GradientGenerator:
    """An iterator over the gradients of ``roots`` with respect to each item of
    ``with_respect_to`` in turn, each computed when ``next()`` asks for it.

    Args:
        roots: the tensors (or gradient edges) to differentiate, e.g. ``[loss]``.
        with_respect_to: the tensors (leaves or not) or gradient edges whose gradients
            ``next()`` gives, in this order.
        grad_roots: the gradient of each root (as ``grad_outputs``); a missing or None
            one is ``ones_like(root)``, for a root of one element.
        context_restorer: Monarch's hook run around each node (:data:`ContextRestorer`);
            None runs them in the caller's context.

    Raises:
        RuntimeError: a root or item that does not require grad.
        TypeError: an item that is not a tensor or a gradient edge.
        ValueError: more ``grad_roots`` than roots, or one whose shape is not its root's.
    """

    def __init__(
        self,
        roots: Sequence[TensorOrEdge],
        with_respect_to: Sequence[TensorOrEdge],
        grad_roots: Sequence[torch.Tensor | None] = (),
        context_restorer: ContextRestorer | None = None,
    ) -> None:
        if len(grad_roots) > len(roots):
            raise ValueError(
                f"{len(grad_roots)} grad_roots for {len(roots)} roots: give at most one per root"
            )
        self._restorer = context_restorer
        self._states: dict[Node, _NodeState] = {}
        # the graph of Python nodes lives while its tensors (or edges' tokens) do
        self._keep_alive: list[object] = [*roots, *with_respect_to]
        # a leaf tensor's node is found by walking the graph, not by get_gradient_edge,
        # which makes a view of it: an operation on the mesh for a DTensor
        root_refs = [_as_slot(r, f"roots[{i}]") for i, r in enumerate(roots)]
        item_refs = [_as_slot(w, f"with_respect_to[{i}]") for i, w in enumerate(with_respect_to)]
        with torch.no_grad():
            # roots with a node first: a leaf root their graph reaches is their leaf's node
            for i, ref in enumerate(root_refs):
                if not isinstance(ref, torch.Tensor):
                    self._seed(i, roots[i], ref, grad_roots[i] if i < len(grad_roots) else None)
            leaves = self._discover()
            for i, ref in enumerate(root_refs):
                if isinstance(ref, torch.Tensor):
                    node = leaves.get(id(ref))
                    slot = (node, 0) if node is not None else _leaf_slot(ref)
                    leaves[id(ref)] = slot[0]
                    self._seed(i, ref, slot, grad_roots[i] if i < len(grad_roots) else None)
        # an item the roots do not reach is None
        self._items: list[_Slot | None] = []
        for ref in item_refs:
            if isinstance(ref, torch.Tensor):
                node = leaves.get(id(ref))
                self._items.append(None if node is None else (node, 0))
            else:
                self._items.append(ref if ref[0] in self._states else None)
        self._wanted: dict[_Slot, int] = {}  # items still to give, per input
        for s in self._items:
            if s is not None:
                self._wanted[s] = self._wanted.get(s, 0) + 1
        # ready nodes: those of the earliest item first, then highest sequence number first
        self._ready: list[tuple[int, int, int, _NodeState]] = []
        self._order = itertools.count()  # ties in the ready heap
        self._plan()
        self._given = 0
        self._runs = 0
        self._failed: BaseException | None = None

    def _state(self, node: Node) -> tuple[_NodeState, bool]:
        state = self._states.get(node)
        if state is None:
            state = self._states[node] = _NodeState(node)
            return state, True
        return state, False

    def _seed(self, i: int, root: TensorOrEdge, slot: _Slot, grad: torch.Tensor | None) -> None:
        """Put root ``i``'s gradient into the input its gradient edge names."""
        state, _ = self._state(slot[0])
        meta = state.metadata[slot[1]]
        shape = root.shape if isinstance(root, torch.Tensor) else torch.Size(meta.shape)
        with self._context(grad, state.context_nr, False):
            if grad is None:
                if math.prod(shape) != 1:
                    raise RuntimeError(
                        f"roots[{i}] has shape {tuple(shape)}: a gradient can be implied "
                        f"(ones) only for a root of one element; give grad_roots[{i}]"
                    )
                if isinstance(root, torch.Tensor):
                    grad = torch.ones_like(root, memory_format=torch.preserve_format)
                else:
                    grad = torch.ones(shape, dtype=meta.dtype, device=meta.device)
            elif grad.shape != shape:
                raise ValueError(
                    f"grad_roots[{i}] has shape {tuple(grad.shape)} but roots[{i}] has "
                    f"shape {tuple(shape)}"
                )
            state.add(slot[1], grad)

    def _discover(self) -> dict[int, Node]:
        """Walk the graph from the roots' nodes, linking each node to its producers.
        Returns the AccumulateGrad node of each leaf found, by the leaf's id."""
        stack = list(self._states.values())
        leaves: dict[int, Node] = {}
        while stack:
            state = stack.pop()
            variable = _variable(state.node)
            if variable is not None:
                leaves[id(variable)] = state.node
            for node, input_nr in state.node.next_functions:
                if node is None:  # an input that needs no gradient
                    state.outputs.append(None)
                    continue
                nxt, new = self._state(node)
                if new:
                    stack.append(nxt)
                nxt.users[input_nr].append(state)
                state.outputs.append(nxt)
        return leaves

    def _plan(self) -> None:
        """Give each node the first item it leads to, and count, per input, the nodes
        that feed it: only they run, and an input is complete when its count is zero."""
        for stage, slot in enumerate(self._items):
            if slot is None:
                continue
            stack = list(self._states[slot[0]].users[slot[1]])
            while stack:
                state = stack.pop()
                if state.stage is None:  # else its producers have a stage already too
                    state.stage = stage
                    for users in state.users:
                        stack.extend(users)
        for state in self._states.values():
            if state.stage is None:
                continue
            for nxt, (_, input_nr) in zip(state.outputs, state.node.next_functions, strict=True):
                if nxt is not None:
                    nxt.pending[input_nr] += 1
                    nxt.unready += 1
        for state in self._states.values():
            if state.stage is not None and state.unready == 0:
                self._push(state)

    def _push(self, state: _NodeState) -> None:
        """Queue a node all of whose inputs are complete."""
        assert state.stage is not None
        heapq.heappush(self._ready, (state.stage, -state.sequence_nr, next(self._order), state))

    @contextlib.contextmanager
    def _context(
        self, example: torch.Tensor | None, sequence_nr: int | None, last: bool
    ) -> Iterator[None]:
        if self._restorer is None:
            yield
            return
        restore = self._restorer(example, sequence_nr, last)
        next(restore)
        try:
            yield
        finally:
            next(restore, None)

    def __iter__(self) -> GradientGenerator:
        return self

    def __next__(self) -> torch.Tensor | None:
        if self._failed is not None:
            raise RuntimeError(
                f"this GradientGenerator failed earlier ({self._failed!r}) and cannot go on"
            )
        if self._given >= len(self._items):
            self._close()
            raise StopIteration
        index, slot = self._given, self._items[self._given]
        self._given += 1
        if slot is None:
            value = None
        else:
            try:
                self._complete(index, slot)
            except BaseException as e:
                self._failed = e
                self._close()
                raise
            value = self._take(slot)
        if self._given == len(self._items):
            self._close()  # the last one: let go of the graph now
        return value

    def _complete(self, index: int, slot: _Slot) -> None:
        """Run the nodes that item ``index`` (at ``slot``) waits for: those whose first
        item it is (those of earlier items ran for them), highest sequence number first."""
        while self._ready and self._ready[0][0] <= index:
            self._run(heapq.heappop(self._ready)[3])
        target = self._states[slot[0]]
        if target.pending[slot[1]]:
            raise AssertionError(f"input {slot[1]} of {slot[0].name()} is still incomplete")

    def _run(self, state: _NodeState) -> None:
        node = state.node
        grads: list[torch.Tensor | None] = [state.buffer.get(i) for i in range(len(state.metadata))]
        # keep only the inputs still to be given
        state.buffer = {i: g for i, g in state.buffer.items() if (node, i) in self._wanted}
        with self._context(None, state.context_nr, True), torch.no_grad():
            outs = _run_node(state, grads)
            state.ran = True
            self._runs += 1
            for index, (nxt, grad) in enumerate(zip(state.outputs, outs, strict=True)):
                if nxt is None:
                    continue
                input_nr = node.next_functions[index][1]
                nxt.pending[input_nr] -= 1
                nxt.unready -= 1
                live = nxt.stage is not None
                if grad is not None and (live or (nxt.node, input_nr) in self._wanted):
                    nxt.add(input_nr, _fit(grad, nxt.metadata[input_nr], node, index))
                if live and nxt.unready == 0:
                    self._push(nxt)

    def _take(self, slot: _Slot) -> torch.Tensor | None:
        state = self._states[slot[0]]
        value = state.buffer.get(slot[1])
        self._wanted[slot] -= 1
        if not self._wanted[slot]:
            del self._wanted[slot]
            if state.ran or state.stage is None:  # nothing else reads it
                state.buffer.pop(slot[1], None)
        return value

    def _close(self) -> None:
        self._states.clear()
        self._keep_alive.clear()
        self._wanted.clear()

    def __repr__(self) -> str:
        if self._failed is not None:
            status = f"failed: {self._failed!r}"
        elif self._given >= len(self._items):
            status = "exhausted"
        else:
            status = f"{self._given}/{len(self._items)} given"
        return f"<GradientGenerator {status}, {self._runs} nodes run>"


def grad_generator(
    roots: torch.Tensor | Sequence[TensorOrEdge] = (),
    with_respect_to: Sequence[TensorOrEdge] = (),
    grad_roots: Sequence[torch.Tensor | None] = (),
) -> GradientGenerator:
    """A :class:`GradientGenerator` of ``roots`` (one tensor, or a sequence)."""
    if isinstance(roots, torch.Tensor):
        roots = [roots]
    return GradientGenerator(list(roots), list(with_respect_to), list(grad_roots))


class GradGenerator:
    """Gradients of pytrees, in the reverse of the order they were asked for: call
    :meth:`root` for each root and :meth:`grad` for each tree of tensors (e.g. a layer's
    parameters, first layer first), then iterate: one tree of gradients per ``grad``
    call, the last asked for first (the order the backward pass makes them)."""

    def __init__(self) -> None:
        self.roots: list[TensorOrEdge] = []
        self.grad_roots: list[torch.Tensor | None] = []
        self.with_respect_to: list[TensorOrEdge] = []
        self.unflattens: list[tuple[int, Callable[[list[torch.Tensor | None]], Any]]] = []

    def grad(self, tree: Any) -> None:
        """Ask for the gradient of each tensor of ``tree``."""
        leaves, unflatten = _flatten_tensors(tree)
        self.unflattens.append((len(leaves), unflatten))
        for i, t in enumerate(leaves):
            _as_slot(t, f"grad(...) tensor {i}")  # fail here, not when iterated
        self.with_respect_to.extend(leaves)

    def root(self, r: TensorOrEdge, grad: torch.Tensor | None = None) -> None:
        """Add a root, with its gradient (None: ones, for a root of one element)."""
        _as_slot(r, f"roots[{len(self.roots)}]")
        self.roots.append(r)
        self.grad_roots.append(grad)

    def __iter__(self) -> Iterator[Any]:
        gen = GradientGenerator(self.roots, self.with_respect_to[::-1], self.grad_roots)
        for n, unflatten in reversed(self.unflattens):
            yield unflatten([next(gen) for _ in range(n)][::-1])


def _flatten_tensors(
    tree: Any,
) -> tuple[list[torch.Tensor], Callable[[list[torch.Tensor | None]], Any]]:
    """The tensors of ``tree``, and a function that puts others in their places."""
    leaves, spec = tree_flatten(tree)
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def unflatten(tensors: list[torch.Tensor | None]) -> Any:
        filled = list(leaves)
        for i, t in zip(where, tensors, strict=True):
            filled[i] = t
        return tree_unflatten(filled, spec)

    return [leaves[i] for i in where], unflatten


class GradFunction(torch.autograd.Function):
    """Monarch's ``GradFunction``: ``fn(*args)`` returns ``(result, backward)`` where
    ``backward(*grads)`` gives the gradients of ``args``. What ``backward`` closes over
    is saved for backward (``ctx.save_for_backward`` for its tensors) rather than kept by
    the closure, so saved-tensor hooks and in-place checks apply to it."""

    @staticmethod
    def forward(ctx: Any, fn: Callable[..., tuple[Any, Callable[..., Any]]], *args: Any) -> Any:
        result, backward = fn(*args)
        ctx.backward_continuation = backward
        values = []
        for cell in backward.__closure__ or ():
            values.append(cell.cell_contents)
            cell.cell_contents = None  # the saved copy below is the one kept
        tensors, ctx.unflatten = _flatten_tensors(values)
        ctx.save_for_backward(*tensors)
        return result

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        orig = ctx.backward_continuation
        closure = tuple(CellType(v) for v in ctx.unflatten(list(ctx.saved_tensors)))
        fn = FunctionType(
            orig.__code__, orig.__globals__, orig.__name__, orig.__defaults__, closure
        )
        fn.__kwdefaults__ = orig.__kwdefaults__
        out = fn(*grads)
        return (None, *out) if isinstance(out, tuple) else (None, out)


def grad_function(fn: Callable[..., tuple[Any, Callable[..., Any]]]) -> Callable[..., Any]:
    """``fn`` as a differentiable function whose backward is the continuation ``fn``
    returns with its result (see :class:`GradFunction`). Keyword arguments are passed
    to ``fn`` but get no gradient."""

    apply: Callable[..., Any] = GradFunction.apply

    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            return apply(lambda *a: fn(*a, **kwargs), *args)
        return apply(fn, *args)

    call.__name__ = getattr(fn, "__name__", "grad_function")
    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def gradient_execution_order(
    roots: Sequence[TensorOrEdge], with_respect_to: Sequence[TensorOrEdge]
) -> list[int]:
    """The indices of ``with_respect_to`` in the order autograd run on ``roots`` would
    complete their gradients: that of the last use in the forward pass first (the
    gradient of an input is complete once its earliest user's backward has run). Items
    the roots do not reach come first."""
    items = [_as_slot(w, f"with_respect_to[{i}]") for i, w in enumerate(with_respect_to)]
    first_use: dict[_Slot, float] = {}
    stack: list[Node] = []
    for i, r in enumerate(roots):
        ref = _as_slot(r, f"roots[{i}]")
        if not isinstance(ref, torch.Tensor):  # a leaf root uses nothing
            stack.append(ref[0])
    seen: set[Node] = set()
    leaves: dict[int, Node] = {}
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        variable = _variable(node)
        if variable is not None:
            leaves[id(variable)] = node
        sequence_nr = _sequence_nr(node)
        for nxt, input_nr in node.next_functions:
            if nxt is not None:
                stack.append(nxt)
                slot = (nxt, input_nr)
                first_use[slot] = min(first_use.get(slot, math.inf), sequence_nr)

    def key(i: int) -> float:
        ref = items[i]
        if isinstance(ref, torch.Tensor):
            node = leaves.get(id(ref))
            return math.inf if node is None else first_use.get((node, 0), math.inf)
        return first_use.get(ref, math.inf)

    return sorted(range(len(items)), key=key, reverse=True)
