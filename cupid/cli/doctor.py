"""`cupid doctor`: what this environment has for each command (`cupid.common.install`), and the fix for what an install
by name can leave that no command needs (`--fix` applies it)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

import typer
from rich.console import Console
from rich.table import Table

from cupid.common import install
from cupid.common.errors import EXIT_FAILED

console = Console(soft_wrap=True)


def _uninstall(packages: list[str]) -> bool:
    """Out of this environment (the Python that runs cupid), with its pip, else uv's; False where neither is here."""
    if importlib.util.find_spec("pip") is not None:
        command = [sys.executable, "-m", "pip", "uninstall", "-y", *packages]
    elif (uv := shutil.which("uv")) is not None:
        command = [uv, "pip", "uninstall", "--python", sys.executable, *packages]
    else:
        return False
    print("fix: " + " ".join(["pip", "uninstall", "-y", *packages]))
    return subprocess.run(command, check=False).returncode == 0


def main(
    fix: bool = typer.Option(
        False,
        "--fix",
        help="apply the fixes it prints (uninstall torch's companions built for another torch, triton without CUDA); "
        "nothing to do a second time",
    ),
) -> None:
    """The torch and vLLM builds, transformers, the training stack, trackers, GPU; what is missing for which command
    and the extra that brings it (exit 0: a missing extra breaks nothing). Exit 1 where the install is broken (torch's
    companions built for another torch) and not fixed."""
    if fix:
        for packages in install.fixes():
            if not _uninstall(packages):
                print(f"could not run pip here: run pip uninstall -y {' '.join(packages)}")
                raise typer.Exit(EXIT_FAILED)
    table = Table("component", "installed", title="cupid doctor")
    for what, state in install.report():
        table.add_row(what, state)
    console.print(table)
    for need in install.NEEDS:
        if gaps := install.missing(need):
            needed = ", ".join(gap.replace("|", " or ") for gap in gaps)
            print(f"{need.commands}: needs {needed}: {install.pip_install(need.extra)}")
    for what, cost, command in install.costs():
        print(f"costly: {what} {cost}" + (" (cupid doctor --fix)" if command else ""))
    if line := install.mismatch_line():
        print(f"broken: {line} (cupid doctor --fix)")
        raise typer.Exit(EXIT_FAILED)
    print("ok: nothing broken")
