"""Checkpoints on disk that any plan can load: ``torch.distributed.checkpoint`` (DCP)
files of the model's own tensors, under the model's own names.

A checkpoint is a directory: DCP's files (``.metadata`` and one ``.distcp`` file per
rank that wrote) and ``danaus.json`` (the trainer's counts). Its tensors are whole,
as a plain model holds them, whatever the layout that wrote it:

- ``model.<name>``: each weight of the model's ``state_dict()`` (``transformer.h.0...``);
- ``optim.<name>.<key>``: the optimizer's state of parameter ``<name>`` (``exp_avg``,
  ``exp_avg_sq``, ``step`` for Adam), in the parameter's own shape.

Saving, the first replica's first tensor-parallel rank of each stage gathers its
stage's tensors whole and every such rank writes its own file, all at once (DCP's
collective save over the trainer's process group); a weight two stages share (GPT-2's
tied embedding) is written once. Loading, each rank reads only the tensors of the
stage it holds (whole) and cuts its own shard out of them, so that a checkpoint
written under one plan loads under any other, on any number of procs.
"""

from __future__ import annotations

import json
import os
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from ._errors import ROLLED_BACK

#: the trainer's counts beside DCP's files
META = "danaus.json"


def check(path: str | os.PathLike[str]) -> Path:
    """``path`` as an absolute path to a checkpoint this module wrote.

    Raises:
        FileNotFoundError: naming what is missing there.
    """
    p = Path(path).absolute()
    for need in (".metadata", META):
        if not (p / need).is_file():
            raise FileNotFoundError(
                f"{p} is no danaus checkpoint: it has no {need} (trainer.save(path) writes one)"
            )
    return p


def meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The trainer's counts a checkpoint keeps (``steps``, ``data_step``, ...)."""
    out: dict[str, Any] = json.loads((check(path) / META).read_text())
    return out


def write_meta(path: str | os.PathLike[str], counts: dict[str, Any]) -> None:
    """Write the trainer's counts (after the ranks wrote their tensors)."""
    tmp = Path(path) / f"{META}.tmp"
    tmp.write_text(json.dumps(counts, indent=1))
    tmp.replace(Path(path) / META)


def tensors(path: str | os.PathLike[str]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every tensor of a checkpoint: its key, shape and dtype (from DCP's metadata)."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = FileSystemReader(str(check(path))).read_metadata()
    return {
        k: (tuple(v.size), v.properties.dtype)
        for k, v in md.state_dict_metadata.items()
        if isinstance(v, TensorStorageMetadata)
    }


def check_model(path: str | os.PathLike[str], model: torch.nn.Module) -> None:
    """Raise where the checkpoint at ``path`` cannot load into ``model``: a weight it
    lacks (KeyError: a partial one says so) or holds in another shape (ValueError),
    naming it."""
    counts = meta(path)
    if counts.get("partial"):
        lacks = [str(k) for k in counts.get("missing", [])]
        raise KeyError(
            f"the checkpoint at {check(path)} is partial: a trainer wrote what survived "
            f"after losing procs whose state no copy held, and it lacks {', '.join(lacks[:3])}"
            f"{f' (and {len(lacks) - 3} more)' if len(lacks) > 3 else ''}: no trainer "
            "resumes it (danaus.parallel.load_state_dict reads the weights it has)"
        )
    have = tensors(path)
    for name, t in model.state_dict().items():
        key = f"model.{name}"
        if key not in have:
            raise KeyError(
                f"the checkpoint at {check(path)} has no {key}: it was written for "
                f"another model than this {type(model).__name__}"
            )
        if have[key][0] != tuple(t.shape):
            raise ValueError(
                f"the checkpoint at {check(path)} holds {key} as {have[key][0]}; this "
                f"{type(model).__name__} has it {tuple(t.shape)}: another model's checkpoint"
            )


def read(
    path: str | os.PathLike[str],
    keys: list[str],
    have: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors ``keys`` of a checkpoint, whole, on the CPU; this process reads only
    those (no process group needed). ``have``: its :func:`tensors`, where the caller
    read them already.

    Raises:
        KeyError: a key the checkpoint does not have, naming it.
    """
    from torch.distributed.checkpoint.state_dict_loader import load

    have = tensors(path) if have is None else have
    missing = [k for k in keys if k not in have]
    if missing:
        raise KeyError(
            f"the checkpoint at {check(path)} has no {', '.join(missing[:5])}"
            f"{f' (and {len(missing) - 5} more)' if len(missing) > 5 else ''}: "
            "it was written for another model"
        )
    out = {k: torch.empty(have[k][0], dtype=have[k][1]) for k in keys}
    if out:
        with warnings.catch_warnings():  # (that it reads in this process alone: it is meant to)
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            load(out, checkpoint_id=str(check(path)), no_dist=True)
    return out


def bytes_by_rank(path: str | os.PathLike[str]) -> dict[int, int]:
    """The bytes each rank wrote into the checkpoint at ``path`` (DCP's
    ``__<rank>_<n>.distcp`` files)."""
    out: dict[int, int] = {}
    for f in Path(path).glob("__*_*.distcp"):
        rank = int(f.name[2:].split("_", 1)[0])
        out[rank] = out.get(rank, 0) + f.stat().st_size
    return out


def save(path: str | os.PathLike[str], state: dict[str, torch.Tensor], alone: bool = False) -> None:
    """Write this rank's ``state`` (whole tensors; empty on ranks that hold nothing of
    their own) into the checkpoint at ``path``: a collective over the default process
    group, every rank of the trainer taking part; or (``alone``) from this process by
    itself (a re-plan's whole tensors, built on the controller).

    Raises:
        OSError (or what the failing rank's write raised): DCP gathers every rank's
            outcome, so every rank raises, the first failing rank's error with a note
            naming the ranks that failed and :data:`ROLLED_BACK` (the trainer goes on).
    """
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    try:
        with warnings.catch_warnings():  # (that it writes in this process alone: it is meant to)
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp_save(state, checkpoint_id=str(path), no_dist=alone)
    except CheckpointException as e:  # (a BaseException: it must not end the actor)
        ranks = sorted(e.failures)
        first, trace = e.failures[ranks[0]] if ranks else (None, None)
        error = first if isinstance(first, Exception) else OSError(str(e))
        where = "".join(traceback.format_list(trace)) if trace else ""
        error.add_note(
            f"the checkpoint at {path} could not be written by rank(s) {ranks}; "
            f"rank {ranks[0] if ranks else '?'} raised it at:\n{where}"
        )
        error.add_note(ROLLED_BACK)
        raise error from None


def write_whole(
    path: str | os.PathLike[str], state: dict[str, torch.Tensor], counts: dict[str, Any]
) -> None:
    """Write a checkpoint of whole tensors built in this process (a re-plan's, or what
    survived a loss), and the trainer's counts beside them."""
    save(path, state, alone=True)
    write_meta(path, counts)


def load_state_dict(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The model's ``state_dict`` from a checkpoint ``trainer.save(path)`` wrote, under
    any plan: it loads into a plain copy of the model (``model.load_state_dict``). Of a
    partial one (what survived a loss no copy covered), the weights it has (its
    ``danaus.json`` lists what it lacks: load with ``strict=False``).

    Raises:
        FileNotFoundError: ``path`` is no danaus checkpoint.
    """
    keys = [k for k in tensors(path) if k.startswith("model.")]
    return {k.removeprefix("model."): v for k, v in read(path, keys).items()}
