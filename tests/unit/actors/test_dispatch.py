"""The actor layer's one table of message handlers (``danaus/actors/_dispatch.py``): every
type of the wire union has exactly one handler, and every handler is the actor layer's own
(a forgotten entry fails here, in ``make check``, not first in an integration test)."""

from __future__ import annotations

from typing import get_args

from danaus.actors._dispatch import HANDLERS
from danaus.actors._runtime import Runtime
from danaus.actors._wire import Message


def test_the_table_names_every_wire_type_and_nothing_else() -> None:
    assert set(HANDLERS) == set(get_args(Message))
    assert all(callable(h) for h in HANDLERS.values())


def test_every_handler_is_the_actor_layers_own() -> None:
    foreign = {t.__name__: h.__module__ for t, h in HANDLERS.items()}
    foreign = {t: m for t, m in foreign.items() if not m.startswith("danaus.actors.")}
    assert foreign == {}, f"handled outside the actor layer: {foreign}"


async def test_a_runtime_dispatches_by_that_table(runtime: Runtime) -> None:
    assert runtime.handlers is HANDLERS
