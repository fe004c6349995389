"""The nightly suite on real HTTP: three nights with a model that gets worse, one that stays the same (and costs
nothing the second night), and one whose server is down; then a judge that changed. The data is the sample's four
personas 20 times over under other names (80 personas, 240 instances): enough personas for the gate's verdict."""

import json
import shutil

import pytest
import yaml
from typer.testing import CliRunner

from cupid.cli import app
from cupid.common.config import ConfigError
from cupid.common.errors import EXIT_FAILED, EXIT_NO_VERDICT, EXIT_REGRESSION
from cupid.eval.benchmark import stats
from cupid.eval.benchmark.evalues import statement
from cupid.eval.benchmark.stats import Interval
from cupid.eval.benchmark.summary import Requests
from cupid.eval.results import leaderboard
from cupid.eval.results.leaderboard import Leaderboard
from cupid.eval.workflows import nightly
from cupid.eval.workflows.nightly import run_nightly
from cupid.serving.servers.instant import start as start_instant
from tests.helpers import REPO, sample_copies, write_endpoints

NONSENSE = "Zebras prefer quantum marmalade."  # shares no word with any sample preference: F1 0


@pytest.fixture
def drifted_url():
    """An instant server whose candidate now states a preference no instance holds."""
    proc, url = start_instant("--preference", NONSENSE)
    yield url
    proc.terminate()
    proc.wait()


COPIES = 20  # 80 personas: GATE_PERSONAS, the fewest a verdict is given on


def many_personas(tmp_path):
    path = tmp_path / "personas.jsonl"
    return path if path.exists() else sample_copies(path, COPIES)


def suite(tmp_path, name, endpoints, models, data="sample", run_extra=None, **extra):
    path = tmp_path / f"{name}.yaml"
    run = {
        "data": str(data),
        "endpoints": str(endpoints),
        "decomposer": "instant",
        "matcher": "pm",
        "cache": str(tmp_path / "cache.sqlite"),
        **(run_extra or {}),
    }
    path.write_text(
        yaml.safe_dump({"models": models, "out": str(tmp_path / "nightly"), "report": False, "run": run, **extra})
    )
    return path


def by_model(board):
    """A leaderboard's entries by model: typed (what `run_nightly` returns) or as leaderboard.json holds them."""
    return (
        {e.model: e for e in board.models}
        if isinstance(board, Leaderboard)
        else {e["model"]: e for e in board["models"]}
    )


