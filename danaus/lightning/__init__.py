"""PyTorch Lightning on danaus meshes: ``Trainer(strategy=DanausStrategy(procs))``.

::

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    trainer = lightning.Trainer(strategy=DanausStrategy(procs), accelerator="cpu", devices=4)
    trainer.fit(module, dataloader)       # every proc a rank of Lightning's own DDP

With a plan (``plan="auto"``, a ``danaus.parallel.Plan``, or dims: ``dp=2, pp=2``), the
module's model is trained in that layout by ``danaus.parallel`` (pipelines included),
driven by the Lightning loop in this process. Installed with the ``lightning`` extra
(``pip install 'danaus[lightning]'``). Importing this package imports torch and
Lightning.
"""

from __future__ import annotations

try:
    import lightning  # noqa: F401
except ImportError as e:  # an extra: nothing else in danaus needs it
    raise ImportError(
        f"danaus.lightning needs Lightning ({e}): `pip install 'danaus[lightning]'`"
    ) from e

from ._strategy import DanausStrategy

__all__ = ["DanausStrategy"]
