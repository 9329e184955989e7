"""The controller's console as the procs' output forwarding sees it, for tests that wait
for what procs print."""

from __future__ import annotations

import asyncio


class Console:
    """Stands in for the controller's stdout and stderr: records what the procs' output
    forwarding prints, and wakes whoever waits for a line."""

    def __init__(self) -> None:
        self.text = ""
        self.changed = asyncio.Event()

    def write(self, s: str) -> int:
        self.text += s
        self.changed.set()
        return len(s)

    def flush(self) -> None:
        pass

    async def wait_for(self, needle: str) -> str:
        try:
            async with asyncio.timeout(10):
                while needle not in self.text:
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise AssertionError(f"{needle!r} not printed; got {self.text!r}") from None
        return self.text