@pytest.mark.slow  # ~12 s (three nights on 80 personas): `make test` runs it
def test_three_nights_flag_the_drop_count_failures_and_reuse_the_cache(tmp_path, instant_url, drifted_url, cupid_home):
    common = {
        "instant": {"base_url": instant_url, "model": "instant"},
        "pm": {"base_url": instant_url, "model": "local-prefmatcher"},
    }
    before = write_endpoints(tmp_path / "before.yaml", **common,
                             steady={"base_url": instant_url, "model": "steady-v1"},
                             drifting={"base_url": instant_url, "model": "drifting-v1"})  # fmt: skip
    after = write_endpoints(
        tmp_path / "after.yaml",
        **common,
        steady={"base_url": instant_url, "model": "steady-v1"},
        drifting={"base_url": drifted_url, "model": "drifting-v2"},
        down={"base_url": "http://127.0.0.1:9/v1", "model": "down", "max_retries": 0, "timeout_s": 5},
    )

    first, code = run_nightly(
        suite(tmp_path, "n1", before, ["steady", "drifting"], data=many_personas(tmp_path)), "2025-03-01"
    )
    assert code == 0 and first.previous is None
    f1 = "inference/standard/micro_f1"
    units = 12 * COPIES
    for entry in first.models:
        assert entry.status == "ok" and (entry.n_scored, entry.n_failed) == (units, 0)
        assert entry.change == {} and entry.regressions == []
        assert (entry.baseline, entry.baseline_set) == ("2025-03-01", "the candidate's first night")
        assert entry.metrics[f1].low > 0 and entry.metrics[f1].personas == 4 * COPIES  # an interval, personas resampled

    second, code = run_nightly(
        suite(tmp_path, "n2", after, ["steady", "drifting"], data=many_personas(tmp_path)), "2025-03-02"
    )
    assert code == EXIT_REGRESSION  # a regression, no failures
    assert second.previous == "2025-03-01"
    steady, drifting = by_model(second)["steady"], by_model(second)["drifting"]
    assert steady.requests == Requests(sent=0, cached=4 * units)  # everything came from the cache
    same = steady.change[f1]  # the same answers: no difference, a closed interval, nothing to test
    assert (same.difference, same.low, same.high, same.p_value) == (0.0, 0.0, 0.0, 1.0) and steady.regressions == []
    assert drifting.metrics[f1].estimate == 0.0
    drop = drifting.change[f1]  # paired on the 48 units both nights scored
    assert (
        drop.difference == pytest.approx(-by_model(first)["drifting"].metrics[f1].estimate)
        and drop.high < 0
        and drop.headline
    )
    assert (drop.n, drop.personas) == (units, 4 * COPIES)
    assert f1 in drifting.regressions and second.regressions == [f"drifting: {f1}"]
    assert [e.model for e in second.models] == ["steady", "drifting"]  # ranked by F1
    board = (tmp_path / "nightly" / "2025-03-02" / "leaderboard.md").read_text()
    # What the night tests and bounds, stated where the verdict is read (the console prints the same page): its
    # tests, its personas, the e-values, and the rate per night it holds.
    rows = [r for e in second.models for r in (*e.change.values(), *e.baseline_change.values())]
    tests = sum(r.headline and r.gated for r in rows)
    assert second.family_level == statement(tests, 4 * COPIES, stats.GATE_ALPHA, 1) and second.family_level in board
    assert "a false REGRESSION tonight at most 2.5% of the time" in board and "a rate per night" in board
    drifting_row = next(line for line in board.splitlines() if "| drifting |" in line)
    assert (
        "**REGRESSION**" in drifting_row
        and f"{100 * drop.difference:+.1f} [{100 * drop.low:+.1f}, {100 * drop.high:+.1f}]" in drifting_row
    )
    assert (tmp_path / "nightly" / "leaderboard.json").read_text() == (
        tmp_path / "nightly" / "2025-03-02" / "leaderboard.json"
    ).read_text()

    # Night 3 through the CLI: drifting holds steady at its new level; a model whose server is down fails.
    result = CliRunner().invoke(
        app,
        [
            "nightly",
            "--config",
            str(suite(tmp_path, "n3", after, ["steady", "drifting", "down"], data=many_personas(tmp_path))),
            "--date",
            "2025-03-03",
        ],
    )
    # Failures, and drifting's drop stands against its baseline (night 1): a regressed night is never the baseline.
    assert result.exit_code == EXIT_FAILED | EXIT_REGRESSION, result.output
    third = json.loads((tmp_path / "nightly" / "2025-03-03" / "leaderboard.json").read_text())
    assert third["previous"] == "2025-03-02"
    assert third["regressions"] == [f"drifting: {f1} since the baseline (2025-03-01)"]
    assert by_model(third)["drifting"]["regressions"] == [] and by_model(third)["drifting"]["baseline"] == "2025-03-01"
    down = by_model(third)["down"]  # its server does not answer: refused before a request, with its reason
    assert (down["status"], down["n_scored"], down["n_failed"]) == ("error", 0, 0)
    assert down["metrics"] == {}  # no score at all, not a zero
    assert "candidate 'down' at http://127.0.0.1:9/v1 does not answer" in down["error"]
    assert third["models"][-1]["model"] == "down"
    assert "**DID NOT RUN**" in next(line for line in result.output.splitlines() if "| down |" in line)
    assert (
        result.output.strip()
        .splitlines()[-1]
        .startswith("nightly 2025-03-03: 3 models, 1 regression(s), 1 with failures")
    )

    # Night 4: the decomposer is another model, and drifting is good again: not comparable, never flagged.
    changed = write_endpoints(tmp_path / "changed.yaml", instant={"base_url": instant_url, "model": "instant-v2"},
                              pm={"base_url": instant_url, "model": "local-prefmatcher"},
                              steady={"base_url": instant_url, "model": "steady-v1"},
                              drifting={"base_url": instant_url, "model": "drifting-v1"})  # fmt: skip
    fourth, code = run_nightly(
        suite(tmp_path, "n4", changed, ["steady", "drifting"], data=many_personas(tmp_path)), "2025-03-04"
    )
    assert code == EXIT_NO_VERDICT and fourth.regressions == []  # no verdict is not a clean night
    assert fourth.no_verdict == ["steady", "drifting"]
    for entry in fourth.models:
        assert entry.setup_changed == ["judge decomposer: instant -> instant-v2"] and entry.regressions == []
        assert entry.no_verdict == [
            "not the same evaluation: differs: judge decomposer: instant -> instant-v2 (--allow-differs accepts it)"
        ]
        # Its baseline's setup differs too: tonight is its baseline from now on, and the leaderboard says so.
        assert (entry.baseline, entry.baseline_regressions) == ("2025-03-04", [])
        assert entry.baseline_set == "its setup changed since 2025-03-01: judge decomposer: instant -> instant-v2"
    board = (tmp_path / "nightly" / "2025-03-04" / "leaderboard.md").read_text()
    steady_row = next(line for line in board.splitlines() if "| steady |" in line)
    assert "not comparable: judge decomposer: instant -> instant-v2" in steady_row
    assert "baseline set again tonight: its setup changed since 2025-03-01" in steady_row


