"""Meta-evaluation of matchers (paper App. A.1, §4.2.1): how far two matchers agree on the same
checklist-preference pairs, and how far model-wise F1 under one matcher tracks F1 under another.

`cupid meta agree A B`: labels from two run directories (pairs matched by instance key, setting,
direction and item index; a pair only counts when both sides labelled the same item against the
same preference), or a run directory against a human-label file. Krippendorff's alpha is ordinal:
the labels are ordered (No < Partial < Yes) and "Yes" against "No" is a worse disagreement than
"Yes" against "Partial", which nominal alpha would score alike; the paper's alpha is ordinal/interval
over {0, 0.5, 1}. With three equally spaced labels ordinal and interval rank the same way; ordinal
does not assume that Partial sits exactly halfway.

`cupid meta correlate`: Pearson r between model-wise F1 under two matchers, from run directories
(one column per matcher, the run's own matcher and its reference scoring) or from a CSV table.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cupid.common.config import ConfigError
from cupid.eval.benchmark.inference import INFERENCE
from cupid.eval.benchmark.records import DIRECTIONS, UnitRecord
from cupid.eval.benchmark.rundir import RunDir

LABELS = ("Yes", "Partial", "No")
LABEL_VALUE = {"Yes": 1.0, "Partial": 0.5, "No": 0.0}
_ALIASES = {
    "yes": "Yes",
    "fully covered": "Yes",
    "1": "Yes",
    "1.0": "Yes",
    "partial": "Partial",
    "partially covered": "Partial",
    "0.5": "Partial",
    "no": "No",
    "not covered": "No",
    "0": "No",
    "0.0": "No",
}
Level = Literal["ordinal", "nominal", "interval"]

PairKey = tuple[str, str, str, int]  # (instance key, setting, direction, item index)


def canonical_label(value: Any) -> str:
    """Yes/Partial/No from the matcher's own words, the short names, or the scores 1/0.5/0."""
    label = _ALIASES.get(str(value).strip().lower())
    if label is None:
        raise ValueError(f"label {value!r} is none of Yes/Partial/No (or Fully/Partially/Not Covered, 1/0.5/0)")
    return label


@dataclass(frozen=True)
class Labelled:
    label: str
    entry: str | None = None  # the checklist item
    criterion: str | None = None  # the preference it was matched against


# ---------------------------------------------------------------- reading labels


def run_labels(run_dir: str | Path, *, reference: bool = False) -> dict[PairKey, Labelled]:
    """Every labelled pair of a run's scored inference records."""
    pairs: dict[PairKey, Labelled] = {}
    for record in RunDir(run_dir).read():
        key, task, setting = record.unit
        scoring = record.scoring(reference)
        if task != INFERENCE.name or not scoring.scored:
            continue
        criteria = {"infer_to_gt": record.gt_preference, "gt_to_infer": record.inferred_preference}
        for direction in DIRECTIONS:
            for item in getattr(scoring, direction) or []:
                pairs[(key, setting, direction, item.index)] = Labelled(
                    canonical_label(item.label), item.entry, criteria[direction]
                )
    return pairs


LABEL_FILE_COLUMNS = ("key", "direction", "index", "label")


def file_labels(path: str | Path) -> dict[PairKey, Labelled]:
    """Labels from a JSONL or CSV file: columns key, direction, index, label; optional setting
    (default standard), entry and preference (checked against the run's when present)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            rows = [(f"{path}:{n}", row) for n, row in enumerate(csv.DictReader(f), start=2)]
    else:
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append((f"{path}:{n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{n}: not JSON ({e.msg})") from None
    pairs: dict[PairKey, Labelled] = {}
    for where, row in rows:
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: expected an object with {', '.join(LABEL_FILE_COLUMNS)}")
        if missing := [c for c in LABEL_FILE_COLUMNS if row.get(c) in (None, "")]:
            raise ConfigError(f"{where}: missing {', '.join(missing)}")
        if row["direction"] not in DIRECTIONS:
            raise ConfigError(f"{where}: direction {row['direction']!r} is neither {' nor '.join(DIRECTIONS)}")
        try:
            index = int(row["index"])
            label = canonical_label(row["label"])
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        pair = (str(row["key"]), str(row.get("setting") or "standard"), row["direction"], index)
        pairs[pair] = Labelled(label, row.get("entry") or None, row.get("preference") or None)
    return pairs


def labels_from(source: str | Path, *, reference: bool = False) -> dict[PairKey, Labelled]:
    """A run directory (its matcher's labels, or its reference scoring's) or a label file."""
    if Path(source).is_dir():
        return run_labels(source, reference=reference)
    if reference:
        raise ConfigError(f"{source}: a reference scoring exists only in a run directory")
    return file_labels(source)


# ---------------------------------------------------------------- agreement


def krippendorff_alpha(a: Iterable[str], b: Iterable[str], level: Level = "ordinal") -> float | None:
    """Alpha between two coders over Yes/Partial/No; None where it is undefined (one label only)."""
    import krippendorff
    import numpy as np

    data = np.array([[LABEL_VALUE[x] for x in a], [LABEL_VALUE[x] for x in b]], dtype=float)
    if data.size == 0 or len(np.unique(data)) < 2:
        return None
    return float(krippendorff.alpha(reliability_data=data, value_domain=[0.0, 0.5, 1.0], level_of_measurement=level))


@dataclass
class MatcherAgreement:
    n: int
    alpha: float | None
    level: str
    accuracy: float | None
    confusion: list[list[int]]  # rows: labels of A, columns: labels of B, both in LABELS order
    only_a: int = 0  # pairs labelled by A alone
    only_b: int = 0
    mismatched: list[PairKey] = field(default_factory=list)  # same position, different item or preference


def agree(a: dict[PairKey, Labelled], b: dict[PairKey, Labelled], level: Level = "ordinal") -> MatcherAgreement:
    shared: list[tuple[str, str]] = []
    mismatched: list[PairKey] = []
    for pair in sorted(a.keys() & b.keys()):
        x, y = a[pair], b[pair]
        if (x.entry and y.entry and x.entry.strip() != y.entry.strip()) or (
            x.criterion and y.criterion and x.criterion.strip() != y.criterion.strip()
        ):
            mismatched.append(pair)
            continue
        shared.append((x.label, y.label))
    confusion = [[0] * len(LABELS) for _ in LABELS]
    for label_a, label_b in shared:
        confusion[LABELS.index(label_a)][LABELS.index(label_b)] += 1
    return MatcherAgreement(
        n=len(shared),
        alpha=krippendorff_alpha([x for x, _ in shared], [y for _, y in shared], level),
        level=level,
        accuracy=sum(x == y for x, y in shared) / len(shared) if shared else None,
        confusion=confusion,
        only_a=len(a.keys() - b.keys()),
        only_b=len(b.keys() - a.keys()),
        mismatched=mismatched,
    )


# ---------------------------------------------------------------- model-wise F1 tables


def run_f1(
    records: Iterable[UnitRecord], setting: str, aggregate: str = "micro", reference: bool = False
) -> tuple[float | None, int, int]:
    """(F1, n_scored, n_failed) of a run's inference records in one setting."""
    rows = [r for r in records if r.task == INFERENCE.name and r.setting == setting]
    n_scored = sum(r.scoring(reference).scored for r in rows)
    return INFERENCE.point(rows, reference).get(f"{aggregate}_f1"), n_scored, len(rows) - n_scored


