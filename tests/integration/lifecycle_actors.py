"""Actors for the proc lifecycle tests (importable by procs)."""

from __future__ import annotations

import os

from danaus import Actor, context, endpoint


class Where(Actor):
    """Says where it runs: its proc's listening address and pid."""

    @endpoint
    def where(self) -> tuple[str, int]:
        ctx = context().actor_instance
        assert ctx is not None
        return ctx.proc_addr, os.getpid()