def test_rerunning_a_night_compares_with_the_night_before_and_writes_the_report(tmp_path, instant_url, cupid_home):
    endpoints = write_endpoints(tmp_path / "ep.yaml", instant={"base_url": instant_url, "model": "instant"},
                                pm={"base_url": instant_url, "model": "local-prefmatcher"})  # fmt: skip
    config = suite(tmp_path, "n", endpoints, ["instant"], report=True)
    run_nightly(config, "2025-03-01")
    _board, code = run_nightly(config, "2025-03-02")
    again, code_again = run_nightly(config, "2025-03-02")  # resumes in place; still compared with 03-01
    # The sample's 4 personas give no verdict (fewer than GATE_PERSONAS), and a night says so in its code.
    assert (code, code_again) == (EXIT_NO_VERDICT,) * 2 and again.previous == "2025-03-01"
    assert by_model(again)["instant"].no_verdict == [
        "inference/standard: 4 personas compared, fewer than 80 for a verdict"
    ]
    assert by_model(again)["instant"].requests.sent == 0
    assert (tmp_path / "nightly" / "2025-03-02" / "report" / "report.html").exists()


def test_bad_suites_are_refused_before_anything_runs(tmp_path, cupid_home):
    config, out = tmp_path / "bad.yaml", str(tmp_path / "nightly")
    config.write_text(yaml.safe_dump({"models": ["a"], "out": out, "run": {"candidate": "x"}}))
    with pytest.raises(ConfigError, match="run.candidate is set per model"):
        run_nightly(config, "2025-03-01")
    config.write_text(
        yaml.safe_dump(
            {"models": ["a"], "out": out, "run": {"decomposer": "d", "matcher": "m", "settings": ["sideways"]}}
        )
    )
    with pytest.raises(ConfigError, match=r"(?s)bad\.yaml: run \(for model a\).*settings"):
        run_nightly(config, "2025-03-01")
    # Faults every model shares: the night does not start, and its leaderboard says why, for each model.
    board = json.loads((tmp_path / "nightly" / "2025-03-01" / "leaderboard.json").read_text())
    assert "settings" in board["error"] and board["exit_code"] == 1
    assert [(e["model"], e["status"]) for e in board["models"]] == [("a", "error")]
    assert "**THE NIGHT DID NOT START**" in (tmp_path / "nightly" / "leaderboard.md").read_text()
    assert [p.name for p in (tmp_path / "nightly" / "2025-03-01").iterdir() if p.is_dir()] == []  # no run began
    config.write_text(yaml.safe_dump({"models": [], "colour": "red"}))
    with pytest.raises(ConfigError, match="colour"):
        run_nightly(config, "2025-03-02")
    assert not (tmp_path / "nightly" / "2025-03-02").exists()  # no readable `out`: nowhere to write
    result = CliRunner().invoke(app, ["nightly", "--config", str(config)])
    assert result.exit_code == 2 and "colour" in result.output


