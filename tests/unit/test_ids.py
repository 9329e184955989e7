"""Uid and ProcId (Monarch's identities as values)."""

from __future__ import annotations

import pickle

import pytest

from danaus import ProcId, Uid


def test_instance_uids_are_fresh_labelled_and_parse_back() -> None:
    a, b = Uid.instance("trainer"), Uid.instance("trainer")
    assert a != b and a.label == b.label == "trainer"
    assert a.is_instance and not a.is_singleton
    assert Uid.from_string(str(a)) == a and hash(Uid.from_string(str(a))) == hash(a)
    anon = Uid.anonymous()
    assert anon.label is None and Uid.from_string(str(anon)) == anon
    assert pickle.loads(pickle.dumps(a)) == a


def test_singleton_uids_are_their_names() -> None:
    u = Uid.from_string("procs[1]")
    assert u.is_singleton and u.label == "procs[1]" and str(u) == "procs[1]"
    assert u == Uid.from_string("procs[1]") and u != Uid.from_string("procs[2]")
    assert u != Uid.instance("procs[1]")


@pytest.mark.parametrize("bad", ["", "a b", "x<y>", "<zz>", "a\n"])
def test_text_that_is_no_uid_raises_value_error(bad: str) -> None:
    with pytest.raises(ValueError, match="not a uid"):
        Uid.from_string(bad)


def test_proc_ids_wrap_a_uid() -> None:
    p = ProcId(Uid.instance("worker"))
    assert p.label == "worker" and ProcId.from_string(str(p)) == p
    assert pickle.loads(pickle.dumps(p)) == p
    assert ProcId.from_string("procs[0]").uid == Uid.from_string("procs[0]")
    with pytest.raises(TypeError, match="takes a Uid"):
        ProcId("worker")  # type: ignore[arg-type]
