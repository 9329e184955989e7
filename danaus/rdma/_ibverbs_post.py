"""The reader's side of the ``ibverbs`` backend once queue pairs exist: the queue of
transfers on each queue pair, posting their chunks as the send queue and the completion
queue have room, and accounting for the completions the poller thread hands back.

:class:`Poster` owns the reader's connections (one RC queue pair per owner), the work
requests in flight and the completion-queue credits; the backend sets connections up and
tears everything down, and this module never talks to an owner.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import RDMAError, RDMATransferError
from . import _verbs
from ._ibverbs_parts import LocalMR, LocalRegions, Poller
from ._verbs import Completion, Device, QueuePair

__all__ = ["Conn", "Poster", "Transfer"]

log = logging.getLogger("danaus.rdma")


@dataclass(eq=False)
class Transfer:
    """One read or write, posted in chunks of at most ``chunk_bytes``."""

    what: str  # for messages: "RDMA READ of 4096 bytes at offset 0 of buffer 3 of <owner>"
    opcode: int
    local: LocalMR
    local_addr: int
    remote_addr: int
    rkey: int
    length: int
    future: asyncio.Future[None]
    posted: int = 0  # bytes posted
    outstanding: int = 0  # work requests posted, not completed
    error: RDMAError | None = None
    finished: bool = False
    #: the status of its own failed work completion (a flush is not its own)
    status: int | None = None
    #: failed only because its queue pair broke under it (another transfer's error, or a
    #: timeout): nothing is wrong with it, and it may run again on a new queue pair
    flushed: bool = False

    @property
    def all_posted(self) -> bool:
        return self.error is not None or self.posted >= self.length


@dataclass(eq=False)
class Conn:
    """The reader's RC queue pair to one owner."""

    owner: str
    qp: QueuePair
    credits: int  # free send-queue slots
    queue: collections.deque[Transfer] = field(default_factory=collections.deque)
    outstanding: int = 0
    broken: str | None = None  # why, once broken


