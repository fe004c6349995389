"""The HTML report: a real run (instant server: inference + generation, standard + oracle, with a reference
scoring) over the sample's personas twice under other names renders tables, intervals, failures and the three figures;
under 10 personas a table says there is no interval instead of printing one."""

import base64
import json
import re
import shutil

import pytest
from typer.testing import CliRunner

from cupid.cli import app
from cupid.common.files import write_atomic
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.runner import RunConfig, run
from cupid.eval.results.report import build
from tests.helpers import sample_copies, write_endpoints
from tests.run_records import generation, inference, scoring, write_run

IMG = re.compile(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">')


@pytest.fixture(scope="module")
def scored_run(tmp_path_factory, instant_url):
    tmp = tmp_path_factory.mktemp("report")
    endpoints = write_endpoints(
        tmp / "endpoints.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
        judge={"base_url": instant_url, "model": "judge"},
        ref={"base_url": instant_url, "model": "ref-4o", "matcher_prompt": "fewshot"},
    )
    cfg = RunConfig(
        data=str(sample_copies(tmp / "personas.jsonl", 3)),
        endpoints=str(endpoints),
        candidate="instant",
        decomposer="instant",
        matcher="pm",
        judge="judge",
        reference="ref",
        tasks=["inference", "generation"],
        settings=["standard", "oracle"],
        out=str(tmp / "run"),
        cache=str(tmp / "cache.sqlite"),
    )
    summary = run(cfg).summary
    assert summary.n_failed == 0
    return tmp / "run", summary


def images(html: str) -> dict[str, bytes]:
    return {alt: base64.b64decode(data) for alt, data in IMG.findall(html)}


def test_report_of_a_real_run_has_tables_intervals_and_three_figures(scored_run, tmp_path):
    run_dir, summary = scored_run
    page = build([run_dir], tmp_path / "out")
    html = page.read_text()
    assert html.count("<table") >= 5  # runs, inference, inference (reference), generation, generation (reference)
    micro = summary.tasks["inference"].overall.micro.as_dict()
    # The standard/all row: the summary's micro P/R/F1, each followed by its interval.
    row = re.search(r'<td class="l">standard</td><td class="l">all</td>\s*(.*?)</tr>', html, re.DOTALL).group(1)
    cells = re.findall(r"<td>([\d.]+) <small>\[([\d.]+), ([\d.]+)\]</small></td>", row)
    assert [c[0] for c in cells[:3]] == [f"{100 * micro[k]:.1f}" for k in ("precision", "recall", "f1")]
    for estimate, low, high in cells:
        assert float(low) <= float(estimate) <= float(high)
    assert (
        "Inference: preference match, reference scoring (ref-4o)" in html
        and "Generation: judge score, judge judge" in html
    )
    assert "No failures: all 144 records scored." in html  # 2 tasks x 2 settings x 36 instances
    assert "personas resampled" in html and "no interval" not in html  # 12 personas
    figures = images(html)
    assert set(figures) == {
        "Fig. 3: F1 against the mean position of the relevant sessions",
        "Fig. 4: F1 under two matchers",
        "Fig. 5: inference against generation per model",
    }
    for png in figures.values():
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
    written = {p.name: p.read_bytes() for p in page.parent.glob("*.png")}
    assert sorted(written) == [
        "fig3_f1_vs_position.png",
        "fig4_f1_two_matchers.png",
        "fig5_inference_vs_generation.png",
    ]
    assert set(written.values()) == set(figures.values())  # the page embeds exactly the files written


def test_failures_are_listed_and_kept_out_of_the_scores(tmp_path):
    records = [
        inference("p1/consistent", "YY", "YY"),
        inference("p2/consistent", "PN", "Y"),
        inference("p3/changing", failed="parse_preference"),
        inference("p4/changing", failed="parse_preference"),
        generation("p1/consistent", 8),
        generation("p2/consistent", None),
    ]
    page = build(
        [write_run(tmp_path / "r", records, {"candidate": "m", "matcher": "pm", "judge": "j"})], tmp_path / "out"
    )
    html = page.read_text()
    # Micro over the two scored instances only: P = (2 + 0.5)/4, R = (2 + 1)/3.
    p, r = 2.5 / 4, 3 / 3
    row = re.search(
        r'<td class="l">standard</td><td class="l">all</td>\s*<td>([\d.]+) .*?<td>([\d.]+) .*?<td>([\d.]+) ',
        html,
        re.DOTALL,
    )
    assert row.groups() == (f"{100 * p:.1f}", f"{100 * r:.1f}", f"{100 * 2 * p * r / (p + r):.1f}")
    assert re.search(r"<td>2</td><td class=\"failed\">2</td>", html)  # scored 2, failed 2
    assert re.search(
        r"inference / standard</td><td class=\"l\">parse_preference: parse_error</td><td class=\"failed\">2</td>", html
    )
    assert re.search(
        r"generation / standard</td><td class=\"l\">judge: parse_error</td><td class=\"failed\">1</td>", html
    )
    assert "8.00 <small>(1 personas: no interval)</small>" in html  # the failed judge is not a zero in the mean
    assert "Not drawn: no candidate model was scored under two matchers" in html


def test_relevant_sessions_come_from_the_data_for_older_records(scored_run, tmp_path):
    run_dir, _ = scored_run
    old = tmp_path / "old"
    shutil.copytree(run_dir, old, ignore=shutil.ignore_patterns("report*"))
    lines = [json.loads(x) for x in (old / "instances.jsonl").read_text().splitlines()]
    for record in lines:
        record.pop("relevant_sessions", None)
    (old / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    html = build([old], tmp_path / "a").read_text()
    assert "Fig. 3: F1 against the mean position of the relevant sessions" in images(html)
    identity = json.loads((old / "run.json").read_text())
    (old / "run.json").write_text(json.dumps({**identity, "data": str(tmp_path / "gone.jsonl")}))
    html = build([old], tmp_path / "b").read_text()
    assert "Fig. 3: F1 against the mean position of the relevant sessions" not in images(html)
    assert "records lack relevant_sessions and data" in html and "gone.jsonl" in html


def test_a_report_across_runs_draws_every_figure_over_all_of_them(tmp_path):
    runs = []
    for i, (own, ref, score) in enumerate((("YY", "YP", 8), ("YP", "PP", 6), ("NN", "NP", 3))):
        records = [
            inference(f"p{k}/consistent", own, own, relevant=(k, 7), reference=scoring(ref, ref)) for k in range(3)
        ]
        records += [generation(f"p{k}/consistent", score) for k in range(3)]
        runs.append(
            write_run(
                tmp_path / f"m{i}",
                records,
                {"candidate": f"m{i}", "matcher": "pm", "judge": "j", "reference": "gpt-4o"},
            )
        )
    result = CliRunner().invoke(app, ["report", *map(str, runs), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    page = tmp_path / "out" / "report.html"
    assert result.output.strip().splitlines()[-1] == str(page)
    html = page.read_text()
    assert len(images(html)) == 3
    # Mean relevant positions (k + 7)/2 for k = 0, 1, 2: 3.5 in [3, 4), 4 and 4.5 in [4, 5); three runs.
    assert "Instances per bin (all runs): [3, 4): 3, [4, 5): 6." in html
    assert "one point per candidate model (3)" in html


def test_a_report_of_a_missing_or_empty_run_directory_is_a_usage_error(tmp_path):
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and f"{tmp_path / 'nothing'}: no such run directory" in missing.output
    (tmp_path / "empty").mkdir()
    empty = CliRunner().invoke(app, ["report", str(tmp_path / "empty")])
    assert empty.exit_code == 2 and f"{tmp_path / 'empty' / 'instances.jsonl'}: no such file" in empty.output


def test_a_report_cut_short_leaves_no_half_report_and_ctrl_c_is_one_line(tmp_path, monkeypatch):
    """Interrupted while writing (here: at its second file), the report takes back what it added and the command says
    so in one line, exit 130; a directory that held a report keeps it whole."""
    records = [inference(f"p{k}/consistent", "YY", "YP", relevant=(k, 7)) for k in range(3)]
    records += [generation(f"p{k}/consistent", 6) for k in range(3)]
    run_dir = write_run(tmp_path / "m", records, {"candidate": "m", "matcher": "pm", "judge": "j"})
    from cupid.eval.results import report

    written = []

    def interrupted(path, content):
        if written:
            raise KeyboardInterrupt
        written.append(path)
        write_atomic(path, content)

    monkeypatch.setattr(report, "write_atomic", interrupted)
    out = tmp_path / "out"
    cut = CliRunner().invoke(app, ["report", str(run_dir), "--out", str(out)])
    assert cut.exit_code == 130 and cut.output.strip().splitlines() == [f"interrupted: no report written in {out}"]
    assert written and not [p for p in out.rglob("*") if p.is_file()]  # the first file, written whole, taken back
    monkeypatch.undo()
    whole = build([run_dir], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(report, "write_atomic", interrupted)
    written.clear()
    assert CliRunner().invoke(app, ["report", str(run_dir), "--out", str(out)]).exit_code == 130
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and whole.exists()


def test_a_figure_a_task_declares_reaches_every_output(scored_run, tmp_path):
    """`missed` (the share of inference units with F1 = 0), declared in the task's module alone (its column, its
    statistic's name, its summary field), reaches summary.json, the report, `cupid compare`'s rows and the tracker's
    names, as the share counted here by hand."""
    from cupid.eval.benchmark.summary import Summary, summary_metrics
    from cupid.eval.results.track import interval_metrics

    run_dir, _ = scored_run
    lines = (run_dir / "instances.jsonl").read_text().splitlines()
    standard = [r for r in map(json.loads, lines) if r["task"] == "inference" and r["setting"] == "standard"]
    by_hand = sum(r["scores"]["f1"] == 0 for r in standard) / len(standard)
    assert 0 < by_hand < 1  # some preferences missed, not all: a wrong share cannot pass by being 0 or 1

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["inference"]["settings"]["standard"]["missed"] == pytest.approx(by_hand)
    macro = (run_dir / "summary.md").read_text().split("macro (%)")[1]  # summary.md's macro table, of per-unit scores
    headers, all_row = (
        next(line for line in macro.splitlines() if line.startswith(start)) for start in ("| inst", "| all")
    )
    cells = dict(zip(headers.strip("|").split(" | "), all_row.strip("|").split(" | "), strict=True))
    assert cells["standard F1=0"].strip() == f"{100 * by_hand:.1f}"

    html = build([run_dir], tmp_path / "out").read_text()
    header = re.search(r"<h3>Inference: preference match, matcher .*?</h3>\s*<table><tr>(.*?)</tr>", html, re.S)
    headers = re.findall(r"<th(?: class=\"l\")?>([^<]+)</th>", header.group(1))
    row = re.search(r'<td class="l">standard</td><td class="l">all</td>\s*(.*?)</tr>', html, re.DOTALL).group(1)
    cells = re.findall(r"<td>([\d.]+) <small>", row)
    assert cells[headers.index("missed") - 2] == f"{100 * by_hand:.1f}"  # after the setting and group columns

    compared = json.loads(CliRunner().invoke(app, ["compare", str(run_dir), str(run_dir), "--json"]).output)
    (missed,) = [
        r for r in compared["rows"] if (r["setting"], r["instance_type"], r["metric"]) == ("standard", None, "missed")
    ]
    assert missed["task"] == "inference" and missed["a"] == pytest.approx(by_hand) and missed["difference"] == 0

    tracked = summary_metrics(Summary.model_validate(summary))
    assert tracked["inference/standard/missed"] == pytest.approx(by_hand)
    bounds = interval_metrics([UnitRecord.model_validate_json(line) for line in lines])
    assert bounds["inference/standard/missed_low"] <= by_hand <= bounds["inference/standard/missed_high"]