@dataclass
class F1Table:
    values: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> matcher -> F1
    sources: dict[tuple[str, str], str] = field(default_factory=dict)  # (model, matcher) -> run dir
    duplicates: list[str] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        return sorted({m for row in self.values.values() for m in row})

    def add(self, model: str, matcher: str, f1: float, source: str) -> None:
        if (model, matcher) in self.sources:
            self.duplicates.append(f"{model} under {matcher}: {self.sources[model, matcher]} and {source}")
            return
        self.values.setdefault(model, {})[matcher] = f1
        self.sources[model, matcher] = source


def f1_table(run_dirs: Iterable[str | Path], setting: str = "standard", aggregate: str = "micro") -> F1Table:
    """Model-wise F1 from runs: one row per candidate model, one column per matcher (a run with a
    reference scoring fills two columns). The first run to give a (model, matcher) cell keeps it."""
    table = F1Table()
    for run_dir in map(Path, run_dirs):
        run = RunDir(run_dir).load()
        if not run.records:
            raise ConfigError(f"{run_dir}: no instance records (instances.jsonl is empty)")
        scorings = [(run.role("matcher") or "matcher", False)]
        if run.has_reference:
            scorings.append((run.role("reference") or "reference", True))
        for matcher, reference in scorings:
            value, _, _ = run_f1(run.records, setting, aggregate, reference)
            if value is not None:
                table.add(run.candidate, matcher, value, str(run_dir))
    return table


# The paper's model-wise F1 under GPT-4o and PrefMatcher (its Tables 1 and 11), shipped: `--table paper`.
PAPER_TABLE = Path(__file__).with_name("paper_table1_table11.csv")


def read_table(path: str | Path) -> F1Table:
    """A CSV with a `model` column and one numeric column per matcher (empty cells are left out); `paper`: the
    paper's (`PAPER_TABLE`)."""
    path = PAPER_TABLE if str(path) == "paper" else Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    table = F1Table()
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or "model" not in reader.fieldnames:
            raise ConfigError(f"{path}: needs a 'model' column (columns: {reader.fieldnames})")
        for n, row in enumerate(reader, start=2):
            for column, cell in row.items():
                if column == "model" or cell is None or not cell.strip():
                    continue
                try:
                    value = float(cell)
                except ValueError:
                    raise ConfigError(f"{path}:{n}: column {column!r} holds {cell!r}, not a number") from None
                table.add(row["model"], column, value, f"{path}:{n}")
    return table


@dataclass
class Correlation:
    r: float
    p: float
    columns: tuple[str, str]
    models: list[str]
    x: list[float]
    y: list[float]
    left_out: list[str]  # models without a value in both columns


def correlate(table: F1Table, columns: tuple[str, str] | None = None) -> Correlation:
    """Pearson r between two columns over the models that have both."""
    from scipy.stats import pearsonr

    available = table.columns
    if columns is None:
        if len(available) != 2:
            raise ConfigError(f"pick two columns with --columns A B (the table has {available})")
        columns = (available[0], available[1])
    a, b = columns
    if unknown := [c for c in columns if c not in available]:
        raise ConfigError(f"no column {', '.join(map(repr, unknown))} (the table has {available})")
    models = [m for m, row in table.values.items() if a in row and b in row]
    left_out = [m for m in table.values if m not in models]
    if len(models) < 3:
        raise ConfigError(f"Pearson r needs at least 3 models with both {a} and {b}; found {len(models)}: {models}")
    x, y = [table.values[m][a] for m in models], [table.values[m][b] for m in models]
    if len(set(x)) < 2 or len(set(y)) < 2:
        raise ConfigError(f"one column is constant over {models}: r is undefined")
    result = pearsonr(x, y)
    return Correlation(float(result.statistic), float(result.pvalue), (a, b), models, x, y, left_out)


# ---------------------------------------------------------------- CLI
