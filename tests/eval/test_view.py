"""`cupid view` in a real browser (Debian's chromium, driven by Playwright): the page of a real tiny-model run,
filtered to failures, a unit checked against instances.jsonl, two runs compared, a run in progress.

One real run (the tiny model under vLLM as candidate, both tasks) and one instant-server run on the same
instances with a reference scoring are made once for the file. Screenshots go to runs/test-artifacts/.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import expect
from typer.testing import CliRunner

from cupid.cli import app
from cupid.eval.benchmark.runner import RunConfig, run
from cupid.eval.results import report
from cupid.eval.results.view import build
from tests.helpers import REPO, write_endpoints
from tests.run_records import inference, write_run

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO / "runs" / "test-artifacts"
SHORT = {"Fully Covered": "Y", "Partially Covered": "P", "Not Covered": "N"}


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not installed (apt-get install -y chromium; `make test` does it as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install -e '.[dev]')")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A fresh page; any JavaScript error fails the test."""
    errors: list[str] = []
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(10_000)
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    page.close()
    assert not errors, errors


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_server, instant_url):
    """(A, B): A's candidate is the real tiny model (free answers: some fail to parse); B's the instant server,
    re-scored by a reference. Same 3 instances, both tasks, the oracle setting (the tiny model's prompts a quarter of
    the standard setting's; the view shows every session of an instance whatever the setting)."""
    tmp = tmp_path_factory.mktemp("view")
    mp = pytest.MonkeyPatch()
    mp.setenv("CUPID_HOME", str(tmp / "home"))
    endpoints = write_endpoints(
        tmp / "endpoints.yaml",
        tiny=tiny_server,
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
        judge={"base_url": instant_url, "model": "judge"},
        ref={"base_url": instant_url, "model": "ref-4o", "matcher_prompt": "fewshot"},
    )
    common = {
        "endpoints": str(endpoints),
        "decomposer": "instant",
        "matcher": "pm",
        "judge": "judge",
        "limit": 3,
        "tasks": ["inference", "generation"],
        "settings": ["oracle"],
        "cache": str(tmp / "cache.sqlite"),
    }
    run(RunConfig(candidate="tiny", out=str(tmp / "a"), **common))
    run(RunConfig(candidate="instant", reference="ref", out=str(tmp / "b"), **common))
    mp.undo()
    return tmp / "a", tmp / "b"


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "instances.jsonl").read_text().splitlines()]


def unit_url(page_path: Path, r: dict) -> str:
    return f"{page_path.as_uri()}#unit={r['key']}|{r['task']}|{r['setting']}".replace("|", "%7C")


def shown_count(page) -> int:
    return int(page.inner_text("#count").split()[0])


def test_unit_of_a_real_run_shows_what_instances_jsonl_holds(runs, page, tmp_path):
    run_a, _ = runs
    view = build([run_a], tmp_path)
    rows = records(run_a)
    page.goto(view.as_uri())
    assert shown_count(page) == len(rows) == 6
    assert "finished: 6 of 6 units have a record" in page.inner_text("#runs")
    # no report beside the page yet: it says how to make one, never a dead link; once made, the page links to it
    assert page.locator("#report").get_attribute("href") is None
    assert f"cupid report {run_a} --out {tmp_path}" in page.inner_text("#report")
    report.build([run_a], tmp_path)
    page.goto(build([run_a], tmp_path).as_uri())
    assert page.locator("#report").get_attribute("href") == "report.html" and (tmp_path / "report.html").is_file()
    for r in rows:
        page.goto(unit_url(view, r))
        column = page.locator(".col").first
        if r.get("candidate_answer") is not None:
            assert column.locator(".answer").text_content() == r["candidate_answer"]
        if r["status"] == "failed":
            assert column.locator(".stage").inner_text() == r["error"]["stage"]
            assert column.locator(".reason").inner_text() == r["error"]["reason"]
            assert column.locator(".raw").text_content() == r["error"]["raw"]
        elif r["task"] == "inference":
            assert column.locator(".inferred").text_content() == r["inferred_preference"]
            for direction, css in (("infer_to_gt", ".m-infer"), ("gt_to_infer", ".m-gt")):
                labels = column.locator(f"{css} .lab").all_inner_texts()
                assert labels == [m["label"] for m in r[direction]]
                classes = [
                    c.split()[-1]
                    for c in column.locator(f"{css} .lab").evaluate_all("els => els.map(e => e.className)")
                ]
                assert classes == [f"lab-{SHORT[m['label']]}" for m in r[direction]]  # coloured by label
            s = r["scores"]
            assert (
                column.locator(".scores").inner_text()
                == f"P {100 * s['precision']:.1f} · R {100 * s['recall']:.1f} · F1 {100 * s['f1']:.1f}"
            )
        else:
            assert column.locator(".scores").inner_text() == f"score {r['score']} / 10"
            assert column.locator(".judge").text_content() == r["judge_answer"]
        sessions = page.locator("details.session")
        assert sessions.count() == 8 and page.locator("details.session.relevant").count() >= 1
        assert not page.locator("details.session[open]").count()  # collapsed
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    inference_unit = next(r for r in rows if r["task"] == "inference")
    page.goto(unit_url(view, inference_unit))
    page.locator("details.session.relevant").first.locator("summary").click()  # one relevant session opened
    page.screenshot(path=str(ARTIFACTS / "view-unit.png"), full_page=True)


