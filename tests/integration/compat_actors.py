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


class CodedError(Exception):
    """An exception with an attribute of its own."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message, code)
        self.code = code


class OddInitError(Exception):
    """Its __init__ takes other arguments than its args: it does not unpickle."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a}+{b}")


class Raiser(Actor):
    @endpoint
    def raise_(self, kind: str) -> None:
        import threading

        if kind == "value":
            raise ValueError("bad value", 42)
        if kind == "coded":
            raise CodedError("coded", code=7)
        if kind == "odd":
            raise OddInitError("a", "b")
        if kind == "unpicklable":
            err = RuntimeError("holds a lock")
            err.lock = threading.Lock()  # type: ignore[attr-defined]
            raise err
        if kind == "interrupt":
            raise KeyboardInterrupt("stop")
        if kind == "local":

            class LocalError(Exception):
                pass

            raise LocalError("defined in the endpoint")
        raise AssertionError(kind)
