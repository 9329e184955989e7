"""The current job and named job contexts, kept in ``.monarch/`` of the working folder as
Monarch keeps them: ``danaus apply myjob.job`` records the spec, a later program (or
``danaus exec``) picks it up with :func:`load_current_job`.

Layout (Monarch's)::

    .monarch/job_state.pkl -> default/state.pkl   the active context's saved job (a link)
    .monarch/<context>/spec                       "module.attr" of the context's job spec
    .monarch/<context>/state.pkl                  the job saved when it was applied
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from pathlib import Path

from ..errors import a_type
from ._job import DEFAULT_JOB_PATH, JobTrait, job_load

__all__ = [
    "DEFAULT_JOB_PATH",
    "context_create",
    "context_ls",
    "context_rm",
    "context_use",
    "current_context",
    "current_spec",
    "load_current_job",
    "saved_job_file",
    "set_current_job",
]

_DIR = Path(DEFAULT_JOB_PATH).parent
_STATE = "state.pkl"
_SPEC = "spec"


def _context_dir(name: str) -> Path:
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"a context name is one plain folder name, not {name!r}")
    return _DIR / name


def current_context() -> str | None:
    """The name of the active context (what ``.monarch/job_state.pkl`` links to), if any."""
    link = Path(DEFAULT_JOB_PATH)
    if not link.is_symlink():
        return None
    target = Path(os.readlink(link))
    return target.parts[0] if len(target.parts) == 2 and target.parts[1] == _STATE else None


def saved_job_file(name: str | None = None) -> Path:
    """The file holding context ``name``'s saved job; with None, the active context's
    (what ``.monarch/job_state.pkl`` links to), or that file itself without contexts.

    Raises:
        ValueError: ``name`` is not a context.
    """
    if name is not None:
        if not _context_dir(name).is_dir():
            raise ValueError(f"no context named {name!r}")
        return _context_dir(name) / _STATE
    active = current_context()
    return _context_dir(active) / _STATE if active is not None else Path(DEFAULT_JOB_PATH)


def _link_to(name: str) -> None:
    """Make ``.monarch/job_state.pkl`` the link to ``name``'s saved job; a plain file
    left there (a job saved before contexts) becomes the ``default`` context's."""
    link = Path(DEFAULT_JOB_PATH)
    _context_dir(name).mkdir(parents=True, exist_ok=True)
    if link.exists() and not link.is_symlink():
        default = _context_dir("default")
        default.mkdir(parents=True, exist_ok=True)
        link.rename(default / _STATE)
    if link.is_symlink():
        link.unlink()
    link.symlink_to(Path(name) / _STATE)  # relative: .monarch/ may move


def _spec_file() -> Path:
    return _context_dir(current_context() or "default") / _SPEC


def set_current_job(module_path: str) -> None:
    """Record ``module_path`` (``"module.attr"``, a :class:`JobTrait` there) as the
    active context's job spec (the ``default`` context when none is active)."""
    _import_job(module_path)  # fail now, naming what is wrong, not in a later program
    if current_context() is None:
        _link_to("default")
    spec = _spec_file()
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(module_path + "\n")


def current_spec() -> str | None:
    """The active context's job spec (``"module.attr"``), if one was recorded."""
    try:
        return _spec_file().read_text().strip() or None
    except FileNotFoundError:
        return None


def load_current_job() -> JobTrait:
    """A fresh job object for the active context's spec (not applied: its ``state()``,
    with ``cached_path=DEFAULT_JOB_PATH``, reuses the job ``danaus apply`` saved).

    Raises:
        FileNotFoundError: no spec recorded (run ``danaus apply module.attr``).
    """
    module_path = current_spec()
    if module_path is None:
        raise FileNotFoundError(
            f"no job spec at {_spec_file()}: run 'danaus apply <module.attr>' first"
        )
    return _import_job(module_path)


def _import_job(module_path: str) -> JobTrait:
    mod_name, dot, attr = module_path.rpartition(".")
    if not dot or not mod_name or not attr:
        raise ValueError(f"a job spec is 'module.attr' (like myjob.job), not {module_path!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # the spec's module usually sits here
    module = importlib.import_module(mod_name)
    job = getattr(module, attr, None)
    if job is None:
        raise AttributeError(f"module {mod_name!r} has no {attr!r}")
    if not isinstance(job, JobTrait):
        raise TypeError(f"{module_path} is {a_type(job)}, not a job (a JobTrait)")
    return job


def context_create(name: str) -> None:
    """A new, empty context (``danaus context create NAME``)."""
    _context_dir(name).mkdir(parents=True, exist_ok=True)


def context_use(name: str) -> None:
    """Make ``name`` the active context.

    Raises:
        ValueError: there is no context ``name`` (``context_create`` makes one); the
            active context stays as it was.
    """
    if not _context_dir(name).is_dir():
        known = ", ".join(n for n, _ in context_ls()) or "none yet"
        raise ValueError(
            f"no context named {name!r} (its contexts: {known}); "
            f"'danaus context create {name}' makes it"
        )
    _link_to(name)


def context_rm(name: str) -> None:
    """Remove a context, ending its saved job if it still runs; if it was active, the
    ``default`` context becomes active."""
    state = _context_dir(name) / _STATE
    if state.exists():
        job_load(str(state)).kill()
    shutil.rmtree(_context_dir(name), ignore_errors=True)
    if current_context() == name:
        _link_to("default")


def context_ls() -> list[tuple[str, bool]]:
    """Every context, with whether it is the active one."""
    if not _DIR.is_dir():
        return []
    active = current_context()
    return [(d.name, d.name == active) for d in sorted(_DIR.iterdir()) if d.is_dir()]
