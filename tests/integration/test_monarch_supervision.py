"""Supervision as Monarch's own tests (``python/tests/test_actor_error.py``) pin it, beyond
what test_base_exceptions covers: how reports name actors and failures, ``__supervise__``
running while an async endpoint of the owner awaits, an unhandled failure naming the
child that failed first, a fault hook that raises interrupting the controller, and the
runner's default hook (Monarch's: exit with status 1)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from danaus import SupervisionError, this_host

from ..faults import Failures
from .actors_lib import Fragile, Watcher

pytestmark = pytest.mark.timeout(120)

FAILED = "and all its descendants have failed"
FRAGILE = "tests.integration.actors_lib.Fragile"


async def test_a_dead_procs_actor_is_named_by_class_mesh_and_point(failures: Failures) -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}, name="dying") as procs:
        fragile = await procs.spawn("fragile", Fragile)
        with pytest.raises(SupervisionError) as info:
            await fragile.slice(procs=1).exit_now.call_one(3)
        # Monarch's users match on "The actor ...<mesh>... and all ..." and on the class
        assert str(info.value) == (
            "Endpoint call fragile.exit_now() failed, The actor "
            f"dying[1].<{FRAGILE} fragile{{'procs': 1/2}}> {FAILED}: its proc failed: "
            "exited with code 3"
        )
        f = await failures.first()
        assert str(f).startswith(
            "MeshFailure(mesh_name=fragile, crashed_ranks=[1], points=[{'procs': 1/2}], "
            "kind=proc, event="
        )
        assert f.actor == f"dying[1].<{FRAGILE} fragile{{'procs': 1/2}}>"


async def test_supervise_runs_while_an_async_endpoint_of_the_owner_awaits(
    failures: Failures,
) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}, name="top") as top:
        async with this_host().spawn_procs(per_host={"procs": 2}, name="low") as low:
            watcher = await top.spawn("watcher", Watcher, low)
            # the endpoint waits for __supervise__ to tell it: no deadlock, one failure
            heard = await watcher.fail_kid_and_wait.call_one(1)
            assert len(heard) == 1
            assert heard[0].startswith("MeshFailure(mesh_name=kids, crashed_ranks=[1],")
            assert "ValueError: plain in raise_plain" in heard[0]
            # the healthy kid serves; nothing reached the controller
            assert len(await watcher.spawn_named.call_one(low, "more")) == 2
            assert failures == []


async def test_an_unhandled_failure_names_the_child_that_failed_first(
    failures: Failures,
) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}, name="top") as top:
        async with this_host().spawn_procs(per_host={"procs": 1}, name="low") as low:
            watcher = await top.spawn("watcher", Watcher, low, False)  # leaves it unhandled
            with pytest.raises(SupervisionError) as info:
                await watcher.fail_kid_and_linger.call_one(0)
            text = str(info.value)
            assert re.search(
                r"The actor top\[0\]\.<tests\.integration\.actors_lib\.Watcher watcher\{'procs': 0/1\}> "
                r"failed because it did not handle a supervision event from its child; the "
                rf"event was: The actor low\[0\]\.<{re.escape(FRAGILE)} kids\{{'procs': 0/1\}}> {FAILED}: "
                r"ValueError: plain in raise_plain",
                text,
            ), text
            f = await failures.first()
            assert (f.mesh, f.kind) == ("watcher", "unhandled")


async def test_meshes_of_the_same_name_spawned_by_actors_of_other_procs_do_not_collide(
    failures: Failures,
) -> None:
    """Procs forked from one fork server once drew the same wire keys: two actors each
    spawning a mesh "kids" into the same procs then collided ("already lives")."""
    async with this_host().spawn_procs(per_host={"procs": 2}, name="top") as top:
        async with this_host().spawn_procs(per_host={"procs": 2}, name="low") as low:
            watchers = await top.spawn("watcher", Watcher, low)
            pids = (await watchers.spawn_named.call(low, "same")).values()
            assert [sorted(p) for p in pids] == [sorted(low.pids)] * 2
            assert failures == []


def _run(tmp_path: Path, body: str, *argv: str) -> subprocess.CompletedProcess[str]:
    prog = tmp_path / "prog.py"
    marker = tmp_path / "marker"
    prog.write_text(
        textwrap.dedent(
            f"""\
            import atexit, sys
            sys.path.insert(0, {str(Path(__file__).parents[2])!r})
            atexit.register(lambda: open({str(marker)!r}, "w").write("atexit ran"))
            """
        )
        + textwrap.dedent(body)
    )
    return subprocess.run(
        [sys.executable, *argv, str(prog)],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )


BROADCAST_FAILS = """\
import signal, threading
from tests.integration.actors_lib import Fragile
# SIGINT as a program started from a terminal has it, whatever the test runner's is (a
# runner started in the background passes SIGINT on ignored)
signal.signal(signal.SIGINT, {sigint})
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGINT}})
{imports}
procs = this_host().spawn_procs(per_host={{"procs": 1}})
fragile = procs.spawn("fragile", Fragile)
fragile.pid.call().get()
try:
    # No caller: it fails the actor, nobody handles it. The hook's KeyboardInterrupt may
    # come while broadcast() still returns (its frame is on its way), or during the wait,
    # which nothing else ends.
    fragile.raise_plain.broadcast()
    threading.Event().wait({wait})
