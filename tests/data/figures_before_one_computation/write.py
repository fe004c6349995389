"""How the files beside this script were written, by the code before each figure was computed in one place
(commit 6a674ed; run with that commit's package first on the path). Kept for the record: it calls functions that
are gone since (report.inference_rows, nightly.failure_counts, meta's own run_f1).

    python write.py sample          # records made here (tests/run_records.py), summary by the old summarize
    python write.py tiny RUN_DIR    # a run of configs/eval/tiny.yaml on the tiny model, its summary.json as written

Each run directory gets figures.json: what the report, the nightly and the meta-evaluation computed from its records.
"""

import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).parent
sys.path.append(str(HERE.parents[2]))  # tests/run_records.py

from cupid.eval.benchmark import TASKS, RunDir, UnitRecord, summarize  # noqa: E402 (after the path above)
from cupid.eval.results import meta, report  # noqa: E402 (after the path above)
from cupid.eval.workflows import nightly  # noqa: E402 (after the path above)


def sample(path: Path) -> None:
    from tests import run_records as rr

    inference, generation = [], []
    keys = [f"sample-0{p}/{t}" for p in (1, 2, 3, 4) for t in ("consistent", "contrastive", "changing")]
    labels = ["YPN", "YY", "NNP", "PY", "Y", "NPPY", "YN", "PP", "NY", "YYYN", "P", "N"]
    for setting, shift in (("standard", 0), ("oracle", 5)):
        for i, key in enumerate(keys):
            a, b = labels[(i + shift) % len(labels)], labels[(i + shift + 3) % len(labels)]
            reference = (
                rr.scoring(b, a)
                if i % 4
                else {
                    "status": "failed",
                    "error": {"stage": "matcher", "reason": "parse_error", "detail": "no header", "raw": "?"},
                }
            )
            failed = "decomposer" if (i + shift) % 7 == 3 else "matcher" if (i + shift) % 11 == 5 else None
            inference.append(rr.inference(key, a, b, setting=setting, failed=failed, reference=reference))
            generation.append(
                rr.generation(key, None if (i + shift) % 6 == 2 else 1 + (3 * i + shift) % 10, setting=setting)
            )
    rr.write_run(
        path, inference + generation, {"candidate": "model-a", "matcher": "matcher-x", "reference": "matcher-y"}
    )
    records = [UnitRecord.model_validate(r) for r in inference + generation]
    plan = {TASKS["inference"]: ["standard", "oracle"], TASKS["generation"]: ["standard", "oracle"]}
    summary = summarize(records, plan, len(keys), {"roles": {"candidate": "model-a"}}, reference=True)
    (path / "summary.json").write_text(json.dumps(summary, indent=2))


def figures(path: Path) -> None:
    run = report.load_run(path)
    records = list(RunDir(path).records().values())

    def rows(rs):
        return [{**asdict(r), "cells": {k: v and v.as_dict() for k, v in r.cells.items()}} for r in rs]

    f1 = {
        f"{setting} {aggregate}{' reference' if reference else ''}": meta.run_f1(records, setting, aggregate, reference)
        for setting in ("standard", "oracle", "interleaved")
        for aggregate in ("micro", "macro")
        for reference in (False, True)
    }
    out = {
        "report": {
            "inference": rows(report.inference_rows(run)),
            "inference reference": rows(report.inference_rows(run, reference=True)),
            "generation": rows(report.generation_rows(run)),
            "generation reference": rows(report.generation_rows(run, reference=True)),
            "failures": report.failure_counts(run),
        },
        "nightly": {
            "metrics": {k: v.as_dict() for k, v in nightly.metrics(records).items()},
            "failures": nightly.failure_counts(records),
        },
        "meta": {"run_f1": f1, "f1_table": meta.f1_table([path]).values},
    }
    (path / "figures.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    which = sys.argv[1]
    target = HERE / which
    if which == "sample":
        sample(target)
    else:
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        for name in ("run.json", "instances.jsonl", "summary.json"):
            shutil.copy(Path(sys.argv[2]) / name, target / name)
    figures(target)
