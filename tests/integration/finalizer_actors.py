"""An actor whose module holds an object with a finalizer (Monarch's test of procs that
exit through the interpreter's own finalization): see test_lifecycle."""

from __future__ import annotations

import os

from danaus import Actor, endpoint


class WritesOnDel:
    def __init__(self, path: str) -> None:
        self.file = open(path, "w")

    def __del__(self) -> None:
        self.file.write("finalized")
        self.file.close()


_held: WritesOnDel | None = None


class HoldsFinalizer(Actor):
    def __init__(self, path: str) -> None:
        global _held
        _held = WritesOnDel(path)

    @endpoint
    def pid(self) -> int:
        return os.getpid()
