"""Actors that stop in pdb, for the debugger tests (importable by procs)."""

from __future__ import annotations

from danaus import Actor, current_rank, endpoint, this_host


class Paused(Actor):
    @endpoint
    def sync_point(self, x: int) -> int:
        secret = x * 10 + current_rank().rank
        breakpoint()
        secret += 1  # (where pdb stops: the line after breakpoint())
        return secret

    @endpoint
    async def async_point(self, x: int) -> int:
        secret = x * 10 + current_rank().rank
        breakpoint()
        secret += 1  # (where pdb stops, async)
        return secret

    @endpoint
    def fails(self, x: int) -> int:
        doomed = x * 100 + current_rank().rank
        raise ValueError(f"doomed is {doomed}")

    @endpoint
    def nested(self, x: int) -> int:
        """Spawn a mesh of one proc of its own, whose actor stops at a breakpoint."""
        procs = this_host().spawn_procs(per_host={"procs": 1})
        try:
            inner = procs.spawn("inner", Paused)
            return inner.sync_point.call_one(x).get(timeout=120)
        finally:
            procs.stop().get(timeout=30)
