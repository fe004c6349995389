"""YAML configs validated with pydantic, with errors that name the file, the entry and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

T = TypeVar("T", bound=BaseModel)


class ConfigError(ValueError):
    pass


def describe(error: ValidationError, where: str) -> str:
    lines = [f"{where}: {len(error.errors())} invalid field(s)"]
    for e in error.errors():
        field = ".".join(str(part) for part in e["loc"]) or "(entry)"
        lines.append(f"  {field}: {e['msg']}")
    return "\n".join(lines)


def read_yaml(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None


def validate(model: type[T], data: Any, where: str) -> T:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe(e, where)) from None


def load_model(model: type[T], path: str | Path) -> T:
    return validate(model, read_yaml(path), str(path))
