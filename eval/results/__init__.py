"""What is read from finished runs: the report, the viewer, comparisons, the tracker, the leaderboard of nights,
meta-evaluation. Nothing here starts a run or a server (that is `eval.workflows`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cupid.common.faces import lazy

# What the rest of the package uses of this room, by the module that defines it (imported on first use)
EXPORTS = {
    "Comparison": "cupid.eval.results.compare",
    "EXIT_NO_VERDICT": "cupid.eval.results.compare",
    "EXIT_REGRESSION": "cupid.eval.results.compare",
    "Entry": "cupid.eval.results.leaderboard",
    "HEADLINE_SETTING": "cupid.eval.results.compare",
    "LABELS": "cupid.eval.results.meta",
    "Labelled": "cupid.eval.results.meta",
    "Leaderboard": "cupid.eval.results.leaderboard",
    "Row": "cupid.eval.results.compare",
    "adjust": "cupid.eval.results.compare",
    "agree": "cupid.eval.results.meta",
    "assemble": "cupid.eval.results.leaderboard",
    "build": "cupid.eval.results.report",
    "canonical_label": "cupid.eval.results.meta",
    "compare_runs": "cupid.eval.results.compare",
    "correlate": "cupid.eval.results.meta",
    "f1_table": "cupid.eval.results.meta",
    "holm_family": "cupid.eval.results.compare",
    "margin_question": "cupid.eval.results.compare",
    "krippendorff_alpha": "cupid.eval.results.meta",
    "labels_from": "cupid.eval.results.meta",
    "leaderboard_markdown": "cupid.eval.results.leaderboard",
    "log": "cupid.eval.results.track",
    "of_run": "cupid.eval.results.track",
    "read": "cupid.eval.results.track",
    "read_table": "cupid.eval.results.meta",
    "require": "cupid.eval.results.track",
    "run_dir_of": "cupid.eval.results.leaderboard",
    "run_labels": "cupid.eval.results.meta",
    "task_rows": "cupid.eval.results.compare",
    "write_leaderboard": "cupid.eval.results.leaderboard",
}
__all__ = [
    "EXIT_NO_VERDICT",
    "EXIT_REGRESSION",
    "HEADLINE_SETTING",
    "LABELS",
    "Comparison",
    "Entry",
    "Labelled",
    "Leaderboard",
    "Row",
    "adjust",
    "agree",
    "assemble",
    "build",
    "canonical_label",
    "compare_runs",
    "correlate",
    "f1_table",
    "holm_family",
    "krippendorff_alpha",
    "labels_from",
    "leaderboard_markdown",
    "log",
    "margin_question",
    "of_run",
    "read",
    "read_table",
    "require",
    "run_dir_of",
    "run_labels",
    "task_rows",
    "write_leaderboard",
]
__getattr__, __dir__ = lazy(__name__, EXPORTS)

if TYPE_CHECKING:
    from cupid.eval.results.compare import (
        EXIT_NO_VERDICT,
        EXIT_REGRESSION,
        HEADLINE_SETTING,
        Comparison,
        Row,
        adjust,
        compare_runs,
        holm_family,
        margin_question,
        task_rows,
    )
    from cupid.eval.results.leaderboard import (
        Entry,
        Leaderboard,
        assemble,
        leaderboard_markdown,
        run_dir_of,
        write_leaderboard,
    )
    from cupid.eval.results.meta import (
        LABELS,
        Labelled,
        agree,
        canonical_label,
        correlate,
        f1_table,
        krippendorff_alpha,
        labels_from,
        read_table,
        run_labels,
    )
    from cupid.eval.results.report import build
    from cupid.eval.results.track import log, of_run, read, require
