"""Run an unmodified Monarch program on danaus: ``python -m danaus.monarch prog.py args``.

:func:`install` makes ``import monarch.actor`` (and ``monarch.rdma``, ``monarch`` itself
for the tensor-engine names) resolve to danaus, for this process and the procs it spawns,
without installing a package named ``monarch``: a real torchmonarch in the environment is
untouched unless this runner (or :func:`install`) is used. A name danaus lacks fails at
import with an ``ImportError`` naming it.
"""

from __future__ import annotations

from ._hook import ENV, install, installed

__all__ = ["ENV", "install", "installed"]
