"""Copies of every rank's state in memory after each step, for a lost proc's successor.

After each step a worker packs its own state (its shards of the weights, buffers and
optimizer state, as they lie there) into one of two byte buffers, registered on the data
plane: the latest two steps' state. Where no other rank holds the same state, the
:class:`Keeper` beside its peer's worker (the next rank's; on several hosts, the same
place on the next host: an actor of its own on that proc) reads the
copy into its memory while the next step computes. Before its next optimizer step each
worker waits until its copy is held; the step's all-reduce, which every rank takes part
in before any changes its weights, then says that every copy of the step before is held.

So once the controller has seen step ``t`` end, every rank's state after step ``t - 1``
or ``t`` is in two procs' memory: its own buffers and its peer's keeper (DDP replicas
hold the same state: there, two replicas' own buffers serve every rank and no keeper
copies anything). A single lost proc, or several of which none is another's peer,
leaves one of each; :func:`restore_point` picks the latest step that every rank can start from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Container, Iterable, Mapping
from concurrent.futures import Future as ThreadFuture
from dataclasses import dataclass, field
from typing import Any

import torch

from ..actors import Actor, concurrent_endpoint, endpoint
from ._layout import Layout, runs_fsdp
from ._staging import Spec, copy_each, layout_of, packing, views

log = logging.getLogger("danaus.parallel")

#: seconds a keeper's read of a copy, or a successor's read of one, may take
READ_TIMEOUT_S = 120.0
#: seconds a worker waits for its peer to hold its copy, before its optimizer step
HELD_TIMEOUT_S = 120.0
#: the keeper on the controller (a trainer of one proc has no peer to hold its copy)
CONTROLLER = -1


@dataclass(frozen=True)
class Keepers:
    """A trainer's keepers: one beside each worker (``procs``), and, for a trainer of
    one proc, one on the controller (``controller``), which holds that proc's copy."""

    procs: Any  # an ActorMesh of Keeper over the trainer's procs
    controller: Any = None  # an ActorMesh of one Keeper, on the controller's proc

    def at(self, k: int) -> Any:
        """Keeper ``k``: the one at rank ``k``, or :data:`CONTROLLER`'s."""
        if k == CONTROLLER:
            return self.controller
        return self.procs.flatten("rank").slice(rank=k)

    def all(self) -> dict[int, Any]:
        """Every keeper, by :meth:`at`'s key."""
        flat = self.procs.flatten("rank")
        out = {r: flat.slice(rank=r) for r in range(len(flat))}
        if self.controller is not None:
            out[CONTROLLER] = self.controller
        return out

    async def stop(self) -> None:
        await self.procs.stop()
        if self.controller is not None:
            await self.controller.stop()


@dataclass(frozen=True)
class Copy:
    """One rank's state after step ``step``, waiting in a registered buffer."""

    step: int
    buffer: Any  # an RDMABuffer (a picklable handle)
    specs: tuple[Spec, ...]
    nbytes: int
    #: what is not a tensor (the fp16 loss scale, an optimizer's plain numbers)
    rest: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CopyPlan:
    """What a worker's setup is told of the copies: the trainer's keepers (one on each
    of its procs), the steps its state has taken where it starts, and, for a lost
    proc's successors, each rank's keeper holding its copy of that step."""

    keepers: Keepers
    start: int = 0
    restore: dict[int, int] | None = None
    #: the keepers ``restore`` names (beside the workers the successors replace)
    source: Keepers | None = None
    #: how far a rank's peer is, which reads its copies: the next rank, or on several
    #: hosts the same place on the next host (its procs per host)
    stride: int = 1


#: where a rank's shard of a tensor lies in the whole tensor: the whole's shape, the
#: shard's offset in each dim, and its shape
Place = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class Places:
    """Where each tensor of a rank's copies lies in the model's whole tensors, as its
    worker says once set up: for a re-plan, which builds those from every rank's copy
    (:func:`whole_state`)."""

    rank: int
    #: the layout's tensor-parallel ways (its tensors in the split layout: see _tp.whole)
    tp: int
    #: a copy's ``m.<key>``: the model's own name of the tensor, and where the rank's
    #: shard of it lies (None: the rank holds it whole)
    model: dict[str, tuple[str, Place | None]]
    #: each parameter, in the optimizer's order (a copy's ``o.<i>.<key>``): the
    #: model's own name, and where its shard (and its optimizer state's) lies
    params: tuple[tuple[str, Place | None], ...]


