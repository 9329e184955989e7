"""Tests of danaus.actors._context: a context is this process's own state and says so
when pickled (as Monarch's ``Context`` and ``Instance`` do not pickle either)."""

from __future__ import annotations

import pickle

import cloudpickle
import pytest

from danaus import Point, context
from danaus.actors._context import ActorContext


def test_the_context_cannot_be_pickled_and_says_why() -> None:
    for dump in (pickle.dumps, cloudpickle.dumps):
        with pytest.raises(TypeError, match=r"context\(\) cannot be pickled: it says who runs"):
            dump(context())


def test_an_actor_instance_cannot_be_pickled_and_names_the_actor() -> None:
    me = ActorContext("procs[1].counter[1]", "counter", Point({"procs": 1}, {"procs": 2}), "x")
    with pytest.raises(TypeError, match=r"actor_instance \(procs\[1\]\.counter\[1\]\) cannot"):
        pickle.dumps(me)
