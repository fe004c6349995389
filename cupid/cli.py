"""The `cupid` command: one subcommand group per module."""

import typer

from cupid.eval.cli import app as eval_app
from cupid.eval.compare import main as compare_main
from cupid.eval.inspect_log import main as import_inspect_main
from cupid.eval.meta import app as meta_app
from cupid.eval.nightly import main as nightly_main
from cupid.eval.report import main as report_main
from cupid.eval.track import main as track_main
from cupid.eval.view import main as view_main
from cupid.serving.cli import app as serve_app
from cupid.training.cli import app as train_app
from cupid.training.synth.cli import app as synth_app

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
