"""The `cupid` command: one subcommand group per module."""

import typer

from eval.cli import app as eval_app
from serving.cli import app as serve_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Local, cost-free evaluation for the CUPID benchmark.")
app.add_typer(serve_app, name="serve")
app.add_typer(eval_app, name="eval")

if __name__ == "__main__":
    app()