def test_broken_candidates_are_rows_with_their_reason_and_the_others_are_scored(tmp_path, instant_url, cupid_home):
    endpoints = write_endpoints(tmp_path / "ep.yaml", instant={"base_url": instant_url, "model": "instant"},
                                pm={"base_url": instant_url, "model": "local-prefmatcher"})  # fmt: skip
    models = [
        "instant",
        {"name": "untrained", "profile": "tiny", "adapter": str(tmp_path / "no-adapter")},  # not trained yet
        {"name": "misnamed", "profile": "no-such-profile"},
        "no-such-endpoint",
    ]
    result = CliRunner().invoke(
        app, ["nightly", "--config", str(suite(tmp_path, "n", endpoints, models)), "--date", "2025-03-01"]
    )
    assert result.exit_code == 1, result.output  # failures
    board = json.loads((tmp_path / "nightly" / "2025-03-01" / "leaderboard.json").read_text())
    entries = by_model(board)
    assert (entries["instant"]["status"], entries["instant"]["n_scored"]) == ("ok", 12)
    # The sample's 4 personas: the estimate, and no interval bounds as numbers in leaderboard.json
    f1 = entries["instant"]["metrics"]["inference/standard/micro_f1"]
    assert f1["personas"] == 4 and f1["estimate"] >= 0 and (f1["low"], f1["high"]) == (None, None)
    assert f"LoRA adapter {tmp_path / 'no-adapter'} not found" in entries["untrained"]["error"]
    assert "no-such-profile" in entries["misnamed"]["error"]
    assert "no-such-endpoint" in entries["no-such-endpoint"]["error"]
    for name in ("untrained", "misnamed", "no-such-endpoint"):
        assert entries[name]["status"] == "error" and entries[name]["metrics"] == {} and entries[name]["n_scored"] == 0
        row = next(line for line in result.output.splitlines() if f"| {name} |" in line)
        assert "**DID NOT RUN**" in row
    assert set(board["with_failures"]) == {"untrained", "misnamed", "no-such-endpoint"}


def _instant_suite(tmp_path, instant_url):
    endpoints = write_endpoints(tmp_path / "ep.yaml", instant={"base_url": instant_url, "model": "instant"},
                                pm={"base_url": instant_url, "model": "local-prefmatcher"})  # fmt: skip
    return suite(tmp_path, "n", endpoints, ["instant"])


def test_a_night_already_running_is_not_run_twice(tmp_path, instant_url, cupid_home):
    from cupid.common.files import hold

    config = _instant_suite(tmp_path, instant_url)
    with (
        hold(tmp_path / "nightly" / "2025-03-01"),  # tonight's night, started by the first cron run
        pytest.raises(ConfigError, match=r"2025-03-01 is in use by another run \(pid \d+"),
    ):
        run_nightly(config, "2025-03-01")
    assert not (tmp_path / "nightly" / "2025-03-01" / "leaderboard.json").exists()  # the running night's to write


