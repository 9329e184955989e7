"""Tests of danaus.actors._future that need no peer: a Future does not travel."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from danaus import Channel, Future, SerializationError
from danaus.actors._serialize import dumps


async def test_a_future_cannot_be_pickled_and_says_what_to_send() -> None:
    fut: Future[int] = Future(loop=asyncio.get_running_loop())
    with pytest.raises(TypeError, match="a danaus Future cannot be pickled"):
        pickle.dumps(fut)
    # As an argument of a call: the error a caller sees names it too.
    with pytest.raises(SerializationError, match=r"Future cannot be pickled.*send its value"):
        dumps(([fut], {}), lambda: "arguments of A.f")
    fut.set_result(1)
    with pytest.raises(TypeError, match="Future cannot be pickled"):
        pickle.dumps(fut)  # done or not


async def test_a_port_travels_its_receiver_does_not() -> None:
    port, receiver = Channel[int].open()
    assert pickle.loads(pickle.dumps(port)).port_id == port.port_id
    with pytest.raises(TypeError, match=r"a PortReceiver cannot be pickled.*pass its Port"):
        pickle.dumps(receiver)