#: the bytes at the end of each copy that say which step it is of: written last, and
#: cleared before the buffer is written again, so that a read that overlapped a write
#: (of a copy a keeper still names) is caught, not restored from
STAMP = 8


def roles(layout: Layout, rank: int, stride: int) -> tuple[tuple[int, ...], bool, int | None]:
    """What rank ``rank`` of ``layout`` does with its copies: the ranks whose state is
    its own (under DDP its replicas, else itself), whether it keeps copies (under DDP the
    first two replicas alone: they serve every rank), and the keeper that reads them
    (its peer: ``stride`` ranks on, :data:`CONTROLLER` for a trainer of one proc; None
    under DDP)."""
    n = layout.dp * layout.pp * layout.tp
    if layout.dp > 1 and not runs_fsdp(layout.dp, layout.pp, layout.tp, layout.sharded):
        dp_i, pp_i, tp_i = layout.coords(rank)  # DDP (see ParallelWorker._replicate)
        return tuple(layout.rank(d, pp_i, tp_i) for d in range(layout.dp)), dp_i < 2, None
    return (rank,), True, (rank + stride) % n if n > 1 else CONTROLLER


def copy_layout(tensors: Mapping[str, torch.Tensor]) -> tuple[tuple[Spec, ...], int]:
    """Where each of ``tensors`` goes in a copy (packed as the data plane's staged
    batches are), and the copy's size, with its :data:`STAMP` after them."""
    specs, size = layout_of(tensors)
    return specs, size + STAMP


def stamp_of(data: torch.Tensor) -> int:
    """The step a copy's bytes say they are of (-1: being written)."""
    return int(data[-STAMP:].view(torch.int64)[0])


def set_stamp(data: torch.Tensor, step: int) -> None:
    data[-STAMP:].view(torch.int64)[0] = step


async def read_copy(
    copy: Copy, step: int, into: torch.Tensor | None = None, twice: bool = True
) -> torch.Tensor:
    """``copy``'s bytes (read ``into`` that tensor where it has their size), checked to
    be of step ``step``: the stamp read with them, and (``twice``) again after them: a
    write of the buffer clears it first, then writes it last. (A peer's keeper reading
    the copy as it is made needs no second look: its worker writes that buffer again
    only two steps on, after waiting for the read.)

    Raises:
        LookupError: the buffer holds another step's bytes, or was being written.
    """
    data = into if into is not None and into.numel() == copy.nbytes else None
    if data is None:
        data = torch.empty(copy.nbytes, dtype=torch.uint8)
    await copy.buffer.read_into(data, timeout=READ_TIMEOUT_S)
    got = (stamp_of(data), stamp_of(data))
    if twice:
        again = torch.empty(STAMP, dtype=torch.uint8)
        await copy.buffer.read_into(again, offset=copy.nbytes - STAMP, timeout=READ_TIMEOUT_S)
        got = (got[0], stamp_of(again))
    if got != (step, step):
        now = "was being written over" if -1 in got else f"now holds step {max(got)}'s"
        raise LookupError(f"the copy of step {step} at {copy.buffer!r} was overwritten: it {now}")
    return data


async def read_any(
    source: Keepers, rank: int, step: int, candidates: Iterable[int]
) -> tuple[Copy, torch.Tensor]:
    """Rank ``rank``'s copy of step ``step`` and its bytes, read from the first of the
    keepers ``candidates`` (of ``source``) that has it whole.

    Raises:
        LookupError: none of them has it (each one's reason said).
    """
    why = []
    for k in candidates:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                copy = await source.at(k).give.call_one(rank, step)
                return copy, await read_copy(copy, step)
        except Exception as e:  # (the next candidate may have it)
            why.append(f"keeper {k}: {type(e).__name__}: {e}")
    raise LookupError(
        f"no copy of rank {rank}'s state after step {step} could be read: " + "; ".join(why)
    )