def test_a_bad_cache_stops_the_night_with_its_reason(tmp_path, instant_url, cupid_home):
    config = _instant_suite(tmp_path, instant_url)
    (tmp_path / "cache.sqlite").write_text("not a cache")
    with pytest.raises(ConfigError, match="request cache"):
        run_nightly(config, "2025-03-02")
    board = json.loads((tmp_path / "nightly" / "2025-03-02" / "leaderboard.json").read_text())
    assert f"request cache {tmp_path / 'cache.sqlite'}: not a SQLite file" in board["error"]
    assert by_model(board)["instant"]["error"].startswith("the night did not start: request cache")


def test_the_cpu_night_dry_run_names_the_missing_weights_and_how_to_train_them(tmp_path, cupid_home, monkeypatch):
    """From a directory where `make train` has not run, neither trained candidate would run, and the dry run says
    which file is missing and which training config makes it; once the export exists, its candidate is planned."""
    monkeypatch.chdir(tmp_path)
    dry_run = ["nightly", "--dry-run", "--config", str(REPO / "configs/eval/nightly-tiny.yaml")]
    result = CliRunner().invoke(app, dry_run)
    assert result.exit_code == 0, result.output
    refusals = {line.split(" would not run: ")[0]: line for line in result.output.splitlines() if "would not" in line}
    assert set(refusals) == {"nightly: tiny-trained-lora", "nightly: tiny-trained-merged"}, result.output
    for refusal, missing in zip(refusals.values(), ("adapter", "export"), strict=True):
        assert f"{tmp_path.resolve() / 'runs/train/tiny' / missing} not found" in refusal, refusal
        assert refusal.endswith("train it first: cupid train run --config configs/train/tiny.yaml"), refusal
    (tmp_path / "runs/train/tiny/export").mkdir(parents=True)  # what the training's export writes
    result = CliRunner().invoke(app, dry_run)
    assert "tiny-trained-merged would not run" not in result.output
    assert "tiny-trained-merged: tiny-trained-merged@" in result.output  # in the plan's candidates


def test_a_zero_estimate_ranks_above_a_candidate_without_figures(tmp_path):
    """An F1 of 0.0 is a figure: it ranks above a candidate that did not run, whichever came first."""
    primary = "inference/standard/micro_f1"
    zero = leaderboard.Entry(model="zero", primary=primary, metrics={primary: Interval(0.0, 0.0, 0.0, 12)})
    entries = [nightly.not_run("down", "no server"), zero]
    board = leaderboard.assemble("2025-03-01", tmp_path, None, "n.yaml", entries)
    assert [e.model for e in board.models] == ["zero", "down"]
    assert [e.model for e in entries] == ["down", "zero"]  # ranked into the board, the caller's list left as it was


