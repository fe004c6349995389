"""Write the guide's two references from their sources, so that they cannot drift from the code:
docs/reference/configuration.md from the pydantic models' field descriptions (what `extra="forbid"` holds a YAML file
to), docs/reference/cli.md from the `cupid` command itself (typer's commands, arguments and options).

    python scripts/docs_reference.py            # rewrite both pages
    python scripts/docs_reference.py --check    # exit 1, naming the page, when one differs from what it would write

A field or a command without its line of help is an error here, named, not a blank cell: tests/test_docs.py runs
`problems()` and `pages()` against the committed pages."""

from __future__ import annotations

import enum
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

REPO = Path(__file__).resolve().parents[1]
CONFIG_PAGE = Path("docs/reference/configuration.md")
CLI_PAGE = Path("docs/reference/cli.md")


def _models() -> list[tuple[str, str, type[BaseModel]]]:
    """Each configuration file's model: its heading, where such files live and what reads them, and the model."""
    from cupid.eval.benchmark.runner import RunConfig
    from cupid.eval.workflows.nightly import NightlyConfig
    from cupid.serving.endpoint import Endpoint
    from cupid.serving.servers.profiles import Profile
    from cupid.training.config import GrpoRunConfig, TrainConfig
    from cupid.training.synth.config import SynthConfig

    return [
        ("Run", "`configs/eval/*.yaml`: `cupid eval run --config FILE` (an option overrides its field)", RunConfig),
        ("Endpoint", "each entry of `configs/endpoints.yaml`: a name and these fields", Endpoint),
        ("Serve profile", "`configs/serve/NAME.yaml`: `cupid serve up --profile NAME`, a run's `serve:`", Profile),
        ("Nightly", "`configs/eval/nightly*.yaml`: `cupid nightly --config FILE`", NightlyConfig),
        ("Training recipe", "`configs/train/*.yaml`: `cupid train run --config FILE`", TrainConfig),
        ("GRPO recipe", "`configs/train/grpo-*.yaml`: `cupid train grpo --config FILE`", GrpoRunConfig),
        ("Synthesis", "`configs/synth/*.yaml`: `cupid synth --config FILE`", SynthConfig),
    ]


