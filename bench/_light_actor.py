"""An actor whose module imports nothing heavy."""

from __future__ import annotations

from danaus import Actor, endpoint


class LightPing(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x
