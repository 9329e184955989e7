"""An actor that imports a module of a synced workspace."""

from __future__ import annotations

import importlib

from danaus import Actor, endpoint


class User(Actor):
    @endpoint
    def value(self, module: str) -> tuple[object, str]:
        mod = importlib.import_module(module)
        return mod.VALUE, str(mod.__file__)
