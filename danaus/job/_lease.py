"""The lease a controller holds on a scheduled job's agents (see ``_agent``).

A controller holds the job from ``state()`` on, through the :class:`JobLease` actor in
each node's agent, for as long as its connection lives, and says how long the job may
outlive it (``linger``): 0 for a job that ends with its controller, so that a controller
killed with SIGKILL ends the job at once; ``idle_timeout`` for a job saved for a later
controller. Before any controller holds it, the job waits ``idle_timeout`` for one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from concurrent.futures import Future as ThreadFuture

from ..actors.seam import Actor, endpoint
from ..config import config

__all__ = ["AGENTS_DIR", "LEASE", "JobLease", "hold_job"]

#: The wire name of the lease actor in an agent of a job.
LEASE = "job_lease"
#: Where agents write their addresses, in the job directory.
AGENTS_DIR = "agents"


class JobLease(Actor):
    """Ends this node's agent once no controller has held the job for its linger time."""

    def __init__(self, node: str, addr: str, idle_timeout: float | None) -> None:
        self.node = node
        self.addr = addr
        self.holders: dict[str, float | None] = {}  # controller address -> its linger (s)
        self._timer: asyncio.TimerHandle | None = None
        self._watching = False
        self._arm(idle_timeout, "no controller has attached")

    def _arm(self, delay: float | None, why: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if delay is None:
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(delay, self._end, f"{why} for {delay:g} s")

    def _end(self, why: str) -> None:
        print(f"danaus job agent on {self.node}: {why}: ending the job here", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)  # the host agent's own clean stop

    def _lost(self, peer: str) -> None:
        if peer not in self.holders:
            return
        linger = self.holders.pop(peer)
        if not self.holders:
            self._arm(linger, f"controller {peer} is gone")

    @endpoint
    def hold(self, controller: str, linger: float | None) -> dict[str, object]:
        """``controller`` holds the job while its connection lives, and for ``linger``
        seconds after (None: until the job is cancelled). Returns this agent's info."""
        from ..actors.seam import current_runtime

        if not self._watching:
            current_runtime().on_lost.append(self._lost)
            self._watching = True
        self.holders[controller] = linger
        self._arm(None, "")
        return {"node": self.node, "addr": self.addr, "pid": os.getpid()}


def hold_job(addrs: list[str], linger: float | None) -> None:
    """From the controller: hold the job whose agents listen at ``addrs``; they end it
    ``linger`` seconds after this process is gone (``None``: never)."""

    def hold() -> None:
        # From a thread of our own: the call goes through danaus's background loop,
        # whose connections live as long as this process (not an application loop's).
        from ..actors.seam import current_runtime
        from ..mesh import Shape
        from ..mesh.seam import mesh_ref

        shape = Shape.from_sizes({"hosts": len(addrs)})
        lease = mesh_ref(LEASE, JobLease, shape, dict(enumerate(addrs)))
        lease.hold.call(current_runtime().addr, linger).get(timeout=config.connect_timeout)

    done: ThreadFuture[None] = ThreadFuture()

    def run() -> None:
        try:
            hold()
            done.set_result(None)
        except BaseException as e:
            done.set_exception(e)

    threading.Thread(target=run, name="danaus-slurm-hold", daemon=True).start()
    done.result(timeout=config.connect_timeout + 5)
