"""The `cupid` command: every command in this package, each a thin call into the library (no library module imports
typer), one module per command or command group.

A user's mistake (a file that is missing or malformed, a config the library refuses, an input that is not what it
should be, an output that cannot be written) is one line on stderr and exit 2, whichever command met it
(`errors.CupidGroup`)."""

import os

import typer
from typer.core import TyperOption

from cupid.cli.compare import main as compare_main
from cupid.cli.demo import main as demo_main
from cupid.cli.doctor import main as doctor_main
from cupid.cli.errors import CupidGroup
from cupid.cli.eval import app as eval_app
from cupid.cli.import_inspect import main as import_inspect_main
from cupid.cli.meta import app as meta_app
from cupid.cli.nightly import main as nightly_main
from cupid.cli.report import main as report_main
from cupid.cli.serve import app as serve_app
from cupid.cli.synth import main as synth_main
from cupid.cli.track import main as track_main
from cupid.cli.train import app as train_app
from cupid.cli.view import main as view_main
from cupid.common import install
from cupid.common.verbosity import set_verbosity
from cupid.common.verbosity import verbose as verbose_set

_value_shown = TyperOption.display_type_rich


def _flag_takes_no_value(self: TyperOption, ctx):  # type: ignore[no-untyped-def]
    """A flag is given bare (`--dry-run`): typer 0.29 shows its type as a value (`--dry-run <bool>`), which reads as
    if it took one."""
    return None if self.is_flag else _value_shown(self, ctx)


TyperOption.display_type_rich = _flag_takes_no_value  # type: ignore[method-assign]

app = typer.Typer(
    cls=CupidGroup,
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


app.add_typer(serve_app, name="serve")
app.add_typer(eval_app, name="eval")
app.add_typer(meta_app, name="meta")
app.add_typer(train_app, name="train")
app.command("synth")(synth_main)
app.command("demo")(demo_main)
app.command("doctor")(doctor_main)
app.command("report")(report_main)
app.command("view")(view_main)
app.command("compare")(compare_main)
app.command("nightly")(nightly_main)
app.command("track")(track_main)
app.command("import-inspect")(import_inspect_main)