def whole_state(
    copies: Mapping[int, Mapping[str, Any]],
    places: Mapping[int, Places],
    whole: Any,
    complete: bool = True,
) -> dict[str, torch.Tensor]:
    """The model's whole tensors under a checkpoint's keys (``model.<name>``,
    ``optim.<name>.<key>``: see :mod:`._checkpoint`) from the copies of ranks' state
    (:func:`views` of each, by rank; of DDP replicas one suffices) and where each
    rank's shards lie (``places``); ``whole(name, t, tp)`` turns a tensor from the
    layout tensor parallel splits into the model's own (:func:`._tp.whole`). Not
    ``complete``: those the copies cover whole, the others left out (:func:`lacking`).

    Raises:
        LookupError: (``complete``) a tensor no copy covers whole (a rank's copy missing).
    """
    out: dict[str, torch.Tensor] = {}
    covered: dict[str, int] = {}
    tps: dict[str, tuple[str, int]] = {}

    def put(key: str, name: str, place: Place | None, t: torch.Tensor, tp: int) -> None:
        tps[key] = (name, tp)
        if place is None:  # (held whole: a replica's, or another stage's tied weight)
            out[key], covered[key] = t.clone(), t.numel()
            return
        shape, offset, local = place
        if key not in out:
            out[key], covered[key] = torch.empty(shape, dtype=t.dtype), 0
        into = out[key][tuple(slice(o, o + n) for o, n in zip(offset, local, strict=True))]
        into.copy_(t.view(local))
        covered[key] += t.numel()

    for rank, saved in copies.items():
        at = places[rank]
        for key, (name, place) in at.model.items():
            put(f"model.{name}", name, place, saved[key], at.tp)
        for key, v in saved.items():
            if key.startswith("o.") and isinstance(v, torch.Tensor):
                i, k = key[2:].split(".", 1)
                name, place = at.params[int(i)]
                put(f"optim.{name}.{k}", name, place if v.dim() else None, v, at.tp)
    short = [k for k, t in out.items() if covered[k] < t.numel()]
    if short and not complete:
        for k in short:
            del out[k]
    elif short:
        raise LookupError(
            f"the copies read cover {', '.join(short[:3])}"
            f"{f' (and {len(short) - 3} more)' if len(short) > 3 else ''} only in part"
        )
    return {
        k: whole(tps[k][0], t, tps[k][1]) if t.dim() and tps[k][1] > 1 else t
        for k, t in out.items()
    }


def lacking(state: Mapping[str, torch.Tensor], places: Mapping[int, Places]) -> list[str]:
    """What a checkpoint of ``state`` (:func:`whole_state`) lacks of the model that
    ``places`` lay out: ``model.<name>`` of each weight or buffer, ``optim.<name>`` of
    each parameter whose optimizer state it has none of."""
    stepped = {k.removeprefix("optim.").rpartition(".")[0] for k in state if k.startswith("optim.")}
    model = {f"model.{name}" for p in places.values() for name, _ in p.model.values()}
    params = {name for p in places.values() for name, _ in p.params}
    return sorted(model - set(state)) + sorted(f"optim.{n}" for n in params - stepped)


@dataclass
class _Held:
    """A copy read into a keeper's memory: of rank ``serves[0]`` (a DDP replica's: of
    every rank in ``serves``)."""

    step: int
    data: torch.Tensor
    copy: Copy
    serves: tuple[int, ...]
    #: read for a successor to start from (:meth:`Keeper.adopt`), not as a peer's
    #: copy: dropped once the successor keeps its own (:meth:`Keeper.settle`)
    adopted: bool = False


