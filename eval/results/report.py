"""`cupid report RUN_DIR...`: one self-contained HTML page (plots embedded as base64 PNGs, also
written beside it) for one or more runs: paper-style tables with bootstrap 95% intervals, failure
counts, and the paper's figures where the runs hold what they need (Fig. 3: F1 against the mean
position of the relevant sessions; Fig. 4: F1 under two matchers; Fig. 5: inference against
generation per model). Everything is recomputed from `instances.jsonl`, so intervals and tables
come from the same records; a failed instance is counted, never averaged in.
"""

from __future__ import annotations

import base64
import io
import math
import shlex
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cupid.common.config import ConfigError
from cupid.common.files import write_atomic
from cupid.eval.benchmark.generation import GENERATION
from cupid.eval.benchmark.grid import groups
from cupid.eval.benchmark.inference import INFERENCE
from cupid.eval.benchmark.rundir import Run, RunDir
from cupid.eval.benchmark.stats import Interval
from cupid.eval.benchmark.summary import failure_counts
from cupid.eval.benchmark.tasks import TASKS
from cupid.eval.benchmark.taskspec import TaskSpec
from cupid.eval.results.view import link_report

FIGURE_SETTING = "standard"


def load_run(path: str | Path | Run) -> Run:
    """A run read from its directory, or taken as a caller already read it (the nightly's)."""
    return path if isinstance(path, Run) else RunDir(path).load()


def _label_runs(runs: list[Run]) -> None:
    """Plot labels: the candidate model, plus the matcher where two runs share a candidate."""
    seen = Counter(r.candidate for r in runs)
    for run in runs:
        run.label = (
            run.candidate if seen[run.candidate] == 1 else f"{run.candidate} · {run.role('matcher') or run.path.name}"
        )
    labels = Counter(r.label for r in runs)
    for run in runs:
        if labels[run.label] > 1:
            run.label = f"{run.label} ({run.path})"


# ---------------------------------------------------------------- tables


@dataclass
class FigureRow:
    setting: str
    group: str
    n_scored: int
    n_failed: int
    cells: dict[str, Interval | None] = field(default_factory=dict)


def task_rows(run: Run, task: TaskSpec, reference: bool = False) -> list[FigureRow]:
    """The task's estimates with their intervals (`TaskSpec.intervals`) per setting and instance type."""
    rows = []
    for setting in run.settings(task.name):
        for instance_type, records in groups(run.of(task.name, setting)):
            group = instance_type or "all"
            n_scored = sum(r.scoring(reference).scored for r in records)
            intervals = task.intervals(records, reference)
            rows.append(
                FigureRow(
                    setting, group, n_scored, len(records) - n_scored, {m: intervals.get(m) for m in task.metrics}
                )
            )
    return rows


def failures_table(run: Run) -> list[tuple[str, str, str, int]]:
    """(scoring, task/setting, "stage: reason", n): the run's own failures, then its reference scoring's (of the
    units the reference scored: a failed candidate is the run's own failure, counted once)."""
    rows = []
    for scoring, records in (("own", run.records), ("reference", [r for r in run.records if r.reference is not None])):
        counts = failure_counts(records, reference=scoring == "reference")
        rows += [(scoring, f"{f.task} / {f.setting}", f"{f.stage}: {f.reason}", n) for f, n in counts.items()]
    return sorted(rows)


# ---------------------------------------------------------------- figures


@dataclass
class Figure:
    name: str
    title: str
    caption: str
    png: bytes | None = None  # None: not drawn, caption says why

    @property
    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png or b"").decode()