finally:
    print("finally ran", flush=True)
print("not interrupted")
"""


def test_a_fault_hook_that_raises_interrupts_the_controller(tmp_path: Path) -> None:
    done = _run(
        tmp_path,
        BROADCAST_FAILS.format(
            imports="import danaus\nfrom danaus import this_host\n"
            "def hook(failure):\n    raise SystemExit(1)\n"
            "danaus.unhandled_fault_hook = hook\n",
            wait=60,
            sigint="signal.default_int_handler",
        ),
    )
    assert "finally ran" in done.stdout and "not interrupted" not in done.stdout, done.stderr
    assert "KeyboardInterrupt" in done.stderr
    assert "the fault hook raised SystemExit" in done.stderr
    assert (tmp_path / "marker").read_text() == "atexit ran"


def test_a_controller_that_ignores_sigint_is_still_interrupted(tmp_path: Path) -> None:
    """Started in the background or under nohup, a controller ignores SIGINT, so no
    signal reaches its main thread: the fault hook's KeyboardInterrupt is raised there
    at its next instruction instead (here, between two short waits)."""
    body = BROADCAST_FAILS.format(
        imports="import danaus\nfrom danaus import this_host\n"
        "def hook(failure):\n    raise SystemExit(1)\n"
        "danaus.unhandled_fault_hook = hook\n",
        wait=0,
        sigint="signal.SIG_IGN",
    ).replace(
        "    threading.Event().wait(0)\n",
        "    for _ in range(1200):  # a minute of short waits; the interrupt ends them\n"
        "        threading.Event().wait(0.05)\n",
    )
    done = _run(tmp_path, body)
    assert "finally ran" in done.stdout and "not interrupted" not in done.stdout, done.stderr
    assert "SIGINT is ignored or blocked" in done.stderr and "KeyboardInterrupt" in done.stderr


def test_the_runners_default_hook_is_monarchs(tmp_path: Path) -> None:
    done = _run(
        tmp_path,
        BROADCAST_FAILS.format(
            imports="from monarch.actor import this_host\n",
            wait=60,
            sigint="signal.default_int_handler",
        ),
        "-m",
        "danaus.monarch",
    )
    assert done.returncode != 0 and "not interrupted" not in done.stdout, done.stderr
    assert "unhandled failure, exiting: MeshFailure(mesh_name=fragile" in done.stderr
    assert (tmp_path / "marker").read_text() == "atexit ran"


def test_danaus_default_hook_logs_and_keeps_running(tmp_path: Path) -> None:
    body = BROADCAST_FAILS.format(
        imports="from danaus import this_host\n", wait=0, sigint="signal.default_int_handler"
    )
    # a later call fails (the actor failed); the hook ran before its answer came
    body += textwrap.dedent(
        """\
        try:
            fragile.pid.call().get()
        except Exception as e:
            print("later call:", type(e).__name__)
        print("procs serve:", procs.spawn("other", Fragile).pid.call().get() is not None)
        """
    )
    done = _run(tmp_path, body)
    assert done.returncode == 0, done.stderr
    assert "unhandled failure: MeshFailure(mesh_name=fragile" in done.stderr
    assert "later call: SupervisionError" in done.stdout
    assert "procs serve: True" in done.stdout
