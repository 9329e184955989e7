"""The import hook behind :mod:`danaus.monarch`: ``monarch.*`` modules served by danaus."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ENV", "install", "installed", "monarch_rdma_backend"]

#: Set by :func:`install` and inherited by spawned procs, which call it at start (a
#: pickled class from the user's module may ``import monarch.actor`` there).
ENV = "DANAUS_PROC_STARTUP"
_STARTUP = "danaus.monarch:install"
_PREFIX_LOGS = "DANAUS_PREFIX_PYTHON_LOGS_WITH_ACTOR"


def _actor(name: str) -> Any:
    import danaus

    if name == "unhandled_fault_hook":
        return danaus.unhandled_fault_hook
    return getattr(danaus, name)


def _rdma(name: str) -> Any:
    if name == "get_rdma_backend":
        return monarch_rdma_backend
    return getattr(importlib.import_module("danaus.rdma"), name)


def monarch_rdma_backend() -> str:
    """``monarch.rdma.get_rdma_backend()``, in Monarch's words: ``"ibverbs"`` where an RDMA
    device serves, ``"tcp"`` where another transport moves the bytes (Monarch's name for
    its fallback; danaus's own ``get_rdma_backend()`` says which: ``shm`` or ``tcp``), and
    ``"none"`` where nothing does."""
    rdma = importlib.import_module("danaus.rdma")
    available: list[str] = rdma.backends()
    if "ibverbs" in available:
        return "ibverbs"
    return "tcp" if available else "none"


def _from(module: str) -> Callable[[str], Any]:
    """Names looked up in the danaus module ``module`` (imported on first use)."""

    def lookup(name: str) -> Any:
        return getattr(importlib.import_module(module), name)

    return lookup


_config = _from("danaus.config")


def _safe_torch(name: str) -> Any:
    """``monarch.safe_torch.torch``: torch (Monarch imports it on a thread of its own to
    dodge a pybind11 bug of its Rust bindings; danaus has none to dodge)."""
    if name == "torch":
        return importlib.import_module("torch")
    raise AttributeError(name)


def _tools(name: str) -> Any:
    if name in ("commands", "config"):
        return importlib.import_module(f"monarch.tools.{name}")
    raise AttributeError(name)


@dataclasses.dataclass
class ToolsConfig:
    """``monarch.tools.config.Config``: Monarch's TorchX job description. danaus
    schedules nothing from it (its jobs do that: docs/jobs.md); its ``workspace`` is what
    ``HostMesh.sync_workspace`` takes."""

    scheduler: str = ""
    scheduler_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    workspace: Any = None
    dryrun: bool = False
    appdef: Any = None

    def __post_init__(self) -> None:
        if self.workspace is None:
            from danaus.mesh.seam import Workspace

            self.workspace = Workspace.null()


def _tools_config(name: str) -> Any:
    if name == "Config":
        return ToolsConfig
    if name == "workspace":
        return importlib.import_module("monarch.tools.config.workspace")
    if name == "Workspace":
        from danaus.mesh.seam import Workspace

        return Workspace
    raise AttributeError(name)


#: monarch.tools.commands names that build TorchX applications, which danaus does not use
_TORCHX = frozenset({"create", "get_or_create", "torchx_runner"})
#: monarch.tools.commands names danaus serves for SLURM server handles (slurm:///job)
_SERVER_HANDLES = frozenset({"info", "server_ready", "kill", "kill_and_confirm"})


def _commands(name: str) -> Any:
    if name in _TORCHX:
        raise ImportError(
            f"danaus does not provide monarch.tools.commands.{name}: it builds and submits "
            "TorchX applications; danaus's jobs (SlurmJob, ProcessJob, LocalJob) and the "
            "danaus apply / exec / kill verbs do that work (docs/jobs.md)",
            name="monarch.tools.commands",
        )
    if name in _SERVER_HANDLES:
        return getattr(importlib.import_module("danaus.job.server_handles"), name)
    if name == "debug":
        return importlib.import_module("danaus.tools.debug").debug
    return getattr(importlib.import_module("danaus.job.cli"), name)


#: monarch's top-level names that are submodules, and Monarch's older names
_TOP_MODULES = {
    "timer": "monarch.timer",
    "builtins": "monarch.builtins",
    "fetch": "monarch.fetch",
}


def _nothing(name: str) -> Any:
    raise AttributeError(name)


#: top-level names left out on purpose, with the reason
_TOP_WHY_NOT = {
    "set_meta": "it sets up Monarch's own simulator's internals (danaus's Simulator takes "
    "its settings as arguments)",
    "mast_reserve": "it reserves hosts on MAST, Meta's internal scheduler",
}


def _top(name: str) -> Any:
    """``monarch.X``: the tensor engine's names first (Monarch keeps them at the top),
    then danaus's, then the configuration functions."""
    if name in _TOP_MODULES:
        return importlib.import_module(_TOP_MODULES[name])
    if name in _TOP_WHY_NOT:
        raise ImportError(
            f"danaus does not provide monarch.{name}: {_TOP_WHY_NOT[name]} (docs/monarch.md)",
            name="monarch",
        )
    if name == "ActorFuture":
        import danaus

        return danaus.Future
    try:
        te = importlib.import_module("danaus.tensor_engine")
    except ImportError:
        te = None
    if te is not None and hasattr(te, name):
        return getattr(te, name)
    import danaus

    if hasattr(danaus, name):
        return getattr(danaus, name)
    return _config(name)


def _only(module: str, names: frozenset[str]) -> Callable[[str], Any]:
    """``names`` of the danaus module ``module``, and no other."""
    lookup = _from(module)

    def only(name: str) -> Any:
        if name not in names:
            raise AttributeError(name)
        return lookup(name)

    return only


def _cli(name: str) -> Any:
    """``monarch.tools.cli.main(argv)``: the ``monarch`` command, whose verbs (``apply``,
    ``exec``, ``shell``, ``context``, ``kill``, ``debug``, ``dashboard``) are danaus's."""
    if name != "main":
        raise AttributeError(name)

    def main(argv: list[str] | None = None) -> None:
        """Run one verb; return when it succeeded (``SystemExit`` with its code if not)."""
        try:
            importlib.import_module("danaus.__main__").main(sys.argv[1:] if argv is None else argv)
        except SystemExit as e:
            if e.code not in (0, None):
                raise

    return main


#: module name -> how a name of it is found in danaus
_MODULES: dict[str, Callable[[str], Any]] = {
    "monarch": _top,
    "monarch.actor": _actor,
    "monarch.actor.concurrent": _actor,
    "monarch.rdma": _rdma,
    "monarch.config": _config,
    "monarch.spmd": _from("danaus.spmd"),
    "monarch.job": _from("danaus.job"),
    "monarch.job.spmd": _from("danaus.spmd"),
    "monarch.timer": _from("danaus.tensor_engine.timer"),
    "monarch.builtins": _from("danaus.tensor_engine.builtins"),
    "monarch.safe_torch": _safe_torch,
    "monarch.common": _nothing,  # (a package of Monarch's internals; some modules served)
    "monarch.common.selection": _from("danaus.mesh"),
    "monarch.common.opaque_ref": _from("danaus.tensor_engine.opaque_ref"),
    "monarch.gradient": _from("danaus.tensor_engine.gradient"),
    "monarch.gradient_generator": _from("danaus.tensor_engine.gradient"),
    "monarch.parallel": _from("danaus.tensor_engine.pipelining"),
    "monarch.world_mesh": _from("danaus.tensor_engine"),
    "monarch.tools": _tools,
    "monarch.tools.commands": _commands,
    "monarch.tools.config": _tools_config,
    "monarch.tools.config.workspace": _tools_config,
    "monarch.tools.network": _from("danaus.monarch._network"),
    "monarch.tools.cli": _cli,
    "monarch.simulator": _only("danaus.tensor_engine", frozenset({"Simulator"})),
    "monarch.simulator.interface": _only("danaus.tensor_engine", frozenset({"Simulator"})),
    "monarch.fetch": _only(
        "danaus.tensor_engine",
        frozenset({"fetch_shard", "inspect", "show", "call_on_shard_and_fetch"}),
    ),
}


#: modules left out on purpose, with the reason the ImportError gives
_WHY_NOT = {
    "monarch.job.kubernetes": (
        "KubernetesJob is left out: no Kubernetes runs where danaus is tested (use "
        "SlurmJob, ProcessJob or LocalJob; see docs/jobs.md)"
    ),
    "monarch.job.meta": "MASTJob runs on MAST, Meta's internal scheduler",
    "monarch.gather_mount": (
        "remote mounts of the controller's files (FUSE) are not served; "
        "HostMesh.sync_workspace copies a directory to every host instead"
    ),
}


class _Module(types.ModuleType):
    """A ``monarch.*`` module whose names come from danaus, looked up on first use."""

    def __init__(self, name: str, lookup: Callable[[str], Any]) -> None:
        super().__init__(name, f"{name}, served by danaus (danaus.monarch)")
        object.__setattr__(self, "_lookup", lookup)
        # a package: its submodules import (or fail naming themselves, not "not a package")
        object.__setattr__(self, "__path__", [])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            value = self._lookup(name)
        except AttributeError:
            # ImportError, not AttributeError: `from monarch.actor import X` then says why.
            raise ImportError(
                f"danaus does not provide {self.__name__}.{name} (running a Monarch "
                f"program on danaus); see docs/monarch.md",
                name=self.__name__,
            ) from None
        object.__setattr__(self, name, value)
        return value

    def __reduce__(self) -> tuple[Callable[[str], types.ModuleType], tuple[str]]:
        # By name, as pickle and cloudpickle treat modules: the other side imports it
        # (served by danaus there too).
        return importlib.import_module, (self.__name__,)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__name__ == "monarch.actor" and name == "unhandled_fault_hook":
            import danaus

            danaus.unhandled_fault_hook = value  # read at fault time, as Monarch does
        object.__setattr__(self, name, value)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _MODULES:
            if fullname.startswith("monarch."):
                why = _WHY_NOT.get(fullname, "")
                raise ImportError(
                    f"danaus does not provide the module {fullname} (running a "
                    f"Monarch program on danaus){': ' + why if why else ''}",
                    name=fullname,
                )
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Module(spec.name, _MODULES[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        pass


_finder = _Finder()


def installed() -> bool:
    return _finder in sys.meta_path


def install() -> None:
    """Serve ``monarch``, ``monarch.actor``, ``monarch.rdma`` and ``monarch.config`` from
    danaus, here and in procs spawned from now on (through the environment)."""
    if not installed():
        sys.meta_path.insert(0, _finder)
        import danaus
        from danaus.mesh.seam import default_fault_hook, exit_on_fault

        if danaus.unhandled_fault_hook is default_fault_hook:
            # Monarch's default: an unhandled failure ends the program (exit status 1)
            danaus.unhandled_fault_hook = exit_on_fault
        if _PREFIX_LOGS not in os.environ:
            # Monarch's default (monarch.actor.config.prefix_python_logs_with_actor),
            # here and, through the environment, in procs
            os.environ[_PREFIX_LOGS] = "1"
            danaus.config.prefix_python_logs_with_actor = True
    hooks = [h for h in os.environ.get(ENV, "").split(",") if h]
    if _STARTUP not in hooks:
        os.environ[ENV] = ",".join([*hooks, _STARTUP])