def _png(draw: Callable[[Any], None], size: tuple[float, float] = (6.4, 4.2)) -> bytes:
    """Render with matplotlib's object API on the Agg canvas (no pyplot, no global state, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=size, dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    draw(fig.add_subplot())
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _pearson(x: list[float], y: list[float]) -> str:
    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return ""
    from scipy.stats import pearsonr

    return f"Pearson r = {pearsonr(x, y).statistic:.3f} (n = {len(x)})"


def _relevant_from_data(source: str) -> dict[str, list[int]]:
    """key -> relevant session positions, for records written before `relevant_sessions` existed."""
    from cupid.eval.benchmark import data as cupid_data

    return {
        i.key: [
            n for n, s in enumerate(i.prior_interactions) if s.contextual_preference == i.current_contextual_preference
        ]
        for i in cupid_data.load(source).instances
    }


def _f1_by_position(runs: list[Run], width: int) -> tuple[dict[str, dict[int, list[float]]], list[str], int]:
    """Each run's per-instance F1 (standard setting, scored), binned by the mean position of the instance's relevant
    sessions; notes for the runs left out (no positions, data not loadable); the instances with no relevant session.
    The plot and its caption both read these: the binning is one step, the drawing another."""
    lines: dict[str, dict[int, list[float]]] = {}
    notes: list[str] = []
    no_relevant = 0
    for run in runs:
        records = [r for r in run.of(INFERENCE.name, FIGURE_SETTING) if r.scored]
        if not records:
            continue
        known: dict[str, list[int]] = {}
        if any(r.relevant_sessions is None for r in records):
            source = run.data
            try:
                known = _relevant_from_data(source)
            except Exception as e:  # noqa: BLE001 (the data may be unreachable here: say so, draw the rest)
                notes.append(
                    f"{run.label}: records lack relevant_sessions and data {source!r} could not be loaded ({e})"
                )
                continue
        bins: dict[int, list[float]] = {}
        for r in records:
            positions = r.relevant_sessions if r.relevant_sessions is not None else known.get(r.key, [])
            if not positions:
                no_relevant += 1
                continue
            x = sum(positions) / len(positions)
            bins.setdefault(math.floor(x / width), []).append(r.match_counts().prf().f1)
        lines[run.label] = bins
    return lines, notes, no_relevant


def figure3(runs: list[Run]) -> Figure:
    fig = Figure("fig3_f1_vs_position", "Fig. 3: F1 against the mean position of the relevant sessions", "")
    width = 1
    lines, notes, no_relevant = _f1_by_position(runs, width)
    if not lines:
        fig.caption = "Not drawn: no scored inference records in the standard setting. " + " ".join(notes)
        return fig
    all_bins = sorted({b for bins in lines.values() for b in bins})

    def draw(ax):
        for label, bins in lines.items():
            xs = sorted(bins)
            ax.plot(
                [(b + 0.5) * width for b in xs],
                [100 * sum(bins[b]) / len(bins[b]) for b in xs],
                marker="o",
                alpha=0.6,
                label=label,
            )
        if len(lines) > 1:
            mean = {b: [sum(v) / len(v) for bins in lines.values() if (v := bins.get(b))] for b in all_bins}
            ax.plot(
                [(b + 0.5) * width for b in all_bins],
                [100 * sum(m) / len(m) for m in mean.values()],
                color="black",
                lw=2.5,
                marker="s",
                label="mean across runs",
            )
        ax.set_xlabel("mean position of relevant sessions (0 = oldest)")
        ax.set_ylabel("mean per-instance F1 (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    fig.png = _png(draw)
    counts = ", ".join(
        f"[{b * width}, {(b + 1) * width}): {sum(len(bins.get(b, [])) for bins in lines.values())}" for b in all_bins
    )
    fig.caption = (
        f"Standard setting, scored instances; each point is the mean per-instance F1 of the instances whose relevant "
        f"sessions lie, on average, in that bin. Instances per bin (all runs): {counts}."
        + (f" {no_relevant} instances with no relevant session left out." if no_relevant else "")
        + (" " + " ".join(notes) if notes else "")
    )
    return fig


def model_points(
    runs: list[Run], setting: str = FIGURE_SETTING
) -> tuple[dict[str, dict[str, Interval]], dict[str, Interval]]:
    """Per candidate model: micro F1 under each matcher (own and reference scorings), and the mean
    generation score under the run's own judge. The first run to give a value keeps it."""
    f1: dict[str, dict[str, Interval]] = {}
    gen: dict[str, Interval] = {}
    for run in runs:
        scorings = [(run.role("matcher") or "matcher", False)] + (
            [(run.role("reference") or "reference", True)] if run.has_reference else []
        )
        for matcher, reference in scorings:
            intervals = INFERENCE.intervals(run.of(INFERENCE.name, setting), reference)
            if (f1_interval := intervals.get(INFERENCE.headline[0])) is not None:
                f1.setdefault(run.candidate, {}).setdefault(matcher, f1_interval)
        generation = GENERATION.intervals(run.of(GENERATION.name, setting))
        if (interval := generation.get(GENERATION.headline[0])) is not None:
            gen.setdefault(run.candidate, interval)
    return f1, gen


def _errorbars(ax, xs: list[Interval], ys: list[Interval], labels: list[str], scale_x: float, scale_y: float) -> None:
    def err(v: Interval, scale: float) -> list[list[float]]:  # no bar where too few personas give no interval
        if v.low is None or v.high is None:
            return [[0.0], [0.0]]
        return [[scale * (v.estimate - v.low)], [scale * (v.high - v.estimate)]]

    for x, y, label in zip(xs, ys, labels, strict=True):
        ax.errorbar(
            scale_x * x.estimate,
            scale_y * y.estimate,
            xerr=err(x, scale_x),
            yerr=err(y, scale_y),
            fmt="o",
            capsize=3,
            label=label,
        )


