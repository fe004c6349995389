"""`cupid doctor`: what this environment has for each command (`cupid.common.install`), and the fix for the one
mismatch an install by name can leave."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from cupid.common import install

console = Console(soft_wrap=True)


def main() -> None:
    """The torch and vLLM builds, transformers, the training stack, trackers, GPU; what is missing for which command
    and the extra that brings it. Exit 1 where the install is broken (torch's companions built for another torch)."""
    table = Table("component", "installed", title="cupid doctor")
    for what, state in install.report():
        table.add_row(what, state)
    console.print(table)
    for need in install.NEEDS:
        if gaps := install.missing(need):
            needed = ", ".join(gap.replace("|", " or ") for gap in gaps)
            print(f"{need.commands}: needs {needed}: pip install 'cupid-eval[{need.extra}]'")
    if line := install.mismatch_line():
        print(f"broken: {line}")
        raise typer.Exit(1)
    print("ok: nothing broken")
