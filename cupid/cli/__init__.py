"""The `cupid` command: every command in this package, each a thin call into the library (no library module imports
typer), one module per command or command group.

Each command is imported when it is called (`COMMANDS`, as vLLM's CLI maps its commands to modules): `cupid
--version` and `cupid --help` load only what they print, not the library behind every command.

A user's mistake (a file that is missing or malformed, a config the library refuses, an input that is not what it
should be, an output that cannot be written) is one line on stderr and exit 2, whichever command met it
(`errors.CupidGroup`)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import click
import typer
from typer.core import TyperOption

from cupid.cli.errors import CupidGroup
from cupid.common import install
from cupid.common.verbosity import set_verbosity
from cupid.common.verbosity import verbose as verbose_set

_value_shown = TyperOption.display_type_rich


def _flag_takes_no_value(self: TyperOption, ctx):  # type: ignore[no-untyped-def]
    """A flag is given bare (`--dry-run`): typer 0.29 shows its type as a value (`--dry-run <bool>`), which reads as
    if it took one."""
    return None if self.is_flag else _value_shown(self, ctx)


TyperOption.display_type_rich = _flag_takes_no_value  # type: ignore[method-assign]


@dataclass(frozen=True)
class Command:
    """One command: where it is defined (`module:attribute`, a typer app for a group or a command's function) and its
    line in `cupid --help`, given here so that listing the commands imports none of them (tests/test_cli_lazy.py keeps
    the line equal to the command's own help)."""

    target: str
    help: str

    def load(self, name: str) -> click.Command:
        """The click command, made as typer makes a command registered on the root app."""
        module, attribute = self.target.split(":")
        found = getattr(importlib.import_module(module), attribute)
        holder = typer.Typer()
        if isinstance(found, typer.Typer):
            holder.add_typer(found, name=name)
        else:
            holder.command(name)(found)
        return typer.main.get_group(holder).commands[name]


# The commands in the order `cupid --help` lists them. A new command: its module, and one entry here.
COMMANDS = {
    "synth": Command(
        "cupid.cli.synth:main",
        "Synthesize new CUPID-style instances (personas -> factors -> 13 sessions -> dialogues -> instances); a run "
        "resumes where it stopped, and its last line counts finished and failed personas.",
    ),
    "demo": Command(
        "cupid.cli.demo:main",
        "Serve the tiny model on CPU (vLLM's CPU build), run both tasks on the bundled sample, print the tables, stop "
        "the server it started. State goes under CUPID_HOME (else .cupid/ here), the run into --out.",
    ),
    "doctor": Command(
        "cupid.cli.doctor:main",
        "The torch and vLLM builds, transformers, the training stack, trackers, GPU; what is missing for which command "
        "and the extra that brings it (exit 0: a missing extra breaks nothing). Exit 1 where the install is broken "
        "(torch's companions built for another torch) and not fixed.",
    ),
    "report": Command(
        "cupid.cli.report:main",
        "One self-contained HTML report (tables with 95% intervals, failures, Fig. 3-5) plus the PNG plots.",
    ),
    "view": Command(
        "cupid.cli.view:main",
        "One self-contained HTML page to look inside runs: every unit, its history, answer, checklist labels and "
        "scores.",
    ),
    "compare": Command(
        "cupid.cli.compare:main",
        "B against A on the units both runs ran (the candidate's own failures as no answer): each figure's difference "
        "with a paired 95% interval over personas, p-values (Holm-adjusted), the power to detect a change, and the "
        "units that changed most. A verdict only on the same evaluation (same tasks, units, data, judges and "
        "prompts), unless accepted by name.",
    ),
    "nightly": Command(
        "cupid.cli.nightly:main",
        "Run the nightly suite; leaderboard with change since the previous night; exit the sum of the night's "
        "outcomes: 1 failures, 4 a regression, 8 no verdict (2: a usage or configuration error).",
    ),
    "track": Command(
        "cupid.cli.track:main",
        "Log finished runs to an experiment tracker from their files; a run logged before updates its tracker run.",
    ),
    "import-inspect": Command(
        "cupid.cli.import_inspect:main",
        "Turn inspect-ai logs of the cupid/* tasks into a run directory (`cupid view`, `report`, `track`).",
    ),
    "serve": Command("cupid.cli.serve:app", "Start, inspect and stop local OpenAI-compatible model servers."),
    "eval": Command("cupid.cli.eval:app", "Evaluate models on CUPID."),
    "meta": Command("cupid.cli.meta:app", "Meta-evaluation: matcher agreement and model-wise correlation."),
    "train": Command(
        "cupid.cli.train:app", "Rebuild the PrefMatcher judge: match data, QLoRA fine-tune, export, agreement."
    ),
}


class Loaded(MutableMapping[str, click.Command]):
    """The root's commands by name: every name of `COMMANDS` is there, and a command's module is imported the first
    time the command is looked up (typer reads `commands` directly: its "did you mean" names all of them)."""

    def __init__(self) -> None:
        self.made: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self.made:
            self.made[name] = COMMANDS[name].load(name)
        return self.made[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self.made[name] = command

    def __delitem__(self, name: str) -> None:
        del self.made[name]

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(COMMANDS), **self.made})

    def __len__(self) -> int:
        return len(set(COMMANDS) | set(self.made))

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS or name in self.made


class Cupid(CupidGroup):
    """The root group: its commands load when called (`Loaded`); its help lists them from `COMMANDS` alone."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = Loaded()
        self.listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # the names alone (typer's own reads each command)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if self.listing and cmd_name in COMMANDS:  # a line of `cupid --help`: the name and its help, nothing imported
            return click.Command(cmd_name, help=COMMANDS[cmd_name].help)
        return super().get_command(ctx, cmd_name)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False


app = typer.Typer(
    cls=Cupid,
    no_args_is_help=True,
    add_completion=False,
    help="Local, cost-free evaluation for the CUPID benchmark. Exit codes: 0 done; 1 the work failed (failed units, "
    "a server that did not start); 2 a usage, configuration or input error; 4 a regression, 8 no verdict "
    "(`compare --fail-if-regression`; a night's code is the sum of its outcomes).",
)


def _version(value: bool) -> None:
    if value:
        found = install.version(install.DISTRIBUTION)
        typer.echo(f"cupid {found}" if found else "cupid (not installed: run from a checkout)")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="show the traceback of an error (also CUPID_DEBUG=1)"),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print the installed version and exit"
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="a progress line for every unit, and each retried request (CUPID_VERBOSITY=1)"
    ),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="no progress: results, warnings and errors only (CUPID_VERBOSITY=-1)"
    ),
) -> None:
    """Local, cost-free evaluation for the CUPID benchmark."""
    if debug:
        os.environ["CUPID_DEBUG"] = "1"
    if verbose and quiet:
        raise typer.BadParameter("--verbose and --quiet: one or the other", param_hint="--verbose/--quiet")
    if verbose or quiet:
        set_verbosity(1 if verbose else -1)
    elif verbose_set():  # by a parent command (a night's runs), or by hand: its log too
        set_verbosity(1)
