"""``danaus.errors``: ``SupervisionError`` as Monarch's (a ``RuntimeError`` that names the
endpoint's call), and Monarch's words for an actor that failed."""

from __future__ import annotations

import pickle

from danaus.errors import RDMAOwnerError, SupervisionError, actor_failed


def test_supervision_error_names_the_call_as_monarchs_does() -> None:
    err = SupervisionError("the proc exited")
    assert isinstance(err, RuntimeError)
    assert (str(err), err.message, err.endpoint) == ("the proc exited", "the proc exited", None)
    named = err.for_endpoint("trainers.step()")
    assert str(named) == "Endpoint call trainers.step() failed, the proc exited"
    assert (named.message, named.endpoint) == ("the proc exited", "trainers.step()")
    assert named.for_endpoint("other.call()") is named  # the first call it failed
    back = pickle.loads(pickle.dumps(named))
    assert type(back) is SupervisionError and str(back) == str(named)
    assert str(pickle.loads(pickle.dumps(err))) == "the proc exited"


def test_a_subclass_keeps_its_own_text() -> None:
    owner_gone = RDMAOwnerError("the owner of the buffer is gone")
    assert owner_gone.for_endpoint("m.read()") is owner_gone
    assert str(owner_gone) == "the owner of the buffer is gone"


def test_actor_failed_reads_as_monarchs() -> None:
    assert actor_failed("procs[1].w[1]", "SystemExit: 3 in step") == (
        "The actor procs[1].w[1] and all its descendants have failed: SystemExit: 3 in step"
    )
    assert actor_failed("w[0]", "SystemExit: 3 in step\nTraceback (most recent call last):\n") == (
        "The actor w[0] and all its descendants have failed:\n"
        "  SystemExit: 3 in step\n  Traceback (most recent call last):"
    )
