"""How much a command says while it works, for every command and the processes it starts (`cupid -v` / `-q` set it
through the environment, so that a night's runs hear it too)."""

from __future__ import annotations

import logging
import os

VARIABLE = "CUPID_VERBOSITY"  # -1: quiet, 0: as usual, 1: verbose


def quiet() -> bool:
    """`cupid -q`: no progress, bar or lines; results, warnings and errors only."""
    return os.environ.get(VARIABLE, "0") == "-1"


def verbose() -> bool:
    """`cupid -v`: a progress line for every unit, on a terminal too, and each retried request."""
    return os.environ.get(VARIABLE, "0") == "1"


def set_verbosity(level: int) -> None:
    """Set it for this process and its children; verbose also shows the project's INFO log (each retry)."""
    os.environ[VARIABLE] = str(level)
    if verbose():
        logging.basicConfig(format="%(name)s: %(message)s")
        logging.getLogger("cupid").setLevel(logging.INFO)