class Keeper(Actor):
    """Beside each worker of a trainer: what this proc holds for a lost proc's successor.

    Its own worker's two latest copies (told by :meth:`mine`: the bytes stay in the
    worker's buffers) and the two latest copies of its peer's state, read into its own
    memory (:meth:`hold`). Answers while its worker is busy, or stuck in a collective
    waiting for a lost peer: it is an actor of its own."""

    def __init__(self) -> None:
        #: the worker's copies here, by its buffer: (the ranks each serves, the copy)
        self.own: dict[int, tuple[tuple[int, ...], Copy]] = {}
        #: copies read here, by the rank whose they are, the newest last
        self.held: dict[int, list[_Held]] = {}
        #: the held bytes registered for a successor to read, by id of the bytes
        self._registered: dict[int, Any] = {}

    @endpoint
    async def mine(self, serves: tuple[int, ...], copy: Copy) -> None:
        """The worker's copy of step ``copy.step`` waits in its buffer ``copy.step % 2``
        (over the copy two steps older): it serves the ranks ``serves``."""
        self.own[copy.step % 2] = (tuple(serves), copy)

    @concurrent_endpoint
    async def hold(self, rank: int, copy: Copy) -> int:
        """Read rank ``rank``'s copy into memory here, over the older one held (which is
        forgotten first: its step is never needed once a newer one is being sent); the
        step held. Concurrent: a read from a proc that died meanwhile must not keep the
        controller's questions waiting."""
        kept = self.held.setdefault(rank, [])
        spare = None
        if len(kept) >= 2:  # (its bytes are read over: no new pages each step)
            spare = kept.pop(0).data
            await self._unregister(spare)
        data = await read_copy(copy, copy.step, into=spare, twice=False)
        kept.append(_Held(copy.step, data, copy, (rank,)))
        return copy.step

    @concurrent_endpoint
    async def adopt(
        self,
        rank: int,
        step: int,
        source: Keepers,
        candidates: list[int],
        serves: tuple[int, ...],
        successor: bool,
    ) -> None:
        """Read rank ``rank``'s copy of step ``step`` from the first of the keepers
        ``candidates`` (of ``source``: the procs a recovery replaces) that has it whole:
        for this proc's new worker to start from (``successor``), or as the copy of its
        peer's state it holds from then on.

        Concurrent: a keeper may read its own rank's copy and its peer's at once, or
        one of its own.

        Raises:
            LookupError: none of them has it (each one's reason said).
        """
        copy, data = await read_any(source, rank, step, candidates)
        entry = _Held(step, data, copy, serves, adopted=successor)
        self.held.setdefault(rank, []).append(entry)

    @endpoint
    async def settle(self) -> None:
        """The successor keeps its own copies now: drop what was read for it."""
        for rank, kept in list(self.held.items()):
            for entry in [e for e in kept if e.adopted]:
                kept.remove(entry)
                await self._unregister(entry.data)
            if not kept:
                del self.held[rank]

    async def _unregister(self, data: torch.Tensor) -> None:
        buffer = self._registered.pop(id(data), None)
        if buffer is not None:
            await buffer.drop()

    @endpoint
    async def steps(self) -> list[tuple[int, int]]:
        """What this proc can give a successor: (rank, step) for each copy held."""
        out = [(r, c.step) for serves, c in self.own.values() for r in serves]
        out += [(r, e.step) for kept in self.held.values() for e in kept for r in e.serves]
        return out

    @endpoint
    async def give(self, rank: int, step: int) -> Copy:
        """Rank ``rank``'s copy of step ``step``, for its successor to read: one read
        into this proc's memory where there is one, else the worker's own (which its
        worker may be writing over: :func:`read_copy` checks).

        Raises:
            LookupError: none is held here (the worker has since moved on).
        """
        for kept in self.held.values():  # (first: read whole, and never written over)
            for e in kept:
                if e.step == step and rank in e.serves:
                    from ..rdma import RDMABuffer

                    buffer = self._registered.get(id(e.data))
                    if buffer is None:
                        buffer = self._registered[id(e.data)] = RDMABuffer(e.data)
                    return Copy(step, buffer, e.copy.specs, e.copy.nbytes, e.copy.rest)
        for serves, copy in self.own.values():  # (its reader checks its stamp)
            if copy.step == step and rank in serves:
                return copy
        mine = sorted(set(await self.steps()))
        raise LookupError(
            f"this proc holds no copy of rank {rank}'s state after step {step} "
            f"(it holds (rank, step): {mine})"
        )

    @endpoint
    async def nbytes(self) -> int:
        """The bytes of the copies read here (the worker's own: see its held_bytes)."""
        return sum(e.data.numel() for kept in self.held.values() for e in kept)


