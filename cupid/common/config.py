"""YAML configs validated with pydantic, with errors that name the file, the entry and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

# `track:`: the tracker a run or a night is logged to once it ends. A config value every layer reads (the runner's
# config, the night's, the tracker that logs them), so it sits here, below all of them.
Tracker = Literal["mlflow", "wandb"]

T = TypeVar("T", bound=BaseModel)

# The shipped defaults (`configs/...`): beside the subpackages in an installed `cupid` (this file is
# cupid/common/config.py, the configs cupid/configs/), at the top of a checkout (<repo>/cupid/common/config.py,
# <repo>/configs/).
SHIPPED = next((p for p in Path(__file__).resolve().parents[1:3] if (p / "configs").is_dir()), Path.cwd())


class ConfigError(ValueError):
    pass


def describe(error: ValidationError, where: str) -> str:
    lines = [f"{where}: {len(error.errors())} invalid field(s)"]
    for e in error.errors():
        field = ".".join(str(part) for part in e["loc"]) or "(entry)"
        lines.append(f"  {field}: {e['msg']}")
    return "\n".join(lines)


def locate(path: str | Path) -> Path:
    """A config path as the user gave it when it exists (a file in the working directory overrides the shipped
    one), else the shipped default of that relative name (`configs/serve/tiny.yaml` works from any directory);
    else as given, so that the error names what the user wrote."""
    path = Path(path)
    if path.exists() or path.is_absolute() or not (SHIPPED / path).exists():
        return path
    return SHIPPED / path


def read_yaml(path: str | Path) -> Any:
    path = locate(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None


def validate(model: type[T], data: Any, where: str, context: dict[str, Any] | None = None) -> T:
    try:
        return model.model_validate(data, context=context)
    except ValidationError as e:
        raise ConfigError(describe(e, where)) from None


def load_model(model: type[T], path: str | Path) -> T:
    return validate(model, read_yaml(path), str(path))
