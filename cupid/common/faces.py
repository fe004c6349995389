"""A room's face: its `__init__` names what the rest of the package uses of it, and each name is imported from its
module on first use, so that importing a room (a server process importing `cupid.serving`) stays light."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's `__getattr__` (a name of `exports`, from its module) and `__dir__` (its names and the exports,
    so tab completion finds them before their first use)."""

    def getattr_(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(importlib.import_module(package), name, value)  # asked once
        return value

    def dir_() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *exports})

    return getattr_, dir_