def held_by_step(
    held: Mapping[int, Iterable[tuple[int, int]]],
) -> dict[int, dict[int, list[int]]]:
    """Step -> rank -> the keepers holding that rank's copy of that step (its own proc's
    first), from each live keeper's :meth:`Keeper.steps` (``held``)."""
    where: dict[int, dict[int, list[int]]] = {}
    for keeper, pairs in held.items():
        for rank, step in pairs:
            at = where.setdefault(step, {}).setdefault(rank, [])
            if keeper not in at:
                at.insert(0, keeper) if keeper == rank else at.append(keeper)
    return where


def restore_point(
    n: int, held: Mapping[int, Iterable[tuple[int, int]]], latest: int, oldest: int
) -> tuple[int, dict[int, list[int]]] | None:
    """The latest step, from ``latest`` down to ``oldest``, whose copies cover every rank
    of ``n``, and where each rank's copies are (keepers' ranks: its own proc's first);
    None where no step is covered. ``held``: each live keeper's :meth:`Keeper.steps`."""
    where = held_by_step(held)
    for step in range(latest, oldest - 1, -1):
        found = where.get(step, {})
        if all(r in found for r in range(n)):
            return step, {r: found[r] for r in range(n)}
    return None


def uncovered(n: int, held: Mapping[int, Iterable[tuple[int, int]]], step: int) -> list[int]:
    """The ranks of ``n`` no copy of step ``step`` in ``held`` covers."""
    have = {rank for pairs in held.values() for rank, s in pairs if s == step}
    return [r for r in range(n) if r not in have]


#: where a step's copy goes (views of a buffer), and what it copies there
_Lists = tuple[list[torch.Tensor], list[torch.Tensor]]