class Poster:
    """Posts transfers' work requests and accounts for their completions, on the loop.

    Args:
        device: the adapter whose queue pairs and completion queue this posts on.
        chunk_bytes: bytes per work request.
        local: the reader's cache of local memory regions (a finished transfer releases
            its region there).
        destroy_qp: destroys a queue pair once its flushes are in (the backend's, which
            logs a failure).
    """

    def __init__(
        self,
        device: Device,
        chunk_bytes: int,
        local: LocalRegions,
        destroy_qp: Callable[[QueuePair], None],
    ) -> None:
        self.device = device
        self._destroy_qp = destroy_qp
        self.chunk_bytes = chunk_bytes
        self.conns: dict[str, Conn] = {}  # owner -> its live connection
        self.draining: set[Conn] = set()  # broken, waiting for their flushes
        self.inflight: dict[int, tuple[Conn, Transfer]] = {}  # wr_id -> its transfer
        self.poller: Poller | None = None
        self._local = local
        self._wr_ids = itertools.count(1)
        self._cq_credits = device.cq_depth

    def submit(self, conn: Conn, t: Transfer) -> None:
        """Queue ``t`` on ``conn`` and post what there is room for (starts the poller)."""
        if self.poller is None:
            loop = asyncio.get_running_loop()
            self.poller = Poller(self.device, loop, self._on_completions, self._on_poll_error)
        conn.queue.append(t)
        self._pump(conn)

    def abandon(self, t: Transfer, conn: Conn) -> None:
        """The caller stopped waiting: post no more of ``t``."""
        if t.error is None:
            t.error = RDMATransferError(f"{t.what} was abandoned")
        if t in conn.queue:
            conn.queue.remove(t)
        self._finish(t)

    def break_conn(self, conn: Conn, why: str) -> None:
        """Stop using ``conn``'s queue pair: error it (flushing what is posted) and fail
        its queued transfers; the next transfer to its owner connects anew."""
        if conn.broken is not None:
            return
        conn.broken = why
        if self.conns.get(conn.owner) is conn:
            del self.conns[conn.owner]
        self.draining.add(conn)
        try:
            self.device.set_error(conn.qp)
        except Exception as e:
            log.warning(
                "ibverbs: could not move the queue pair to %s to the error state: %s", conn.owner, e
            )
        self._pump(conn)

    def close(self, why: str) -> list[QueuePair]:
        """Fail every transfer still waiting with ``why``; forget every connection and
        return their queue pairs (for the caller to destroy) once the poller is stopped."""
        transfers = {id(t): t for _, t in self.inflight.values()}
        conns = [*self.conns.values(), *self.draining]
        for conn in conns:
            transfers.update((id(t), t) for t in conn.queue)
        for t in transfers.values():
            if not t.future.done():
                t.future.set_exception(RDMATransferError(f"{t.what} failed: {why}"))
        self.conns.clear()
        self.draining.clear()
        self.inflight.clear()
        return [c.qp for c in conns]

    # ------------------------------------------------------------ posting

    def _pump(self, conn: Conn) -> None:
        """Post the queued chunks of ``conn`` that its send queue and the CQ have room for."""
        while conn.queue:
            t = conn.queue[0]
            if conn.broken is not None and t.error is None:
                t.error = RDMATransferError(f"{t.what} failed: {conn.broken}")
                t.flushed = True
            if t.all_posted:
                conn.queue.popleft()
                self._finish(t)
                continue
            if conn.credits <= 0 or self._cq_credits <= 0 or self.poller is None:
                return
            n = min(self.chunk_bytes, t.length - t.posted)
            wr_id = next(self._wr_ids)
            wr = _verbs.rdma_work_request(
                wr_id,
                t.opcode,
                t.local_addr + t.posted,
                n,
                t.local.region.lkey,
                t.remote_addr + t.posted,
                t.rkey,
            )
            self.inflight[wr_id] = (conn, t)
            conn.credits -= 1
            conn.outstanding += 1
            t.outstanding += 1
            self._cq_credits -= 1
            self.poller.expect(1)
            try:
                self.device.post_send(conn.qp, wr)
            except Exception as e:
                del self.inflight[wr_id]
                conn.credits += 1
                conn.outstanding -= 1
                t.outstanding -= 1
                self._cq_credits += 1
                self.poller.expect(-1)
                self.break_conn(conn, f"posting a work request failed: {type(e).__name__}: {e}")
                continue
            t.posted += n

    # ------------------------------------------------------------ completions

    def _on_completions(self, completions: list[Completion]) -> None:
        """On the loop: account for completions polled by the poller thread."""
        touched: dict[int, Conn] = {}
        for c in completions:
            entry = self.inflight.pop(c.wr_id, None)
            if entry is None:
                continue
            conn, t = entry
            conn.credits += 1
            conn.outstanding -= 1
            t.outstanding -= 1
            self._cq_credits += 1
            if c.status != _verbs.WC_SUCCESS:
                if t.error is None:
                    if c.status == _verbs.WC_WR_FLUSH_ERR and conn.broken is not None:
                        why = conn.broken
                        t.flushed = True
                    else:
                        why = (
                            f"work completion {_verbs.status_text(c.status)}, "
                            f"vendor error {c.vendor_err:#x}"
                        )
                        t.status = c.status
                    t.error = RDMATransferError(f"{t.what} failed: {why}")
                self.break_conn(
                    conn,
                    f"the queue pair to {conn.owner} failed with "
                    f"{_verbs.WC_STATUS_NAMES.get(c.status, c.status)}",
                )
            self._finish(t)
            touched[id(conn)] = conn
        for conn in touched.values():
            self._pump(conn)
            self._drop_if_drained(conn)
        for conn in list(self.conns.values()):  # CQ room may have been what they lacked
            if conn.queue and id(conn) not in touched:
                self._pump(conn)

    def _on_poll_error(self, exc: BaseException) -> None:
        """On the loop: the poller thread died; fail what waits on it."""
        self.poller = None
        why = f"polling the completion queue failed: {type(exc).__name__}: {exc}"
        inflight, self.inflight = self.inflight, {}
        for conn, t in inflight.values():
            conn.outstanding -= 1
            t.outstanding -= 1
            self._cq_credits += 1
            if t.error is None:
                t.error = RDMATransferError(f"{t.what} failed: {why}")
        for conn in [*self.conns.values(), *self.draining]:
            self.break_conn(conn, why)
            self._drop_if_drained(conn)
        for _, t in inflight.values():
            self._finish(t)

    def _finish(self, t: Transfer) -> None:
        if t.finished or t.outstanding > 0 or not t.all_posted:
            return
        t.finished = True
        t.local.inuse -= 1
        if not t.future.done():
            if t.error is not None:
                t.future.set_exception(t.error)
            else:
                t.future.set_result(None)
        self._local.evict()

    def _drop_if_drained(self, conn: Conn) -> None:
        if conn in self.draining and conn.outstanding == 0:
            self.draining.discard(conn)
            self._destroy_qp(conn.qp)