@pytest.mark.slow  # ~17 s (up to nine nights on 80 personas): `make test` runs it
def test_a_slow_drift_no_night_shows_is_flagged_against_the_baseline(tmp_path, instant_url, cupid_home):
    """Each night the candidate answers a preference that matches nothing for eight more personas (of 80, whose F1s
    differ: the drop is spread unevenly): too little for one night's change to be flagged, and flagged against its
    first night once it adds up. A regressed night never becomes the baseline. (Leaving those personas unanswered
    instead would be flagged the first night: more than 1% more units unanswered.)"""
    data = sample_copies(tmp_path / "marked.jsonl", COPIES, marked=True)
    run = {"data": str(data), "decomposer": "instant", "matcher": "pm", "tasks": ["inference"],
           "settings": ["standard"], "cache": str(tmp_path / "cache.sqlite")}  # fmt: skip
    f1 = "inference/standard/micro_f1"
    servers, boards = [], []
    try:
        for night in range(1, 10):
            broken = []  # 8 more personas each night, of those with something to lose (F1 > 0 on night 1)
            if boards:
                first = [json.loads(line) for line in (tmp_path / "nightly/2025-04-01/drifting/instances.jsonl").open()]
                losing = sorted({r["persona_id"] for r in first if r["scores"]["f1"] > 0})
                broken = losing[: 8 * (night - 1)]
            url = instant_url
            if broken:
                proc, url = start_instant("--nonsense-for", r"\(case (" + "|".join(broken) + r")\)")
                servers.append(proc)
            endpoints = write_endpoints(tmp_path / f"ep{night}.yaml",
                                        instant={"base_url": instant_url, "model": "instant"},
                                        pm={"base_url": instant_url, "model": "local-prefmatcher"},
                                        drifting={"base_url": url, "model": f"drifting-v{night}"})  # fmt: skip
            config = tmp_path / f"n{night}.yaml"
            nightly_config = {"models": ["drifting"], "out": str(tmp_path / "nightly"), "report": False}
            config.write_text(yaml.safe_dump({**nightly_config, "run": {**run, "endpoints": str(endpoints)}}))
            board, code = run_nightly(config, f"2025-04-0{night}")
            boards.append(by_model(board)["drifting"])
            if boards[-1].baseline_regressions:
                break
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait()
    flagged = boards[-1]
    assert flagged.baseline_regressions == [f1] and code == EXIT_REGRESSION, [b.baseline_regressions for b in boards]
    assert len(boards) >= 3  # not at once: the first nights' drops were too small
    for entry in boards:
        assert entry.regressions == []  # no night's change alone was flagged
        assert entry.baseline == "2025-04-01"  # regressed nights included: the baseline stays the first night
    drops = [entry.change[f1].difference for entry in boards[1:]]
    assert all(d < 0 for d in drops) and flagged.baseline_change[f1].difference == pytest.approx(sum(drops))
    row = next(
        line for line in (tmp_path / "nightly" / "leaderboard.md").read_text().splitlines() if "| drifting |" in line
    )
    assert "**REGRESSION** since the baseline (2025-04-01)" in row and "since 2025-04-01" in row


@pytest.mark.slow  # ~13 s (seven nights on 80 personas): `make test` runs it
def test_every_candidate_stays_watched_under_a_fixed_baseline(tmp_path, instant_url, drifted_url, cupid_home):
    """`baseline:` fixed at the first night. A candidate that joins later is compared with its own first night; a
    judge change moves a candidate's baseline to its first night with the new judge, and the previous-night test still
    runs; a baseline run that was deleted gives no baseline verdict that night, said so. A drop to F1 0 is flagged in
    each case, and the leaderboard says what it was compared with."""
    data = many_personas(tmp_path)
    f1 = "inference/standard/micro_f1"

    def night(date, judge="instant", **models):
        endpoints = write_endpoints(
            tmp_path / f"endpoints-{date}.yaml",
            instant={"base_url": instant_url, "model": judge},
            pm={"base_url": instant_url, "model": "local-prefmatcher"},
            **{name: {"base_url": url, "model": f"{name}-{url[-10:]}"} for name, url in models.items()},
        )
        path = suite(tmp_path, date, endpoints, list(models), data=data, baseline="2025-05-01",
                     run_extra={"tasks": ["inference"], "settings": ["standard"]})  # fmt: skip
        return run_nightly(path, date)

    board, code = night("2025-05-01", early=instant_url)
    assert code == 0 and by_model(board)["early"].baseline == "2025-05-01"
    board, code = night("2025-05-02", early=instant_url, late=instant_url)  # late joins after the baseline night
    late = by_model(board)["late"]
    assert code == 0 and (late.baseline, late.baseline_set) == ("2025-05-02", "the candidate's first night")
    board, code = night("2025-05-03", early=instant_url, late=drifted_url)
    late = by_model(board)["late"]
    assert late.regressions == [f1] and code == EXIT_REGRESSION, late  # compared with its own first night
    row = next(line for line in (tmp_path / "nightly/leaderboard.md").read_text().splitlines() if "| late |" in line)
    assert "**REGRESSION**" in row

    # The judge changes: no verdict tonight against either night, and tonight becomes each one's baseline.
    board, code = night("2025-05-04", judge="instant-v2", early=instant_url, late=instant_url)
    early = by_model(board)["early"]
    assert early.no_verdict and early.baseline_no_verdict == ["its setup changed since 2025-05-01"]
    assert early.baseline == "2025-05-04" and early.baseline_set.startswith("its setup changed since 2025-05-01")
    assert code == EXIT_NO_VERDICT
    # The next night, under the new judge, a drop is flagged against the previous night and the new baseline (the
    # same night: one test), the config's baseline notwithstanding.
    board, code = night("2025-05-05", judge="instant-v2", early=drifted_url, late=instant_url)
    early = by_model(board)["early"]
    assert early.regressions == [f1] and early.baseline == "2025-05-04" and code == EXIT_REGRESSION

    # The baseline run of `late` is deleted: no baseline verdict, said so; the previous-night test flags the drop,
    # and a flagged night does not become the baseline.
    night("2025-05-06", judge="instant-v2", early=instant_url, late=instant_url)
    shutil.rmtree(tmp_path / "nightly/2025-05-04/late")
    board, code = night("2025-05-07", judge="instant-v2", early=instant_url, late=drifted_url)
    late = by_model(board)["late"]
    assert late.regressions == [f1] and code == EXIT_REGRESSION | EXIT_NO_VERDICT
    assert late.baseline_no_verdict == [
        "no run of 2025-05-04",
        "tonight was flagged: it does not become the baseline",
    ]
    assert late.baseline == "2025-05-04" and late.baseline_set is None
    row = next(line for line in (tmp_path / "nightly/leaderboard.md").read_text().splitlines() if "| late |" in line)
    assert "**NO VERDICT** since the baseline: no run of 2025-05-04" in row and "**REGRESSION**" in row


