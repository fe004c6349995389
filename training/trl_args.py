"""A TRL trainer config (`SFTConfig`, `GRPOConfig`), and the peft `LoraConfig` beside it, built from a config
section's arguments, as given, under their owners' names: TRL, transformers and peft check them, and a refusal names
the file, the section's key and their message."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from cupid.common.config import ConfigError


def lora_config(given: dict[str, Any], source: str) -> Any:
    """peft's `LoraConfig` of a causal LM's adapter from a `lora:` section's arguments; peft refuses an unknown one
    itself, and the ConfigError names the file."""
    from peft import LoraConfig

    try:
        return LoraConfig(**given, task_type="CAUSAL_LM")
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source}: lora: peft's LoraConfig refuses it: {e}") from None


def build(
    config_class: type,
    section: str,
    given: dict[str, Any],
    *,
    defaults: dict[str, Any],
    owned: dict[str, Any],
    source: str,
) -> Any:
    """`config_class(**defaults, **given, **owned)`: `given` over this project's `defaults`, and `owned` (what the
    caller sets itself). An unknown argument, a value of another type than the class declares, or a value TRL or
    transformers refuse, is a ConfigError naming `source` and `<section>.<key>`. Building it writes nothing."""
    _check_declared_types(config_class, section, given, source)
    args = {**defaults, **given}

    def make(arguments: dict[str, Any]) -> Any:
        return config_class(**arguments, **owned)

    try:
        return make(args)
    except (TypeError, ValueError) as e:
        unknown = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        if isinstance(e, TypeError) and unknown:
            raise ConfigError(
                f"{source}: {section}.{unknown[1]}: not an argument of TRL's {config_class.__name__} ({e})"
            ) from None
        keys, refusal = _refused(make, args, list(given), e)
        named = ", ".join(f"{section}.{key}" for key in keys) or section
        raise ConfigError(f"{source}: {named}: TRL/transformers refuse it: {refusal}") from None


def _check_declared_types(config_class: type, section: str, given: dict[str, Any], source: str) -> None:
    """Each given argument against the type the config class declares for it, strictly (nothing converted). TRL's
    configs check no types themselves: `learning_rate: 1e-4`, text to YAML (no dot), would pass and fail in the
    optimizer, after the model is loaded. A key the class does not declare is left to it, which refuses it by name."""
    import typing

    from pydantic import TypeAdapter, ValidationError

    try:
        declared = typing.get_type_hints(config_class)
    except Exception:  # noqa: BLE001 (a TRL whose annotations do not resolve here: its own checks remain)
        return
    for key, value in given.items():
        if key not in declared:
            continue
        try:
            TypeAdapter(declared[key]).validate_python(value, strict=True)
        except ValidationError:
            kind = declared[key]
            name = kind.__name__ if isinstance(kind, type) else str(kind).replace("typing.", "")
            hint = ""
            if isinstance(value, str) and (number := re.fullmatch(r"([-+]?\d+)([eE][-+]?\d+)", value)):
                hint = f" (YAML reads {value}, without a dot, as text: write {number[1]}.0{number[2]})"
            raise ConfigError(
                f"{source}: {section}.{key}: TRL's {config_class.__name__} declares {name}, not {value!r}{hint}"
            ) from None
        except Exception:  # noqa: BLE001, S112 (a declared type pydantic cannot check: its own checks remain)
            continue


def _refused(
    build: Callable[[dict[str, Any]], Any], args: dict[str, Any], given: list[str], error: Exception
) -> tuple[list[str], Exception]:
    """The given keys the config class's refusal (`error`) is about: those without which it builds (two that conflict
    are both named); failing that (several wrong at once), the first, in the config's order, with which it stops
    building, and that refusal."""

    def refusal(arguments: dict[str, Any]) -> Exception | None:
        try:
            build(arguments)
        except (TypeError, ValueError) as e:
            return e
        return None

    if named := [key for key in given if refusal({k: v for k, v in args.items() if k != key}) is None]:
        return named, error
    kept = {k: v for k, v in args.items() if k not in given}
    for key in given:
        kept[key] = args[key]
        if (e := refusal(kept)) is not None:
            return [key], e
    return [], error