def _nested(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's type holds (a section, a list of them, a model among a union's members)."""
    found, stack = [], [annotation]
    while stack:
        kind = stack.pop()
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            found.append(kind)
        stack += typing.get_args(kind)
    return found


def _type(annotation: Any) -> str:
    """A field's type in a reader's words: `str or None`, `list[int]`, `"a" / "b"`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " / ".join(f'"{a}"' for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "its defaults"
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value!r}`" if value not in ({}, [], None) else ("`null`" if value is None else f"`{value!r}`")


def _help(model: type[BaseModel], name: str) -> str:
    """A field's line: its description, or for a section (a field that is a model) its docstring's first sentence."""
    field = model.model_fields[name]
    if field.description:
        return field.description
    nested = _nested(field.annotation)
    if len(nested) == 1 and nested[0].__doc__:
        return re.split(r"(?<=[.:])\s", " ".join(nested[0].__doc__.split()), maxsplit=1)[0].rstrip(":.")
    return ""


def _fields(model: type[BaseModel]) -> list[str]:
    return [name for name, field in model.model_fields.items() if not field.exclude]


def _cell(text: str) -> str:
    """One table cell: one line, its pipes escaped, and outside code spans its `<...>` shown, not read as HTML."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def config_problems() -> list[str]:
    problems, seen = [], set()
    todo = [model for _, _, model in _models()]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name in _fields(model):
            if not _help(model, name):
                problems.append(f"{model.__module__}.{model.__name__}.{name}: no description")
            todo += _nested(model.model_fields[name].annotation)
    return problems


INTRO = """Every file is checked when it is read: an unknown key is refused with the file and the key, a wrong value
with the field and what it takes. A section (a field whose value is a mapping of its own fields) is listed after its
file, as `section.field`. Where a section is another library's configuration under its own names (`sft:`, `lora:`,
`quantization:`, `grpo:`, a profile's `vllm:`), only this project's own fields are listed here: that library's own
parser checks the rest, by name."""


def config_page() -> str:
    out = [
        "# Configuration reference",
        "",
        "<!-- Written by scripts/docs_reference.py from the pydantic models' field descriptions; do not edit. -->",
        "",
        INTRO,
        "",
    ]
    for title, where, model in _models():
        out += [f"## {title}", "", f"{where}. {_cell(model.__doc__ or '')}".strip(), ""]
        queue: list[tuple[str, type[BaseModel]]] = [("", model)]
        done: set[type[BaseModel]] = set()
        while queue:
            prefix, current = queue.pop(0)
            if current in done:
                continue
            done.add(current)
            if prefix:
                out += [f"### `{prefix}`", "", _cell(current.__doc__ or ""), ""]
            out += ["| field | type | default | what it is |", "|---|---|---|---|"]
            for name in _fields(current):
                field = current.model_fields[name]
                out.append(
                    f"| `{name}` | {_cell(_type(field.annotation))} | {_cell(_default(field))} | "
                    f"{_cell(_help(current, name))} |"
                )
                queue += [(f"{prefix}{name}.", nested) for nested in _nested(field.annotation)]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _commands(command: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    found = [(path, command)]
    if hasattr(command, "commands"):
        for name, sub in sorted(command.commands.items()):
            found += _commands(sub, [*path, name])
    return found


def _root() -> Any:
    from typer.main import get_command

    from cupid.cli import app

    return get_command(app)


def _params(command: Any) -> list[Any]:
    return [p for p in command.params if p.name != "help"]


def cli_problems() -> list[str]:
    problems = []
    for path, command in _commands(_root(), ["cupid"]):
        if not (command.help or "").strip():
            problems.append(f"{' '.join(path)}: no help")
        for param in _params(command):
            if not (getattr(param, "help", None) or "").strip():
                problems.append(f"{' '.join(path)} {param.opts[0]}: no help")
    return problems


def _usage(path: list[str], command: Any) -> str:
    context = command.context_class(command, info_name=" ".join(path))
    pieces = " ".join(command.collect_usage_pieces(context)).strip()
    return re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(), pieces)  # typer's `{run_a}`: RUN_A, as the table names it


def cli_page() -> str:
    out = [
        "# CLI reference",
        "",
        "<!-- Written by scripts/docs_reference.py from the `cupid` command itself; do not edit. -->",
        "",
        "Every command exits 0 when done, 1 when the work failed, 2 on a usage, configuration or input error, 4 on a",
        "regression and 8 on no verdict ([Troubleshooting](../troubleshooting.md) lists each error and its code).",
        "`cupid COMMAND --help` prints the same as this page.",
        "",
    ]
    for path, command in _commands(_root(), ["cupid"]):
        name = " ".join(path)
        out += [f"## `{name}`", "", "```text", f"{name} {_usage(path, command)}".rstrip(), "```", ""]
        out += [_cell(command.help or ""), ""]
        if hasattr(command, "commands"):
            subs = ", ".join(f"[`{name} {s}`](#{'-'.join([*path, s])})" for s in sorted(command.commands))
            out += [f"Commands: {subs}.", ""]
        params = _params(command)
        if params:
            out += ["| argument or option | type | default | what it does |", "|---|---|---|---|"]
            for param in params:
                names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
                if param.param_type_name == "argument":
                    names = f"`{param.name.upper()}`" + (" (repeatable)" if param.nargs == -1 else "")
                annotation = getattr(getattr(param, "type_descriptor", None), "annotation", str)
                kind = "flag" if getattr(param, "is_flag", False) else _type(annotation)
                if getattr(param, "multiple", False):
                    kind += ", repeatable"
                default = (
                    ""
                    if param.default is None or param.default is False or param.default == ()
                    else f"`{param.default}`"
                )
                default = "required" if param.required else default
                out.append(
                    f"| {names} | {_cell(kind)} | {_cell(str(default))} | {_cell(getattr(param, 'help', '') or '')} |"
                )
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def problems() -> list[str]:
    return config_problems() + cli_problems()


def pages() -> dict[Path, str]:
    return {CONFIG_PAGE: config_page(), CLI_PAGE: cli_page()}


def main(argv: list[str]) -> int:
    if found := problems():
        print("\n".join(found), file=sys.stderr)
        return 1
    stale = []
    for path, text in pages().items():
        target = REPO / path
        if "--check" in argv:
            if not target.exists() or target.read_text() != text:
                stale.append(str(path))
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)} (python scripts/docs_reference.py rewrites them)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
