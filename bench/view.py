"""`cupid view` at full size: page size and time to first paint in Chromium for a synthetic full run.

    python -m bench.view [--instances 756] [--history-chars 32000]

The data: the bundled sample's 12 instances multiplied to 756, every text made distinct, each history padded to
~8k tokens (~32k characters, the paper's average). The runs: every setting of both tasks (3 inference, 4
generation: 5,292 units per run), records written with tests/run_records' helpers plus answers and checklists of
realistic length. Timed in Debian's chromium (Playwright), from file://: first contentful paint, DOMContentLoaded
(every unit openable), and opening one unit, for one run and for two runs compared. Figures only, never pass/fail.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.generation import GENERATION
from cupid.eval.benchmark.inference import INFERENCE
from cupid.eval.results.view import build
from tests.run_records import generation, inference, write_run

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def synthetic_data(path: Path, n: int, history_chars: int) -> list[str]:
    """n instances from the sample's, each text tagged with its copy number and its dialogues padded."""
    sample = [json.loads(line) for line in cupid_data.SAMPLE_PATH.read_text().splitlines()]
    keys = []
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            row = json.loads(json.dumps(sample[i % len(sample)]))
            tag = f" [copy {i}]"
            row["persona_id"] = f"{row['persona_id']}-{i // len(sample):03d}"
            row["current_request"] += tag
            row["current_contextual_preference"] += tag
            row["current_checklist"] = [c + tag for c in row["current_checklist"]]
            size = sum(len(m["content"]) for s in row["prior_interactions"] for m in s["dialogue"])
            repeat = max(1, history_chars // max(size, 1))
            for s in row["prior_interactions"]:
                if s["contextual_preference"] == sample[i % len(sample)]["current_contextual_preference"]:
                    s["contextual_preference"] = row["current_contextual_preference"]
                for m in s["dialogue"]:
                    m["content"] = " ".join(f"{m['content']} ({tag} turn part {k})" for k in range(repeat))
            keys.append(f"{row['persona_id']}/{row['instance_type']}")
            f.write(json.dumps(row) + "\n")
    return keys


def synthetic_run(path: Path, keys: list[str], data: str, candidate: str, seed: int) -> Path:
    rng = random.Random(seed)
    records = []
    for key in keys:
        for setting in INFERENCE.settings:
            if rng.random() < 0.05:
                r = inference(key, setting=setting, failed=rng.choice(["parse_preference", "match_infer_to_gt"]))
            else:
                predicted = "".join(rng.choice("YPN") for _ in range(rng.randint(3, 6)))
                truth = "".join(rng.choice("YPN") for _ in range(rng.randint(3, 5)))
                r = inference(key, predicted, truth, setting=setting)
                r["inferred_checklist"] = [m["entry"] for m in r["infer_to_gt"]]
            r["candidate_answer"] = (
                f"{candidate} on {key} ({setting}): " + "the inferred preference, reasoned at length. " * 30
            )
            r["gt_checklist"] = [m["entry"] for m in r.get("gt_to_infer", [])]
            records.append(r)
        for setting in GENERATION.settings:
            r = generation(key, None if rng.random() < 0.03 else rng.randint(1, 10), setting=setting)
            if r["status"] == "scored":
                r["candidate_answer"] = "A response written for the request. " * 40
                r["judge_answer"] = "The response follows the preference in part. " * 8
            records.append(r)
    plan = {
        "n_instances": len(keys),
        "settings": {"inference": list(INFERENCE.settings), "generation": list(GENERATION.settings)},
    }
    write_run(path, records, {"candidate": candidate}, data=data)
    identity = json.loads((path / "run.json").read_text())
    (path / "run.json").write_text(json.dumps({**identity, "plan": plan}))
    n, failed = len(records), sum(r["status"] == "failed" for r in records)
    counts = {"n_runs": n, "n_instances": len(keys), "n_scored": n - failed, "n_failed": failed}
    (path / "summary.json").write_text(json.dumps(counts))  # the counts a run's summary must hold, no figures
    return path


def measure(page_path: Path) -> dict[str, float]:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        started = time.perf_counter()
        page.goto(page_path.as_uri(), wait_until="domcontentloaded", timeout=120_000)
        ready_wall = time.perf_counter() - started
        try:  # headless Chromium records the first paint a moment after DOMContentLoaded, or (some builds) never
            page.wait_for_function("performance.getEntriesByName('first-contentful-paint').length > 0", timeout=10_000)
        except PlaywrightTimeout:
            pass
        timings = page.evaluate(
            """() => { const nav = performance.getEntriesByType('navigation')[0];
                       const fcp = performance.getEntriesByName('first-contentful-paint')[0];
                       return {fcp: fcp ? fcp.startTime : null, dcl: nav.domContentLoadedEventEnd,
                               rows: document.querySelectorAll('.row').length}; }"""
        )
        started = time.perf_counter()
        page.locator(".row").first.click()
        page.locator(".col").first.wait_for()
        open_unit = time.perf_counter() - started
        browser.close()
    return {
        "first_paint_s": round(timings["fcp"] / 1000, 3) if timings["fcp"] is not None else None,
        "dom_ready_s": round(timings["dcl"] / 1000, 3),
        "wall_ready_s": round(ready_wall, 3),
        "open_unit_s": round(open_unit, 3),
        "rows_in_dom": timings["rows"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=756)
    parser.add_argument(
        "--history-chars", type=int, default=32_000, help="characters of dialogue per instance (~4 per token)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        data = tmp / "data.jsonl"
        keys = synthetic_data(data, args.instances, args.history_chars)
        run_a = synthetic_run(tmp / "a", keys, str(data), "model-a", seed=1)
        run_b = synthetic_run(tmp / "b", keys, str(data), "model-b", seed=2)
        n_units = len((run_a / "instances.jsonl").read_text().splitlines())
        print(
            f"synthetic full run: {len(keys)} instances, {n_units} units per run, "
            f"data {data.stat().st_size / 1e6:.1f} MB"
        )
        for name, dirs in (("one run", [run_a]), ("two runs compared", [run_a, run_b])):
            started = time.perf_counter()
            page = build(dirs, tmp / name.replace(" ", "-"))
            built = time.perf_counter() - started
            figures = measure(page)
            print(
                f"{name}: page {page.stat().st_size / 1e6:.1f} MB (built in {built:.1f} s); in Chromium from file://: "
                f"first contentful paint {figures['first_paint_s']:.2f} s, every unit openable (DOMContentLoaded) "
                f"{figures['dom_ready_s']:.2f} s, opening a unit {figures['open_unit_s']:.2f} s, "
                f"{figures['rows_in_dom']} of {n_units} rows in the DOM"
            )


if __name__ == "__main__":
    main()