def figure4(f1: dict[str, dict[str, Interval]]) -> Figure:
    fig = Figure("fig4_f1_two_matchers", "Fig. 4: F1 under two matchers", "")
    pairs: Counter[tuple[str, str]] = Counter()
    for matchers in f1.values():
        names = sorted(matchers)
        pairs.update((a, b) for i, a in enumerate(names) for b in names[i + 1 :])
    if not pairs:
        fig.caption = (
            "Not drawn: no candidate model was scored under two matchers (give runs that share the candidate "
            "but differ in matcher, or a run with a reference scoring)."
        )
        return fig
    (a, b), _ = pairs.most_common(1)[0]
    models = [m for m, matchers in f1.items() if a in matchers and b in matchers]
    xs, ys = [f1[m][a] for m in models], [f1[m][b] for m in models]

    def draw(ax):
        _errorbars(ax, xs, ys, models, 100, 100)
        lo = min(100 * min(v.estimate if v.low is None else v.low for v in xs + ys), 100) - 2
        hi = max(100 * max(v.estimate if v.high is None else v.high for v in xs + ys), 0) + 2
        ax.plot([lo, hi], [lo, hi], color="grey", ls="--", lw=1)
        ax.set_xlabel(f"micro F1 (%) under {a}")
        ax.set_ylabel(f"micro F1 (%) under {b}")
        ax.set_title(_pearson([v.estimate for v in xs], [v.estimate for v in ys]), fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    fig.png = _png(draw)
    fig.caption = (
        f"Standard setting, one point per candidate model ({len(models)}), bars: 95% intervals, personas resampled "
        "(none under 10 personas); dashed: equal F1."
    )
    return fig


def figure5(f1: dict[str, dict[str, Interval]], gen: dict[str, Interval]) -> Figure:
    fig = Figure("fig5_inference_vs_generation", "Fig. 5: inference against generation per model", "")
    matcher_use = Counter(m for model in gen if model in f1 for m in f1[model])
    if not matcher_use:
        fig.caption = (
            "Not drawn: no candidate model has both an inference F1 and a generation score in the standard setting."
        )
        return fig
    matcher = matcher_use.most_common(1)[0][0]
    models = [m for m in gen if matcher in f1.get(m, {})]
    xs, ys = [f1[m][matcher] for m in models], [gen[m] for m in models]

    def draw(ax):
        _errorbars(ax, xs, ys, models, 100, 1)
        ax.set_xlabel(f"inference micro F1 (%) under {matcher}")
        ax.set_ylabel("generation: mean judge score (1-10)")
        ax.set_title(_pearson([v.estimate for v in xs], [v.estimate for v in ys]), fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    fig.png = _png(draw)
    fig.caption = (
        f"Standard setting, one point per candidate model ({len(models)}), bars: 95% intervals, personas resampled "
        "(none under 10 personas)."
    )
    return fig


# ---------------------------------------------------------------- page

TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>CUPID report</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 78em; color: #222; }
table { border-collapse: collapse; margin: .6em 0 1.4em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
small { color: #777; } .failed { color: #b00; font-weight: 600; } figure { margin: 1em 0 2em; }
figcaption { font-size: 13px; color: #444; max-width: 60em; } code { font-size: 12px; }
</style></head><body>
<h1>CUPID evaluation report</h1>
{% if view %}<p><a href="view.html">Look inside: every unit, its history, answer and labels</a></p>{% else %}\
<p><small>No page to look inside these runs here yet: <code>{{ view_command }}</code> writes it, \
and a link here.</small></p>{% endif %}
<p>Generated {{ generated }} from {{ runs|length }} run{{ "s" if runs|length != 1 else "" }}. \
Scores in %, generation scores 1-10.
Micro = sums over instances (reference code, published numbers); macro = mean of per-instance scores (paper text).
Brackets: 95% interval, personas resampled (bootstrap percentile, {{ n_resamples }} resamples, fixed seed: \
a persona's three
instances are drawn together); none where fewer than {{ min_personas }} personas were scored.
Failed instances are counted and never averaged in.</p>

<h2>Runs</h2>
<table><tr><th class="l">run</th><th class="l">candidate</th><th class="l">roles</th><th class="l">data</th>\
<th>records</th><th>scored</th><th>failed</th><th>invalid data rows</th></tr>
{% for run in runs %}<tr><td class="l"><code>{{ run.path }}</code></td><td class="l">{{ run.label }}</td>
<td class="l">{% for role, model in run.roles.items() %}{{ role }}: {{ model }}\
{% if not loop.last %}<br>{% endif %}{% endfor %}</td>
<td class="l">{{ run.data }}</td><td>{{ run.n_records }}</td><td>{{ run.n_scored }}</td>
<td{% if run.n_failed %} class="failed"{% endif %}>{{ run.n_failed }}</td><td>{{ run.n_invalid }}</td></tr>
{% endfor %}</table>

{% for run in runs %}
<h2>{{ run.label }}</h2>
{% for block in run.blocks %}
<h3>{{ block.title }}</h3>
<table><tr><th class="l">setting</th><th class="l">instances</th>\
{% for h in block.headers %}<th>{{ h }}</th>{% endfor %}<th>scored</th><th>failed</th></tr>
{% for row in block.rows %}<tr><td class="l">{{ row.setting }}</td><td class="l">{{ row.group }}</td>
{% for h in block.headers %}{% set c = row.cells[h] %}<td>{% if c %}{{ block.show(c.estimate) }} <small>\
{% if c.resolved %}[{{ block.show(c.low) }}, {{ block.show(c.high) }}]\
{% else %}({{ c.personas }} personas: no interval){% endif %}</small>{% else %}-{% endif %}</td>{% endfor %}
<td>{{ row.n_scored }}</td><td{% if row.n_failed %} class="failed"{% endif %}>{{ row.n_failed }}</td></tr>
{% endfor %}</table>
{% endfor %}
<h3>Failures</h3>
{% if run.failures %}<table><tr><th class="l">scoring</th><th class="l">task / setting</th>\
<th class="l">stage: reason</th><th>instances</th></tr>
{% for scoring, where, what, n in run.failures %}<tr><td class="l">{{ scoring }}</td><td class="l">{{ where }}</td>\
<td class="l">{{ what }}</td><td class="failed">{{ n }}</td></tr>
{% endfor %}</table>{% else %}<p>No failures: all {{ run.n_records }} records scored.</p>{% endif %}
{% endfor %}

<h2>Figures</h2>
{% for fig in figures %}<figure><h3>{{ fig.title }}</h3>
{% if fig.png %}<img alt="{{ fig.title }}" src="{{ fig.data_uri }}">{% endif %}
<figcaption>{{ fig.caption }}</figcaption></figure>
{% endfor %}
</body></html>
"""


def _run_view(run: Run) -> dict[str, Any]:
    blocks = []
    for task in TASKS.values():
        judge = task.roles[-1]  # the role whose answers make the score (matcher, judge)
        for reference in (False, True) if run.has_reference else (False,):
            if rows := task_rows(run, task, reference):
                who = (
                    f"reference scoring ({run.role('reference') or 'reference'})"
                    if reference
                    else f"{judge} {run.role(judge) or '?'}"
                )
                blocks.append(
                    {"title": f"{task.title}, {who}", "headers": list(task.metrics), "rows": rows, "show": task.show}
                )
    n_failed = sum(not r.scored for r in run.records)
    return {
        "path": run.path,
        "label": run.label,
        "roles": run.identity.roles or run.roles,
        "data": run.identity.data or (run.summary.data if run.summary else None) or "?",
        "n_records": len(run.records),
        "n_scored": len(run.records) - n_failed,
        "n_failed": n_failed,
        "n_invalid": run.summary.n_invalid_rows if run.summary else "?",
        "blocks": blocks,
        "failures": failures_table(run),
    }


def build(run_dirs: Iterable[str | Path | Run], out: str | Path) -> Path:
    """Write `report.html` and the figure PNGs into `out`; return the HTML's path. A run already read (the nightly's)
    is taken as it is."""
    import jinja2

    from cupid.eval.benchmark.stats import MIN_PERSONAS, N_RESAMPLES

    runs = [load_run(p) for p in run_dirs]
    dirs = [str(r.path) for r in runs]
    if not runs:
        raise ConfigError("give at least one run directory")
    _label_runs(runs)
    f1, gen = model_points(runs)
    figures = [figure3(runs), figure4(f1), figure5(f1, gen)]
    out = Path(out)
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    html = env.from_string(TEMPLATE).render(
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        runs=[_run_view(r) for r in runs],
        figures=figures,
        n_resamples=N_RESAMPLES,
        min_personas=MIN_PERSONAS,
        view=(out / "view.html").exists(),
        view_command=f"cupid view {' '.join(shlex.quote(d) for d in dirs)} --out {shlex.quote(str(out))}",
    )
    # Everything computed before anything is written; then each file whole, the page last: an interrupted or failed
    # write takes back the files this build added, so a report directory holds a whole report or what it held before.
    page = out / "report.html"
    files = {out / f"{fig.name}.png": fig.png for fig in figures if fig.png} | {page: html}
    added = [path for path in files if not path.exists()]
    try:
        for path, content in files.items():
            write_atomic(path, content)
    except BaseException:
        for path in added:
            path.unlink(missing_ok=True)
        raise
    link_report(out)
    return page