@pytest.mark.slow  # ~40 s (three nights of 20 candidates): the whole suite runs it, `make check` does not
def test_twenty_candidates_flag_both_collapses_a_skipped_night_keeps_its_baseline(
    tmp_path, instant_url, drifted_url, cupid_home
):
    """20 candidates, both tasks, 80 personas: 18 that never change, one that collapses on night 3, and one that
    skips night 2 and collapses on night 3. Night 3 holds 78 headline tests (smallest threshold 0.025/78): both
    collapses are flagged, the skipped candidate against the baseline it kept, and no unchanged one."""
    data = many_personas(tmp_path)
    steady = [f"steady-{i:02d}" for i in range(18)]
    f1 = "inference/standard/micro_f1"
    both = {"tasks": ["inference", "generation"], "settings": ["standard"], "judge": "instant"}

    def night(date, models, drifted=()):
        endpoints = write_endpoints(
            tmp_path / f"endpoints-{date}.yaml",
            instant={"base_url": instant_url, "model": "instant"},
            pm={"base_url": instant_url, "model": "local-prefmatcher"},
            **{
                name: {"base_url": drifted_url, "model": "drifted"}
                if name in drifted
                else {"base_url": instant_url, "model": "steady"}  # one model's answers: the cache's after the first
                for name in models
            },
        )
        return suite(tmp_path, date, endpoints, models, data=data, run_extra=both)

    assert run_nightly(night("2025-06-01", [*steady, "collapsing", "skipper"]), "2025-06-01")[1] == 0
    assert run_nightly(night("2025-06-02", [*steady, "collapsing"]), "2025-06-02")[1] == 0
    third = night("2025-06-03", [*steady, "collapsing", "skipper"], drifted=("collapsing", "skipper"))
    result = CliRunner().invoke(app, ["nightly", "--config", str(third), "--date", "2025-06-03"])
    assert result.exit_code == EXIT_REGRESSION, result.output
    board = Leaderboard.read(tmp_path / "nightly" / "2025-06-03" / "leaderboard.json")
    entries = by_model(board)
    # The drifted candidate's answers score lower in both tasks. Micro F1 falls to 0 and is flagged; the judge's
    # score falls by 0.75 of its 9 points, under the 1.2 the family of 78 states it finds at 80 personas (a test
    # valid for any law of changes allows for a persona moving the whole 1-10 range), and is said so, not flagged.
    heads = [f1]
    score = entries["collapsing"].change["generation/standard/mean_score"]
    assert -score.difference < score.detectable and not score.regression and score.e_value > 1
    assert (entries["collapsing"].regressions, entries["collapsing"].baseline_regressions) == (heads, heads)
    skipper = entries["skipper"]  # compared with the baseline it kept through the night it skipped
    assert (skipper.baseline, skipper.baseline_set, skipper.change) == ("2025-06-01", None, {})
    assert skipper.no_previous == "not in 2025-06-02: no test since last night" and skipper.no_verdict == []
    assert skipper.baseline_regressions == heads and skipper.regressions == []
    assert board.regressions == [
        *(f"collapsing: {h}" for h in heads),
        *(f"{name}: {h} since the baseline (2025-06-01)" for name in ("collapsing", "skipper") for h in heads),
    ]
    assert board.no_verdict == [] and all(entries[name].baseline == "2025-06-01" for name in steady)
    row = next(line for line in result.output.splitlines() if "| skipper |" in line)
    assert "not in 2025-06-02: no test since last night" in row and "**REGRESSION** since the baseline" in row

    # Every headline test of the night is one Holm family at the gate's level: the collapses' e-values clear the
    # family's smallest threshold, 78 / 0.025, and every unchanged candidate's stays at 1 (no change: no wealth).
    tested = [
        row
        for e in board.models
        for changes in (e.change, e.baseline_change)
        for row in changes.values()
        if row.headline and row.gated
    ]
    assert len(tested) == 18 * 2 * 2 + 2 * 2 + 2 >= 40
    flagged = [row for row in tested if row.regression]
    assert len(flagged) == 3 and all(row.e_value >= len(tested) / stats.GATE_ALPHA for row in flagged)
    assert all(row.e_value == pytest.approx(1.0) and row.p_holm == 1.0 for row in tested if row.difference == 0)


