"""Remote functions for every proc of the active mesh (Monarch's ``monarch.builtins``):
``log_remote("step %d", 3)`` logs on each proc, ``set_logging_level_remote(logging.INFO)``
sets the level of that logger there. Call them inside ``procs.activate()``."""

from __future__ import annotations

import logging

from . import remote

__all__ = ["log_remote", "set_logging_level_remote"]

#: the logger these functions use on the procs
logger = logging.getLogger("danaus.builtins")


def _nothing(*args: object, **kwargs: object) -> None:
    """What the controller learns of a call's outputs: there are none."""
    del args, kwargs


def _log(*args: object, level: int = logging.WARNING, **kwargs: object) -> None:
    logger.log(level, *args, **kwargs)  # type: ignore[arg-type]


def _set_level(level: int) -> None:
    logger.setLevel(level)


#: ``logger.log(level, msg, *args)`` on every proc of the active mesh
log_remote = remote(_log, propagate=_nothing)
#: set the level of :data:`logger` on every proc of the active mesh
set_logging_level_remote = remote(_set_level, propagate=_nothing)