def test_filter_to_failures(runs, page, tmp_path):
    run_a, _ = runs
    view = build([run_a], tmp_path)
    rows = records(run_a)
    failed = [r for r in rows if r["status"] == "failed"]
    page.goto(view.as_uri())
    page.select_option("#f-status", "failed")
    assert shown_count(page) == len(failed)
    assert page.locator(".row").count() == len(failed)
    assert page.locator(".row .failed").count() == len(failed)
    for stage in {r["error"]["stage"] for r in failed}:
        page.select_option("#f-status", f"stage:{stage}")
        assert shown_count(page) == sum(r["error"]["stage"] == stage for r in failed)
    page.select_option("#f-status", "scored")
    assert shown_count(page) == len(rows) - len(failed)
    page.select_option("#f-task", label="generation")
    assert shown_count(page) == sum(r["status"] == "scored" and r["task"] == "generation" for r in rows)


def test_two_runs_side_by_side(runs, page, tmp_path):
    run_a, run_b = runs
    result = CliRunner().invoke(app, ["view", str(run_a), str(run_b), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    view = Path(result.output.strip())
    a = {(r["key"], r["task"]): r for r in records(run_a)}
    b = {(r["key"], r["task"]): r for r in records(run_b)}

    def score(r):
        if r["status"] != "scored":
            return None
        return round(100 * r["scores"]["f1"], 1) if r["task"] == "inference" else r["score"]

    page.goto(view.as_uri())
    page.select_option("#f-task", label="inference")
    rows = page.locator(".row")
    assert rows.count() == 3  # one row per instance
    diffs = []
    for i in range(rows.count()):
        cells = rows.nth(i).locator("span").all_inner_texts()
        key = cells[0]
        sa, sb = score(a[key, "inference"]), score(b[key, "inference"])
        assert cells[4] == ("failed" if sa is None else f"{sa:g}") and cells[5] == f"{sb:g}"
        d = float("inf") if sa is None else round(sb - sa, 1)  # A failed where B scored: A's loss, sorted last
        diffs.append(d)
        assert cells[6] == ("A failed" if sa is None else ("+" if d > 0 else "") + f"{d:g}")
    assert diffs == sorted(diffs)  # sorted by difference, B's largest losses first
    assert "CUPID viewno" not in page.inner_text("header")  # the title and the report's note apart
    key = rows.first.locator("span").first.inner_text()
    rows.first.click()  # the unit opens on the hashchange event that follows, not within the click
    columns = page.locator(".col")
    expect(columns).to_have_count(3)  # A, B, B's reference scoring
    assert columns.nth(1).locator(".answer").text_content() == b[key, "inference"]["candidate_answer"]
    assert columns.nth(2).locator(".inferred").text_content() == b[key, "inference"]["reference"]["inferred_preference"]
    assert "A: " in columns.nth(0).inner_text() and "B: " in columns.nth(1).inner_text()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "view-compare.png"), full_page=True)

    # The other way round, B is the model that fails to parse: "where B loses most" lists its failures first.
    result = CliRunner().invoke(app, ["view", str(run_b), str(run_a), "--out", str(tmp_path / "reversed")])
    page.goto(Path(result.output.strip()).as_uri())
    page.select_option("#f-task", label="inference")
    cells = [rows.nth(i).locator("span").all_inner_texts() for i in range(rows.count())]
    lost = [c[6] == "failed" for c in cells]
    assert lost == sorted(lost, reverse=True)
    assert sum(lost) == sum(a[k]["status"] == "failed" and b[k]["status"] == "scored" for k in a if k[1] == "inference")


def test_run_in_progress_says_so(runs, page, tmp_path):
    run_a, _ = runs
    partial = tmp_path / "partial"
    shutil.copytree(run_a, partial)
    (partial / "summary.json").unlink()
    lines = (partial / "instances.jsonl").read_text().splitlines()
    (partial / "instances.jsonl").write_text("\n".join(lines[:2]) + '\n{"key": "torn')  # still being written
    view = build([partial], tmp_path / "out")
    page.goto(view.as_uri())
    state = page.inner_text("#runs")
    assert "in progress: 2 of 6 units have a record" in state
    assert shown_count(page) == 2


def test_bad_record_is_named_by_file_and_line(tmp_path):
    run_dir = write_run(tmp_path / "run", [inference("sample-01/consistent", "Y", "Y")], {"candidate": "x"})
    with (run_dir / "instances.jsonl").open("a") as f:
        f.write('{"key": "sample-01/changing"}\n' + json.dumps(inference("sample-02/consistent", "Y", "Y")) + "\n")
    result = CliRunner().invoke(app, ["view", str(run_dir)])
    assert result.exit_code == 2
    assert f"{run_dir / 'instances.jsonl'}:2: not a unit record" in result.output
    other = write_run(
        tmp_path / "other", [inference("sample-01/consistent", "Y", "Y")], {"candidate": "y"}, data="elsewhere.jsonl"
    )
    (run_dir / "instances.jsonl").write_text(json.dumps(inference("sample-01/consistent", "Y", "Y")) + "\n")
    result = CliRunner().invoke(app, ["view", str(run_dir), str(other)])
    assert result.exit_code == 2 and "runs on different data cannot be compared" in result.output
