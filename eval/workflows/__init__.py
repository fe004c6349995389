"""Workflows over the rooms they join: a night (`nightly`: the fleet's servers, a run per candidate, the comparison
with the last night and the leaderboard) and a logged run (`logged_run`: a run, then its tracker)
and the demo (`demo`: the tiny model served, a run, the server stopped). Above benchmark,
results and the fleet; nothing below imports them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cupid.common.faces import lazy

# What the rest of the package uses of this room, by the module that defines it (imported on first use)
EXPORTS = {
    "Demo": "cupid.eval.workflows.demo",
    "run_demo": "cupid.eval.workflows.demo",
    "arun_and_log": "cupid.eval.workflows.logged_run",
    "run_and_log": "cupid.eval.workflows.logged_run",
    "run_nightly": "cupid.eval.workflows.nightly",
}
__all__ = ["Demo", "arun_and_log", "run_and_log", "run_demo", "run_nightly"]
__getattr__, __dir__ = lazy(__name__, EXPORTS)

if TYPE_CHECKING:
    from cupid.eval.workflows.demo import Demo, run_demo
    from cupid.eval.workflows.logged_run import arun_and_log, run_and_log
    from cupid.eval.workflows.nightly import run_nightly