@pytest.mark.slow  # ~25 s (two nights, each with its report and the tracker's pages): `make test` runs it
def test_a_night_reads_each_run_once_with_its_report_and_tracker(tmp_path, instant_url, cupid_home, monkeypatch):
    # Two candidates over two nights, with the report and the tracker on: tonight's runs are read once each (when the
    # run claims its directory), then compared, reported and logged as read; last night's once each, for the test.
    pytest.importorskip("mlflow")
    from cupid.eval.benchmark.rundir import RunDir

    monkeypatch.chdir(tmp_path)  # MLflow puts its artifacts under the working directory
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    reads: dict[str, int] = {}
    real = RunDir.records

    def counted(self):
        if self.records_file.exists():  # a directory about to be claimed holds nothing to read
            key = f"{self.path.parent.name}/{self.path.name}"
            reads[key] = reads.get(key, 0) + 1
        return real(self)

    monkeypatch.setattr(RunDir, "records", counted)
    endpoints = write_endpoints(
        tmp_path / "ep.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
        one={"base_url": instant_url, "model": "one"},
        two={"base_url": instant_url, "model": "two"},
    )
    for night, last in (("2025-07-01", None), ("2025-07-02", "2025-07-01")):
        config = suite(tmp_path, night, endpoints, ["one", "two"], track="mlflow")
        config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "report": True}))
        reads.clear()
        board, code = run_nightly(config, night)
        pages = [tmp_path / "nightly" / night / name / "report" / page for name in ("one", "two")
                 for page in ("report.html", "view.html")]  # fmt: skip
        assert board.report and all(page.exists() for page in pages)  # the tracker's pages, made from the runs read
        assert code == (0 if last is None else EXIT_NO_VERDICT)  # the sample's 4 personas: no verdict
        expected = {f"{last}/{name}": 1 for name in ("one", "two")} if last else {}  # last night's, for the test
        assert reads == expected, reads  # tonight's: none beyond the claim, which found no records yet
