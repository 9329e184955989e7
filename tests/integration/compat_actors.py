"""Actors for the Monarch compatibility tests (importable by procs)."""

from __future__ import annotations

import os
from typing import Any

from danaus import Actor, context, current_actor_name, current_rank, current_size, endpoint


class Ranks(Actor):
    """Says who it is and where the message found it."""

    @endpoint
    def who(self) -> dict[str, Any]:
        me = context().actor_instance
        assert me is not None
        return {
            "pid": os.getpid(),
            "own": dict(me.rank),
            "own_rank": me.rank.rank,
            "message": dict(current_rank()),
            "message_rank": current_rank().rank,
            "size": current_size(),
            "proc_id": me.proc_id,
            "name": current_actor_name(),
        }

    @endpoint
    def log(self, text: str) -> None:
        self.logger.info(text)

    @endpoint
    async def awho(self) -> dict[str, Any]:
        return {"message": dict(current_rank()), "size": current_size()}
