"""`cupid` imports a command's module when that command is called: `--version` and `--help` print without loading the
library behind every command, and the help's line for each command stays the command's own."""

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from cupid.cli import COMMANDS, app

# What a bare start needs: cupid, its __main__, the CLI's root and its errors, common's install, errors and verbosity.
MOST_MODULES = 15
LOADED = """import sys
sys.argv = ["cupid", *sys.argv[1:]]
from cupid.__main__ import main
try:
    main()
except SystemExit:
    pass
print(sorted(m for m in sys.modules if m == "cupid" or m.startswith("cupid.")))"""


def _loaded(*args: str) -> list[str]:
    """The cupid modules a fresh interpreter holds after `cupid ARGS`, as the installed command runs it."""
    done = subprocess.run(
        [sys.executable, "-c", LOADED, *args], capture_output=True, text=True, timeout=120, check=True
    )
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])  # the list LOADED prints last


@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_the_root_loads_only_what_it_prints(args):
    """`cupid --version` and `cupid --help` ran after importing all 14 command modules and the library behind them
    (110 cupid modules); they print a version and a list of commands, which need none of it."""
    loaded = _loaded(*args)
    commands = [m for m in loaded if m.startswith("cupid.cli.") and m != "cupid.cli.errors"]
    assert commands == [], f"command modules loaded by cupid {' '.join(args)}: {commands}"
    assert len(loaded) <= MOST_MODULES, loaded


def test_a_command_loads_its_own_module_only():
    """`cupid report --help` imports the report command's module, not the others'."""
    commands = {m for m in _loaded("report", "--help") if m.startswith("cupid.cli.")} - {"cupid.cli.errors"}
    assert commands == {"cupid.cli.report"}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_listed_line_is_the_command_own_help(name):
    """`cupid --help` shows `COMMANDS`' line without importing the command; it must say what the command's own help
    says (its first paragraph, as typer lists a command), or the two would drift apart."""
    command = COMMANDS[name].load(name)
    first = inspect.cleandoc(command.help or "").split("\n\n")[0]
    assert COMMANDS[name].help == " ".join(first.split())


def test_every_command_module_is_listed():
    """A command module left out of `COMMANDS` would be unreachable: each module of cupid/cli/ is a command's."""
    modules = {p.stem for p in Path(sys.modules["cupid.cli"].__file__ or "").parent.glob("*.py")} - {
        "__init__",
        "errors",
    }
    assert modules == {c.target.split(":")[0].rsplit(".", 1)[1] for c in COMMANDS.values()}


def test_the_root_help_lists_every_command():
    """Listed from `COMMANDS` alone, the help still names every command."""
    from typer.testing import CliRunner

    shown = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    assert all(f" {name} " in shown for name in COMMANDS)
