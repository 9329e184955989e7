"""``HostMesh.sync_workspace``: push local folders to every host of a host mesh and,
with ``auto_reload``, reload the changed modules in the procs running there (Monarch's
code sync: "I edited my code, run it again").

Each host gets one :class:`WorkspaceActor` (in a proc spawned for the sync and stopped
after it). A folder ``src`` goes to ``$WORKSPACE_DIR/<dst>`` on the host, as in Monarch.
Like ``rsync -rt``, a file is sent only when its size or modification time differs from
the host's copy; it is written next to its place and renamed over it (a reader never
sees half a file), with the source's time and permissions. Files on the host that the
source lacks are left alone.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..actors.seam import Actor, endpoint
from ._admin.inspect import ask_procs

if TYPE_CHECKING:
    from ._host_mesh import HostMesh

__all__ = ["Workspace", "WorkspaceActor", "sync_workspace"]

#: the files of a folder: relative path -> (size, modification time in ns, mode)
Manifest = dict[str, tuple[int, int, int]]
#: part of a file: (relative path, offset, bytes, file size, mtime ns, mode)
Piece = tuple[str, int, bytes, int, int, int]
#: at most this many bytes of file contents in one message (a file larger goes in pieces)
_BATCH = 16 << 20
#: never synced: Python's byte-code caches (each host compiles its own)
_SKIPPED = ("__pycache__",)


class Workspace:
    """Local folders to mirror on the hosts (Monarch's ``monarch.tools.config.workspace.
    Workspace``): ``Workspace(dirs=[src, ...])`` puts each ``src`` at
    ``$WORKSPACE_DIR/<its name>``; ``Workspace(dirs={src: dst})`` at
    ``$WORKSPACE_DIR/<dst>`` (``""``: the root itself).

    Args:
        dirs: the folders, as a list or a mapping to their places on the hosts.
        env: Monarch's environment to sync (a conda env); danaus syncs none, so only
            None is taken.
    """

    def __init__(
        self,
        dirs: Sequence[str | Path] | Mapping[str | Path, str] | None = None,
        env: object = None,
    ) -> None:
        if env is not None:
            raise NotImplementedError(
                "Workspace(env=...): danaus does not sync environments (conda); "
                "install the same environment on the hosts"
            )
        self.env = None
        self.dirs: dict[Path, str] = {}
        if isinstance(dirs, Mapping):
            for src, dst in dirs.items():
                self.dirs[Path(src)] = str(dst)
        else:
            for src in dirs or ():
                self.dirs[Path(src)] = Path(src).name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workspace) and self.dirs == other.dirs

    def __hash__(self) -> int:
        return hash(tuple(sorted((str(k), v) for k, v in self.dirs.items())))

    def __repr__(self) -> str:
        return f"Workspace(dirs={ {str(k): v for k, v in self.dirs.items()} })"

    @staticmethod
    def null() -> Workspace:
        """A workspace with nothing in it."""
        return Workspace()


def manifest(root: Path) -> Manifest:
    """The files under ``root`` (not following links out of it)."""
    files: Manifest = {}
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in _SKIPPED]
        for name in names:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                files[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return files


class WorkspaceActor(Actor):
    """The host's side of a sync: says which files it lacks, and writes them."""

    @staticmethod
    def _root(dst: str) -> Path:
        base = os.environ.get("WORKSPACE_DIR")
        if not base:
            raise RuntimeError(
                f"sync_workspace: WORKSPACE_DIR is not set on host {os.uname().nodename}: "
                "set it in the hosts' environment (ProcessJob(env=...), SlurmJob(env=...), "
                "or the host agent's)"
            )
        root = (Path(base) / dst).resolve()
        if not root.is_relative_to(Path(base).resolve()):
            raise ValueError(f"sync_workspace: {dst!r} leads out of WORKSPACE_DIR ({base})")
        return root

    @endpoint
    def wanted(self, dst: str, files: Manifest) -> list[str]:
        """Which of ``files`` (their sizes and times) this host lacks or has otherwise."""
        root = self._root(dst)
        have = manifest(root) if root.is_dir() else {}
        return [
            rel
            for rel, (size, mtime, _) in files.items()
            if have.get(rel, (0, 0, 0))[:2] != (size, mtime)
        ]

    @endpoint
    def write(self, dst: str, pieces: list[Piece]) -> list[str]:
        """Write pieces of files: ``(relative path, offset, bytes, file size, mtime ns,
        mode)`` each, a file's pieces in order (a large file comes in several calls). A
        file is written beside its place and renamed over it once its last piece is in.
        Returns the absolute paths of the files completed."""
        root = self._root(dst)
        written = []
        for rel, offset, data, size, mtime, mode in pieces:
            path = (root / rel).resolve()
            if not path.is_relative_to(root):
                raise ValueError(f"sync_workspace: {rel!r} leads out of {root}")
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.sync-{os.getpid()}")
            with open(tmp, "r+b" if offset else "wb") as f:
                f.seek(offset)
                f.write(data)
            if offset + len(data) >= size:
                os.chmod(tmp, stat.S_IMODE(mode))
                os.utime(tmp, ns=(mtime, mtime))
                os.replace(tmp, path)
                written.append(str(path))
        return written


