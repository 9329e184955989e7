"""``debug_controller()`` (Monarch's): an actor in the controller that lists the actors
paused in pdb and waits for one, beside ``danaus debug``."""

from __future__ import annotations

import pytest

from danaus import debug_controller, this_host
from danaus.actors._debugging.sessions import registry
from tests.integration.debug_actors import Paused


def test_the_debug_controller_waits_for_and_lists_paused_actors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    procs = this_host().spawn_procs(per_host={"procs": 2}, name="dbgc")
    try:
        dc = debug_controller()
        assert debug_controller() is dc  # one singleton
        assert dc.list.call_one(print_output=False).get(timeout=30) == []
        with pytest.raises(TimeoutError, match=r"within 0\.2 s"):
            dc.wait_pending_session.call_one(timeout=0.2).get(timeout=30)
        paused = procs.spawn("paused", Paused)
        result = paused.slice(procs=1).sync_point.call_one(4)
        dc.wait_pending_session.call_one(timeout=60).get(timeout=90)
        records = dc.list.call_one().get(timeout=30)
        assert [(r["mesh"], r["rank"], r["reason"]) for r in records] == [
            ("paused", 1, "breakpoint")
        ]
        assert "debug_actors.py" in records[0]["where"]
        assert "paused" in capsys.readouterr().out  # print_output: the table
        registry.detach(None)  # as `continue` in danaus debug
        assert result.get(timeout=60) == 41  # rank 0 of the slice called
    finally:
        procs.stop().get(timeout=30)
