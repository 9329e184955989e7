"""``HostMesh.sync_workspace``: local folders mirrored on every host of a job, only what
changed sent, and with ``auto_reload`` the changed modules reloaded in the running
procs (Monarch's edit, sync, run-again loop)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from danaus import this_host
from danaus.job import ProcessJob
from danaus.mesh.seam import Workspace

from .workspace_actors import User

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[object, Path]]:
    remote = tmp_path / "remote"
    remote.mkdir()
    env = {"WORKSPACE_DIR": str(remote), "PYTHONPATH": f"{remote}/code{os.pathsep}{ROOT}"}
    job = ProcessJob({"hosts": 2}, env=env)
    try:
        yield job.state().hosts, remote
    finally:
        job.kill()


def test_a_workspace_is_mirrored_and_its_modules_reloaded(
    hosts: tuple[object, Path], tmp_path: Path
) -> None:
    mesh, remote = hosts
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "wsmod_a.py").write_text("VALUE = 1\n")
    (src / "pkg" / "data.bin").write_bytes(bytes(range(256)) * 1000)
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "junk.pyc").write_bytes(b"x")
    os.chmod(src / "wsmod_a.py", 0o640)
    ws = Workspace(dirs={src: "code"})
    mesh.sync_workspace(ws).get(timeout=60)
    code = remote / "code"
    assert sorted(str(p.relative_to(code)) for p in code.rglob("*") if p.is_file()) == [
        "pkg/data.bin",
        "wsmod_a.py",
    ]
    assert (code / "pkg" / "data.bin").read_bytes() == bytes(range(256)) * 1000
    assert (code / "wsmod_a.py").stat().st_mode & 0o777 == 0o640
    assert (code / "wsmod_a.py").stat().st_mtime_ns == (src / "wsmod_a.py").stat().st_mtime_ns

    procs = mesh.spawn_procs(per_host={"gpus": 2})
    users = procs.spawn("user", User)
    assert {v for v, _ in users.value.call("wsmod_a").get(timeout=60).values()} == {1}

    # edit, sync again: only the changed file is written, and the procs see it
    before = (code / "pkg" / "data.bin").stat().st_ino
    (src / "wsmod_a.py").write_text("VALUE = 'two'\n")
    mesh.sync_workspace(ws, auto_reload=True).get(timeout=60)
    assert (code / "pkg" / "data.bin").stat().st_ino == before  # untouched
    got = users.value.call("wsmod_a").get(timeout=60).values()
    assert {v for v, _ in got} == {"two"}
    assert {f for _, f in got} == {str(code / "wsmod_a.py")}
    procs.stop().get(timeout=60)


def test_a_file_larger_than_a_message_goes_in_pieces(
    hosts: tuple[object, Path], tmp_path: Path
) -> None:
    from danaus.mesh import _workspace

    mesh, remote = hosts
    src = tmp_path / "big"
    src.mkdir()
    data = os.urandom(3 * _workspace._BATCH + 12345)  # (the message limit: 16 MiB)
    (src / "weights.bin").write_bytes(data)
    (src / "empty").write_bytes(b"")
    mesh.sync_workspace(Workspace(dirs={src: "big"})).get(timeout=120)
    assert (remote / "big" / "weights.bin").read_bytes() == data
    assert (remote / "big" / "empty").read_bytes() == b""
    assert not [p for p in (remote / "big").iterdir() if ".sync-" in p.name]  # no leftovers


def test_mistakes_are_named(hosts: tuple[object, Path], tmp_path: Path) -> None:
    mesh, _ = hosts
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        mesh.sync_workspace(Workspace(dirs=[tmp_path / "nope"])).get(timeout=60)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.txt").write_text("x")
    with pytest.raises(ValueError, match="leads out of WORKSPACE_DIR"):
        mesh.sync_workspace(Workspace(dirs={tmp_path / "src": "../outside"})).get(timeout=60)
    assert not (tmp_path / "outside").exists()
    with pytest.raises(NotImplementedError, match="conda"):
        mesh.sync_workspace(Workspace(dirs=[tmp_path / "src"]), conda=True).get(timeout=60)
    procs = this_host().spawn_procs()
    try:
        with pytest.raises(NotImplementedError, match=r"HostMesh\.sync_workspace"):
            procs.sync_workspace(Workspace())
    finally:
        procs.stop().get(timeout=60)


def test_a_host_without_workspace_dir_says_so(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    job = ProcessJob({"hosts": 1}, env={"WORKSPACE_DIR": ""})
    try:
        with pytest.raises(RuntimeError, match="WORKSPACE_DIR is not set"):
            job.state().hosts.sync_workspace(Workspace(dirs=[tmp_path / "src"])).get(timeout=60)
    finally:
        job.kill()
