"""The `cupid` command: every command in this package, each a thin call into the library (no library module imports
typer), one module per command or command group."""

import typer

from cupid.cli.compare import main as compare_main
from cupid.cli.eval import app as eval_app
from cupid.cli.import_inspect import main as import_inspect_main
from cupid.cli.meta import app as meta_app
from cupid.cli.nightly import main as nightly_main
from cupid.cli.report import main as report_main
from cupid.cli.serve import app as serve_app
from cupid.cli.synth import app as synth_app
from cupid.cli.track import main as track_main
from cupid.cli.train import app as train_app
from cupid.cli.view import main as view_main

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Local, cost-free evaluation for the CUPID benchmark."
)
app.add_typer(serve_app, name="serve")
app.add_typer(eval_app, name="eval")
app.add_typer(meta_app, name="meta")
app.add_typer(synth_app, name="synth")
app.add_typer(train_app, name="train")
app.command("report")(report_main)
app.command("view")(view_main)
app.command("compare")(compare_main)
app.command("nightly")(nightly_main)
app.command("track")(track_main)
app.command("import-inspect")(import_inspect_main)
