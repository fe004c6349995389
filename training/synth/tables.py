"""The data files of the pipeline: attribute tables (paper Tables 5 and 7), seed personas, examples."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from cupid.common.config import ConfigError, read_yaml, validate

DATA = resources.files(__package__) / "data"


class Attributes(BaseModel):
    model_config = ConfigDict(extra="forbid")
    career_levels: list[str] = Field(min_length=1)
    personality_traits: dict[str, str] = Field(min_length=2)
    trait_levels: list[str] = Field(min_length=1)
    personal_values: dict[str, str] = Field(min_length=2)
    decision_styles: dict[str, str] = Field(min_length=1)
    factor_types: list[str] = Field(min_length=7)
    preference_types: dict[str, list[str]]
    task_types: list[str] = Field(min_length=2)

    @property
    def all_preference_types(self) -> list[str]:
        return [t for types in self.preference_types.values() for t in types]


class Seed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    occupation: str = Field(min_length=1)
    description: str = Field(min_length=1)


@dataclass(frozen=True)
class Seeds:
    """Seed descriptions grouped by occupation, in file order."""

    by_occupation: dict[str, list[str]]
    digest: str

    @property
    def occupations(self) -> list[str]:
        return list(self.by_occupation)


def _text(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


@cache
def attributes() -> Attributes:
    return validate(Attributes, yaml.safe_load(_text("attributes.yaml")), "training/synth/data/attributes.yaml")


@cache
def examples() -> dict[str, Any]:
    return yaml.safe_load(_text("examples.yaml"))


def load_seeds(path: str | None) -> Seeds:
    if path is None:
        text, where = _text("seed_personas.yaml"), "training/synth/data/seed_personas.yaml"
        rows = yaml.safe_load(text)
    else:
        where = path
        text = Path(path).read_text(encoding="utf-8") if Path(path).is_file() else ""
        rows = read_yaml(path)
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{where}: expected a non-empty YAML list of {{occupation, description}}")
    grouped: dict[str, list[str]] = {}
    for i, row in enumerate(rows):
        seed = validate(Seed, row, f"{where}: entry {i}")
        grouped.setdefault(seed.occupation.strip(), []).append(seed.description.strip())
    return Seeds(grouped, hashlib.sha256(text.encode()).hexdigest()[:12])


def digest() -> str:
    """Short hash of the bundled tables and examples, recorded with a run."""
    return hashlib.sha256((_text("attributes.yaml") + _text("examples.yaml")).encode()).hexdigest()[:12]
