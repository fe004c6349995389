"""Where the pages of runs go: `cupid report`'s and `cupid view`'s default folder, one for both, so that each page
links to the other by name and a comparison links its units into the view without importing the viewer."""

from __future__ import annotations

from pathlib import Path


def default_out(run_dirs: list[str]) -> Path:
    """Beside the report (`cupid report`'s default folder), so each links to the other by name."""
    return Path(run_dirs[0]) / "report" if len(run_dirs) == 1 else Path("runs/report")
