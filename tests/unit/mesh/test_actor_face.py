"""Type checkers see endpoint signatures through what ``spawn`` returns: mypy accepts a
well-typed program over the adverbs and rejects, line by line, calls with a wrong or a
missing argument. One mypy run over several small programs (a few seconds)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from danaus.mesh import ActorMesh
from danaus.mesh._actor_face import ActorFace

mypy_api = pytest.importorskip("mypy.api")

_ACTOR = """
from danaus import Actor, Port, concurrent_endpoint, endpoint


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.n = start

    @endpoint
    def incr(self, n: int) -> int:
        self.n += n
        return self.n

    @endpoint
    async def label(self, prefix: str, *, upper: bool = False) -> str:
        return prefix.upper() if upper else prefix

    @endpoint
    def twice(self, n: int) -> int:
        return self.incr(n) + self.incr(n)  # plain method calls inside the actor

    @endpoint
    async def both(self) -> str:
        return await self.label("x") + str(self.incr(1))

    @endpoint(explicit_response_port=True)
    def ported(self, port: Port[int], n: int) -> None:
        port.send(n)

    @concurrent_endpoint
    async def waits(self, n: int) -> float:
        return n / 2

    @endpoint(instrument=True)
    def with_options(self, xs: list[int]) -> int:
        return sum(xs)
"""

_GOOD = """
from typing import assert_type

import operator

from danaus import (
    Accumulator,
    Channel,
    Future,
    ValueMesh,
    get_or_spawn_controller,
    mesh_stats,
    send,
    this_host,
    this_proc,
)

from counter import Counter


async def main() -> None:
    procs = this_host().spawn_procs(per_host={"procs": 2})
    mesh = await procs.spawn("c", Counter, 0)
    one = mesh.slice(procs=0)
    assert_type(one, Counter)
    assert_type(await one.incr.call_one(3), int)
    assert_type(one.incr.call_one(3).get(), int)
    assert_type(await mesh.incr.call(1), ValueMesh[int])
    assert_type(mesh.incr.call(1), Future[ValueMesh[int]])
    assert_type(await mesh.label.choose("p", upper=True), str)
    assert_type(await one.ported.call_one(2), int)
    assert_type(await one.waits.call_one(2), float)
    assert_type(await mesh.with_options.call([1, 2]), ValueMesh[int])
    mesh.incr.broadcast(2)
    await mesh.incr.post(2)
    for f in mesh.incr.stream(1):
        assert_type(f.get(), int)
    async for v in mesh.label.stream("q"):
        assert_type(v, str)
    assert_type(mesh.size(), int)
    assert_type(mesh.extent.sizes, list[int])
    assert_type(mesh.flatten("all").rename(all="x").split("x", {"a": 1, "b": 2}), Counter)
    assert_type(mesh.failed_ranks, dict[str, str])
    await mesh.initialized
    await mesh.stats()
    await mesh.stacks()
    await mesh_stats(mesh)
    total = Accumulator(mesh.incr, 0, operator.add)
    assert_type(await total.accumulate(1), int)
    port, receiver = Channel[int].open()
    send(mesh.incr, (1,), {}, port=port)
    await mesh.stop()
    ctrl = await get_or_spawn_controller("ctrl", Counter, 1)
    assert_type(await ctrl.incr.call_one(1), int)
    near = this_proc().spawn("near", Counter, 0)
    assert_type(near, Counter)
    await procs.stop()
"""

# Each bad line ends in "# E: <what the error must say>".
_BAD = """
from danaus import this_proc

from counter import Counter


async def main() -> None:
    mesh = this_proc().spawn("c", Counter, 0)
    await mesh.incr.call_one("x")  # E: incompatible type "str"; expected "int"
    await mesh.incr.call_one()  # E: Missing positional argument "n"
    await mesh.incr.call(n="x")  # E: incompatible type "str"; expected "int"
    mesh.label.broadcast(1)  # E: incompatible type "int"; expected "str"
    await mesh.label.choose("p", loud=True)  # E: Unexpected keyword argument "loud"
    s: str = await mesh.incr.call_one(1)  # E: Incompatible types in assignment
    mesh.nothing.call_one()  # E: has no attribute "nothing"
    await mesh.ported.call_one("x")  # E: incompatible type "str"; expected "int"
    await mesh.waits.call_one()  # E: Missing positional argument "n"
    mesh.with_options.broadcast([None])  # E: List item 0 has incompatible type "None"
"""


def _run_mypy(tmp_path: Path) -> tuple[str, int]:
    for name, text in {"counter.py": _ACTOR, "good.py": _GOOD, "bad.py": _BAD}.items():
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip())
    out, err, status = mypy_api.run(
        [
            "--strict",
            "--no-error-summary",
            "--show-error-codes",
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            str(tmp_path / "counter.py"),
            str(tmp_path / "good.py"),
            str(tmp_path / "bad.py"),
        ]
    )
    return out + err, status


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_mypy_checks_endpoint_calls_on_what_spawn_returns(tmp_path: Path) -> None:
    out, status = _run_mypy(tmp_path)
    errors: dict[tuple[str, int], list[str]] = {}
    for line in out.splitlines():
        m = re.match(r".*?([a-z]+)\.py:(\d+): error: (.*)", line)
        if m:
            errors.setdefault((m[1], int(m[2])), []).append(m[3])
    assert status == 1, out
    stray = {k: v for k, v in errors.items() if k[0] != "bad"}
    assert not stray, f"the good program and the actor must pass:\n{out}"
    bad_lines = textwrap.dedent(_BAD).lstrip().splitlines()
    expected = {i: line.split("# E: ")[1] for i, line in enumerate(bad_lines, 1) if "# E: " in line}
    for lineno, what in expected.items():
        said = " | ".join(errors.get(("bad", lineno), []))
        assert what in said, f"bad.py:{lineno} should say {what!r}; mypy said {said!r}\n{out}"
    unexpected = sorted(k[1] for k in errors if k[0] == "bad" and k[1] not in expected)
    assert not unexpected, f"errors on lines expected to pass: {unexpected}\n{out}"


def test_the_face_names_only_members_of_actor_meshes() -> None:
    face = {n for n in vars(ActorFace) if not n.startswith("_") or n in ("__len__", "__await__")}
    missing = sorted(n for n in face if not hasattr(ActorMesh, n))
    assert not missing, f"ActorFace declares what ActorMesh lacks: {missing}"