def _piece(src: Path, rel: str, offset: int, n: int) -> bytes:
    """``n`` bytes of ``src/rel`` from ``offset``.

    Raises:
        RuntimeError: the file is shorter than it was listed (it is being written).
    """
    with open(src / rel, "rb") as f:
        f.seek(offset)
        data = f.read(n)
    if len(data) != n:
        raise RuntimeError(f"sync_workspace: {src / rel} changed while it was sent")
    return data


async def _send(syncers: WorkspaceActor, dst: str, batch: list[Piece]) -> list[str]:
    """One batch of pieces to every host; the files it completed (on any host)."""
    done: set[str] = set()
    for _, paths in (await syncers.write.call(dst, batch)).items():
        done.update(paths)
    return sorted(done)


async def sync_workspace(
    hosts: HostMesh, workspace: Workspace, conda: bool = False, auto_reload: bool = False
) -> list[str]:
    """Mirror ``workspace`` on every host of ``hosts``; with ``auto_reload``, reload the
    modules of the files written in every proc running on them. The files written."""
    if conda:
        raise NotImplementedError(
            "sync_workspace(conda=True): danaus does not sync conda environments"
        )
    for src in workspace.dirs:
        if not src.is_dir():
            raise FileNotFoundError(f"sync_workspace: {src} is not a folder")
    procs = hosts.spawn_procs(per_host={"procs": 1}, name="workspace_sync")
    written: list[str] = []
    try:
        syncers = await procs.spawn("workspace_sync", WorkspaceActor)
        for src, dst in workspace.dirs.items():
            files = await asyncio.to_thread(manifest, src)
            wanted = await syncers.wanted.call(dst, files)
            needed = sorted({rel for _, rels in wanted.items() for rel in rels})
            batch: list[Piece] = []
            pending = 0
            for rel in needed:
                size, mtime, mode = files[rel]
                # one file's pieces are read as they are sent: a file larger than memory
                # allows is never held whole
                for offset in range(0, max(size, 1), _BATCH):
                    n = min(_BATCH, size - offset)
                    data = await asyncio.to_thread(_piece, src, rel, offset, n)
                    batch.append((rel, offset, data, size, mtime, mode))
                    pending += len(data)
                    if pending >= _BATCH:
                        written += await _send(syncers, dst, batch)
                        batch, pending = [], 0
            if batch:
                written += await _send(syncers, dst, batch)
    finally:
        await procs.stop()
    if auto_reload and written:
        await _reload(hosts, written)
    return written


async def _reload(hosts: HostMesh, paths: list[str]) -> None:
    """Reload, in every live proc spawned on ``hosts``, the modules of these files."""
    await ask_procs(
        [a for g in hosts.spawned_groups() for a in g.addrs() if a], "reload_modules", paths
    )