class Copier:
    """A worker's side of the copies: its two buffers, its notices to its own keeper and,
    where its state is its own, the copy its peer's keeper reads.

    A step's weights and optimizer state are packed in a thread of its own, and its
    keepers told from the proc's loop, while the next step's forward and backward run
    (which read them, and change neither: its buffers, which a forward may change, are
    packed at once); the optimizer step first waits for that (:meth:`wait_held`)."""

    def __init__(
        self, rank: int, keepers: Keepers, serves: tuple[int, ...] | None, peer: int | None
    ) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from ..actors.seam import current_runtime

        self.rank = rank
        self.serves = serves  # None: this rank keeps no copy (a DDP replica past two)
        self.own = keepers.at(rank)
        self.peer = None if peer is None else keepers.at(peer)
        self._rt = current_runtime()  # (the proc's: made on the worker's thread)
        #: the two buffers: (bytes, its registration), the older overwritten each step
        self.slots: list[tuple[torch.Tensor, Any] | None] = [None, None]
        self.failed: BaseException | None = None
        self._packer = ThreadPoolExecutor(1, thread_name_prefix="danaus-copy")
        #: the latest copy's buffer, and what its sending resolves to once its keepers
        #: are told: the peer's keeper reading it (a Future), or None where no peer reads
        self._sending: tuple[int, ThreadFuture[Any]] | None = None
        #: the tensors last packed (the same dict while the state keeps its shape), and
        #: where each goes in a copy, and its size
        self._layout: tuple[Mapping[str, torch.Tensor], tuple[Spec, ...], int] | None = None
        #: per buffer, what a step copies into it (:func:`packing`: made once): its
        #: tensors named in ``now``, then the rest; with the buffer, tensors and ``now``
        #: they were made for
        self._packing: list[tuple[tuple[Any, ...], _Lists, _Lists] | None] = [None, None]

    def nbytes(self) -> int:
        return sum(s[0].numel() for s in self.slots if s is not None)

    def wait_held(self) -> None:
        """Before the optimizer step: the latest copy is packed, and held by the peer
        (the step's all-reduce, after this, tells every rank that every copy is)."""
        try:
            self._sent()
        except Exception as e:  # the step goes on; a recovery may then find no copy
            if self.failed is None:
                log.warning("rank %d: its state's copy is not held: %s", self.rank, e)
            self.failed = e

    def _sent(self) -> None:
        """Wait for the latest copy to be packed, its keepers told, and its peer's read.

        Raises:
            Exception: what went wrong on the way (a read that failed, a timeout).
        """
        sending, self._sending = self._sending, None
        if sending is None:
            return
        pending = sending[1].result(timeout=HELD_TIMEOUT_S)
        if pending is not None:
            pending.get(timeout=HELD_TIMEOUT_S)

    def after_step(
        self,
        step: int,
        tensors: Mapping[str, torch.Tensor],
        rest: dict[str, Any],
        now: Container[str] = (),
    ) -> None:
        """This rank's state after step ``step`` into the older buffer: the tensors named
        in ``now`` at once, the rest in the packer's thread, which then tells the
        keepers."""
        if self.serves is None:
            return
        from ..rdma import RDMABuffer

        k = step % 2
        if self._sending is not None and self._sending[0] == k:  # (never, in step order)
            self.wait_held()
        if self._layout is None or self._layout[0] is not tensors:  # (the same each step)
            self._layout = (tensors, *copy_layout(tensors))
        _, specs, size = self._layout
        slot = self.slots[k]
        if slot is None or slot[0].numel() != size:
            if slot is not None:
                slot[1].drop().get(timeout=READ_TIMEOUT_S)
            slot = (torch.empty(size, dtype=torch.uint8), None)
            set_stamp(slot[0], -1)
            slot = (slot[0], RDMABuffer(slot[0]))
            self.slots[k] = slot
        set_stamp(slot[0], -1)  # (first: a read of the copy it held now fails)
        made_for = (slot[0], tensors, now)
        lists = self._packing[k]
        if lists is None or any(a is not b for a, b in zip(lists[0], made_for, strict=True)):
            first = packing(slot[0], tensors, specs, only=now)
            lists = (made_for, first, packing(slot[0], tensors, specs, skip=now))
            self._packing[k] = lists
        copy_each(*lists[1])
        copy = Copy(step, slot[1], specs, size, rest)
        sent: ThreadFuture[Any] = ThreadFuture()
        self._sending = (k, sent)
        self._packer.submit(self._pack_and_tell, slot[0], lists[2], copy, sent)

    def _pack_and_tell(
        self, out: torch.Tensor, rest: _Lists, copy: Copy, sent: ThreadFuture[Any]
    ) -> None:
        """The packer's thread: the rest of the copy (``rest``), then its keepers told
        (from the proc's loop)."""
        from ..actors.seam import run_on

        try:
            copy_each(*rest)
            set_stamp(out, copy.step)  # (last: the copy is whole)
        except BaseException as e:
            sent.set_exception(e)
            return
        run_on(self._rt, self._tell, copy, sent)

    def _tell(self, copy: Copy, sent: ThreadFuture[Any]) -> None:
        """On the proc's loop: the own keeper told where the copy is, the peer's keeper
        to read it."""
        try:
            self.own.mine.broadcast(self.serves, copy)
            pending = None if self.peer is None else self.peer.hold.call_one(self.rank, copy)
        except BaseException as e:
            sent.set_exception(e)
            return
        sent.set_result(pending)

    def close(self) -> None:
        """Stop keeping copies: the latest one's sending ended (its peer's read, which
        the buffers must outlast), the buffers released."""
        self._packer.shutdown(wait=True)
        with contextlib.suppress(Exception):  # (no step needs it any more)
            self._sent()
        for slot in self.slots:
            if slot is not None:
                try:
                    slot[1].drop().get(timeout=5.0)
                except Exception:  # (the proc is going: nothing to release)
                    pass
        self.slots, self._packing = [None, None], [None, None]


def contents(copy: Copy, data: torch.Tensor) -> dict[str, Any]:
    """What a copy holds (``data``: its bytes, read): its tensors, as views of them, then
    its other values."""
    return {**views(data, copy.specs), **copy.rest}


def fetch(keepers: Keepers, keeper: int, rank: int, step: int) -> dict[str, Any]:
    """Rank ``rank``'s state after step ``step``, from the copy keeper ``keeper`` read
    for it (:meth:`Keeper.adopt`; from sync code: a worker's setup): its tensors, then
    its other values.

    Raises:
        LookupError: the copy is not there, or not of that step.
    """
    copy = keepers.at(keeper).give.call_one(rank, step).get(timeout=READ_TIMEOUT_S)
    data = torch.empty(copy.nbytes, dtype=torch.uint8)
    copy.buffer.read_into(data, timeout=READ_TIMEOUT_S).get()
    if stamp_of(data) != step:
        raise LookupError(f"rank {rank}'s copy of step {step} is of step {stamp_of(data)}")
    return contents(copy, data)
