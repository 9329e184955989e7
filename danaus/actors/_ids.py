"""Identities as values: :class:`Uid` and :class:`ProcId` (Monarch's ``monarch.actor``
names for them).

A uid is either a *singleton*, known by its name alone (``"procs[1]"``, the proc ids
``context().actor_instance.proc_id`` gives), or an *instance*: fresh, 64 random bits,
with an optional label for people to read. Their text is canonical and parses back::

    >>> u = Uid.instance("trainer")
    >>> Uid.from_string(str(u)) == u
    True
    >>> str(Uid.from_string("procs[1]"))
    'procs[1]'
"""

from __future__ import annotations

import re
import secrets

__all__ = ["ProcId", "Uid"]

#: an instance uid's text: ``label<hex>`` or ``<hex>``
_INSTANCE = re.compile(r"^([^<>\s]*)<([0-9a-f]{16})>$")


class Uid:
    """A unique identity (Monarch's ``Uid``): :meth:`instance` or :meth:`anonymous` for a
    fresh one, :meth:`from_string` for a known one. Immutable, hashable, picklable."""

    __slots__ = ("_label", "_nonce")

    def __init__(self, label: str | None, nonce: str | None) -> None:
        self._label, self._nonce = label, nonce

    @staticmethod
    def anonymous() -> Uid:
        """A fresh instance uid with no label."""
        return Uid(None, secrets.token_hex(8))

    @staticmethod
    def instance(label: str | None = None) -> Uid:
        """A fresh instance uid, labelled ``label`` for display."""
        if label is not None:
            _check_label(label)
        return Uid(label or None, secrets.token_hex(8))

    @staticmethod
    def from_string(uid: str) -> Uid:
        """The uid whose text is ``uid`` (``ValueError`` when it is not one)."""
        if not isinstance(uid, str):
            raise TypeError(f"Uid.from_string takes a str, not {type(uid).__name__}")
        m = _INSTANCE.match(uid)
        if m:
            return Uid(m.group(1) or None, m.group(2))
        _check_label(uid)
        return Uid(uid, None)

    @property
    def label(self) -> str | None:
        return self._label

    @property
    def is_instance(self) -> bool:
        return self._nonce is not None

    @property
    def is_singleton(self) -> bool:
        return self._nonce is None

    def __str__(self) -> str:
        if self._nonce is None:
            return self._label or ""
        return f"{self._label or ''}<{self._nonce}>"

    def __repr__(self) -> str:
        return f"Uid({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Uid):
            return NotImplemented
        if self._nonce is not None or other._nonce is not None:
            return self._nonce == other._nonce  # the random part is the identity
        return self._label == other._label

    def __hash__(self) -> int:
        return hash(self._nonce if self._nonce is not None else ("singleton", self._label))

    def __reduce__(self) -> tuple[object, ...]:
        return (Uid.from_string, (str(self),))


class ProcId:
    """The identity of a proc (Monarch's ``ProcId``): a :class:`Uid`. danaus names its
    procs as singletons (``ProcId.from_string(context().actor_instance.proc_id)``)."""

    __slots__ = ("_uid",)

    def __init__(self, uid: Uid) -> None:
        if not isinstance(uid, Uid):
            raise TypeError(f"ProcId takes a Uid, not {type(uid).__name__}")
        self._uid = uid

    @staticmethod
    def from_string(proc_id: str) -> ProcId:
        return ProcId(Uid.from_string(proc_id))

    @property
    def uid(self) -> Uid:
        return self._uid

    @property
    def label(self) -> str | None:
        return self._uid.label

    def __str__(self) -> str:
        return str(self._uid)

    def __repr__(self) -> str:
        return f"ProcId({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProcId):
            return NotImplemented
        return self._uid == other._uid

    def __hash__(self) -> int:
        return hash(("proc", self._uid))

    def __reduce__(self) -> tuple[object, ...]:
        return (ProcId.from_string, (str(self),))


def _check_label(label: str) -> None:
    if not label or "<" in label or ">" in label or any(c.isspace() for c in label):
        raise ValueError(
            f"not a uid: {label!r} (a name is non-empty text with no '<', '>' or spaces; an "
            "instance uid reads 'label<16 hex digits>')"
        )
