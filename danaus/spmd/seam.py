"""The SPMD layer's internal API: what the layers above it (whole-model parallelism, the
``danaus`` command) may use of it beyond ``danaus.spmd``. Everything else under
``danaus.spmd._*`` is private to it; ``lint-imports`` (``make lint``) checks it.
"""

from __future__ import annotations

from ._actor import proc_host
from ._run import launch_ranks, main_run

__all__ = ["launch_ranks", "main_run", "proc_host"]
