"""The Python API on the real tiny model under vLLM: PrefMatcher from blocking code, from async code and from
inside a running event loop (the notebook case) gives the labels `cupid eval run` computed for the same inputs;
the installed wheel holds one top-level package and works away from the checkout."""

import asyncio
import json
import subprocess
import sys
import zipfile

import aiohttp
import httpx
import pytest

import cupid
from cupid.common.config import ConfigError
from cupid.eval.benchmark.records import StageError
from cupid.eval.benchmark.runner import RunConfig, run
from cupid.eval.benchmark.stages import StageFailed
from cupid.eval.benchmark.summary import Requests
from cupid.matcher.parse import MatchItem
from cupid.serving.endpoint import Endpoint
from cupid.serving.servers import lora
from tests.helpers import REPO, tiny_lora_rank, write_endpoints

LABELS = {"Fully Covered", "Partially Covered", "Not Covered"}


@pytest.fixture
def judged(endpoints, tmp_path, cupid_home):
    """One instance scored by `cupid eval run`'s runner: the session's model (held to the formats) as matcher, the
    instant server as decomposer (its checklist is matched; the random model's held answer is an empty one)."""
    cache = tmp_path / "cache.sqlite"
    cfg = RunConfig(
        endpoints=str(endpoints),
        candidate="instant",
        decomposer="instant",
        matcher="tinyformat",
        limit=1,
        out=str(tmp_path / "run"),
        cache=str(cache),
    )
    run(cfg)
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "instances.jsonl").read_text().splitlines()]
    assert record["status"] == "scored", record.get("error")
    return record, cache


def tiny_endpoint(tiny_server) -> Endpoint:
    return Endpoint(**tiny_server, structured_output=True)


def test_prefmatcher_sync_async_and_inside_a_running_loop_equal_the_run(judged, tiny_server, instant_url):
    record, cache = judged
    assert record["inferred_checklist"] and record["gt_to_infer"]  # both directions were matched
    pm = cupid.PrefMatcher(
        tiny_endpoint(tiny_server), decomposer=Endpoint(base_url=instant_url, model="instant"), cache=cache
    )
    assert pm.dialect == "fewshot"  # from the endpoint's model name, as the run chose it
    want_infer = [MatchItem(**m) for m in record["infer_to_gt"]]
    want_gt = [MatchItem(**m) for m in record["gt_to_infer"]]

    assert pm.labels(record["gt_preference"], record["inferred_checklist"]) == want_infer

    async def notebook_cell():  # a loop is running here: the blocking API must not try to block it (it would raise)
        blocking = pm.labels(record["inferred_preference"], record["gt_checklist"])
        awaited = await pm.alabels(record["inferred_preference"], record["gt_checklist"])
        batch = await pm.alabels_batch(
            [
                (record["gt_preference"], record["inferred_checklist"]),
                (record["inferred_preference"], record["gt_checklist"]),
            ]
        )
        scored = pm.score(record["inferred_preference"], record["gt_preference"], record["gt_checklist"])
        await pm.aclose()
        return blocking, awaited, batch, scored

    blocking, awaited, batch, scored = asyncio.run(notebook_cell())
    assert blocking == awaited == want_gt
    assert [labels.items for labels in batch] == [want_infer, want_gt] and all(labels.scored for labels in batch)
    assert scored.status == "scored"
    assert scored.inferred_checklist == record["inferred_checklist"]
    assert scored.scores.as_dict() == record["scores"] and vars(scored.counts) == record["counts"]


def test_prefmatcher_from_a_base_url_sends_and_reports_failures_as_data(tiny_server, tmp_path):
    """No cache: real requests. The served model is found on the server; held to the format, the random-weight model's
    labels parse; cut short at 16 tokens, its answer cannot, which the batch form returns as a failed item with its
    `StageError`, never as labels."""
    pm = cupid.PrefMatcher(tiny_server["base_url"], structured_output=True, max_tokens=64)
    assert pm.endpoint.model == tiny_server["model"]
    items = ["Is the answer short?", "Does it use bullet points?"]
    labels = pm.labels("Prefers short answers in bullet points", items)
    assert [m.entry for m in labels] == items and {m.label for m in labels} <= LABELS
    free = cupid.PrefMatcher(
        tiny_server["base_url"], matcher_prompt="prefmatcher", max_tokens=16
    )  # cut short: unparseable
    (outcome,) = free.labels_batch([("Prefers short answers", items)])
    assert outcome.status == "failed" and outcome.items is None and isinstance(outcome.error, StageError)
    assert (outcome.error.stage, outcome.error.reason) == ("match", "parse_error")
    with pytest.raises(StageFailed):
        free.labels("Prefers short answers", items)
    with pytest.raises(ConfigError, match="needs a decomposer"):
        pm.score("a", "b", ["c?"])
    assert not list(tmp_path.iterdir())  # no cache given: nothing written


def test_a_base_url_names_its_base_model_while_a_lora_adapter_is_loaded_into_it(
    tiny_server, random_model_dir, tmp_path
):
    """vLLM lists a LoRA adapter loaded at run time beside its base (with a `parent`): the URL still means the base."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(random_model_dir)
    get_peft_model(base, LoraConfig(r=tiny_lora_rank(), target_modules=["q_proj", "v_proj"])).save_pretrained(
        tmp_path / "adapter"
    )
    url = tiny_server["base_url"]
    lora.load_lora(url, "api-test-adapter", tmp_path / "adapter")
    try:
        listed = httpx.get(url + "/models").json()["data"]
        assert {"api-test-adapter", tiny_server["model"]} <= {m["id"] for m in listed}  # two models listed now
        assert cupid.endpoint(url).model == cupid.PrefMatcher(url).endpoint.model == tiny_server["model"]
    finally:
        lora.unload_lora(url, "api-test-adapter")


def test_load_dataset_filters_by_type_and_limit():
    data = cupid.load_dataset("sample", types=["changing"], limit=2)
    assert [i.instance_type for i in data.instances] == ["changing", "changing"] and not data.bad_rows


def test_endpoint_resolves_shipped_names_only():
    shipped = cupid.endpoint("prefmatcher")  # configs/endpoints.yaml, found from any directory
    assert shipped.model == "kixlab/prefmatcher-7b" and shipped.structured_output
    with pytest.raises(ConfigError, match="no endpoint named 'nobody'"):
        cupid.endpoint("nobody")


def test_the_wheel_holds_one_package_and_works_outside_the_checkout(tmp_path, tiny_server):
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(REPO)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        files = [line.split(",")[0] for line in z.read(record).decode().splitlines()]
    top = {f.split("/")[0] for f in files if not f.split("/")[0].endswith(".dist-info")}
    assert top == {"cupid"}
    assert {
        "cupid/configs/serve/tiny.yaml",
        "cupid/eval/benchmark/sample/cupid_sample.jsonl",
        "cupid/matcher/prompts/prefmatcher.user.txt",
    } <= set(files)

    target, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target), "CUPID_HOME": str(tmp_path / "home"), "COLUMNS": "300"}

    def python(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *args], cwd=elsewhere, env=env, check=False, capture_output=True, text=True, timeout=300
        )

    where = python("-c", "import cupid, cupid.eval; print(cupid.__file__); print(cupid.eval.__file__)")
    assert where.stdout.split() == [
        str(target / "cupid" / "__init__.py"),
        str(target / "cupid" / "eval" / "__init__.py"),
    ], where.stderr
    checked = python("-m", "cupid", "eval", "check-data", "sample")
    assert checked.returncode == 0 and "12 valid instances" in checked.stdout, checked.stderr
    planned = python("-m", "cupid", "serve", "up", "--profile", "tiny", "--dry-run")
    assert planned.returncode == 0 and "smollm2-135m-instruct" in planned.stdout, planned.stderr
    script = (
        "import cupid; pm = cupid.PrefMatcher({url!r}, structured_output=True, max_tokens=64); "
        "print([m.label for m in pm.labels('Prefers short answers', ['Is the answer short?'])])"
    )
    asked = python("-c", script.format(url=tiny_server["base_url"]))
    assert asked.returncode == 0, asked.stderr[-3000:]
    assert set(eval(asked.stdout)) <= LABELS and len(eval(asked.stdout)) == 1
    assert not (elsewhere / "configs").exists() and not list(elsewhere.iterdir())


def test_evaluate_equals_the_cli_run_and_writes_nothing_without_out(instant_url, tmp_path, monkeypatch):
    endpoints = write_endpoints(
        tmp_path / "ep.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
    )
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("CUPID_HOME", str(home))
    monkeypatch.chdir(work)
    settings = ["standard", "oracle"]
    cli = run(
        RunConfig(
            endpoints=str(endpoints),
            candidate="instant",
            decomposer="instant",
            matcher="pm",
            settings=settings,
            tasks=["inference", "generation"],
            judge="instant",
            out=str(tmp_path / "cli"),
            cache=None,
        )
    ).summary
    cli_records = {
        (r["key"], r["task"], r["setting"]): r
        for r in map(json.loads, (tmp_path / "cli" / "instances.jsonl").read_text().splitlines())
    }

    # roles as a name, an Endpoint object and a base URL; no out, no cache: nothing is written anywhere
    result = cupid.evaluate(
        "instant",
        decomposer=Endpoint(base_url=instant_url, model="instant"),
        matcher="pm",
        judge=instant_url,
        endpoints_file=endpoints,
        settings=settings,
        tasks=["inference", "generation"],
        progress=False,
    )
    assert not list(work.iterdir()) and not home.exists() and result.out is None
    for part in ("tasks", "n_instances", "n_runs", "n_scored", "n_failed", "failures"):
        assert getattr(result.summary, part) == getattr(cli, part), part
    assert result.summary.n_scored == 12 * 2 * 2 and list(result.summary.tasks) == ["inference", "generation"]
    assert result.tables == cupid.RunResult([], cli, None).tables
    assert result.summary.roles["decomposer"] == "decomposer (instant)"  # an object is bound under its role's name
    assert {r.unit for r in result.records} == cli_records.keys()
    for record in result.records:
        assert record.model_dump(mode="json", exclude_none=True) == cli_records[record.unit]

    async def notebook_cell():  # blocking evaluate inside a running loop, then the async form
        blocking = cupid.evaluate(
            "instant",
            decomposer="instant",
            matcher="pm",
            endpoints_file=endpoints,
            limit=2,
            out=tmp_path / "api",
            progress=False,
        )
        awaited = await cupid.aevaluate(
            "instant",
            decomposer="instant",
            matcher="pm",
            endpoints_file=endpoints,
            limit=2,
            out=tmp_path / "api",
            progress=False,
        )
        return blocking, awaited

    blocking, awaited = asyncio.run(notebook_cell())
    assert (
        blocking.out == tmp_path / "api" and len((tmp_path / "api" / "instances.jsonl").read_text().splitlines()) == 2
    )
    assert awaited.summary.requests == Requests(sent=0, cached=0)  # resumed: both units were scored
    assert awaited.summary.tasks == blocking.summary.tasks
    with pytest.raises(ValueError, match="needs endpoints for decomposer"):
        cupid.evaluate("instant", matcher="pm", endpoints_file=endpoints)


SCRIPT = """
import asyncio, sys
import aiohttp
import cupid
from cupid.serving.client import Client

url, mode, cache = sys.argv[1], sys.argv[2], sys.argv[3]
tiny = cupid.endpoint(url, structured_output=True, max_tokens=64)
pair = ("Prefers short answers", ["Is the answer short?"])
run = dict(matcher=tiny, decomposer=tiny, limit=1, settings=["oracle"], progress=False)

if mode == "leak":  # the control: a client whose session is never closed
    asyncio.run(Client({"m": tiny}).chat("m", [{"role": "user", "content": "Hi"}], max_tokens=4))
    sys.exit(0)

pm = cupid.PrefMatcher(tiny, cache=cache)
print(pm.labels(*pair))  # blocking, never closed: opens and closes its own connections
print(asyncio.run(pm.alabels(*pair)))  # async, never closed: closed when asyncio.run ends
with cupid.PrefMatcher(tiny) as pm:
    pm.labels(*pair)
    asyncio.run(pm.alabels_batch([pair, pair]))
result = cupid.evaluate(tiny, cache=cache, **run)
print(result.summary.n_runs, type(result).__name__)


async def main():
    async with cupid.PrefMatcher(tiny, cache=cache) as apm:
        await apm.alabels_batch([pair, pair])
        await apm.alabels(*pair)
    await cupid.aevaluate(tiny, **run)
    # Stopped with its first request in flight (the client's HTTP transport sends it by aiohttp's `post`): it closes
    # all the same.
    sending, post = asyncio.Event(), aiohttp.ClientSession.post

    def first_sent(self, *args, **kwargs):
        sending.set()
        return post(self, *args, **kwargs)

    aiohttp.ClientSession.post = first_sent
    stopped = asyncio.create_task(cupid.aevaluate(tiny, cache=cache, **{**run, "refresh": True}))
    await sending.wait()
    await asyncio.sleep(0.05)
    stopped.cancel()
    try:
        await stopped
    except asyncio.CancelledError:
        print("stopped")
    aiohttp.ClientSession.post = post


asyncio.run(main())
own = asyncio.new_event_loop()  # a loop of the caller's: close() closes what async calls left on it
pm = cupid.PrefMatcher(tiny, cache=cache)
own.run_until_complete(pm.alabels(*pair))
pm.close()
pm.close()  # again: nothing left to close
own.close()
print("done")
"""


def test_a_script_using_the_api_ends_with_nothing_left_open(tiny_server, tmp_path):
    """PrefMatcher (blocking, async never closed, `with`, `async with`, `close()` on the caller's loop) and evaluate
    (also stopped mid-run) close their connections and caches: the script, run with ResourceWarnings shown,
    prints none and no aiohttp "Unclosed" message. The control, a client never closed, shows that the check sees a
    leak."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)

    def python(mode: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-W",
                "always::ResourceWarning",
                str(script),
                tiny_server["base_url"],
                mode,
                str(tmp_path / "c.sqlite"),
            ],
            cwd=tmp_path,
            check=False,
            capture_output=True,
            text=True,
            timeout=600,
        )

    clean = python("clean")
    assert clean.returncode == 0, clean.stderr[-3000:]
    assert clean.stdout.splitlines()[-3:] == ["1 RunResult", "stopped", "done"], clean.stdout
    assert "Unclosed" not in clean.stderr and "ResourceWarning" not in clean.stderr, clean.stderr[-3000:]
    leak = python("leak")
    assert leak.returncode == 0 and "Unclosed client session" in leak.stderr, leak.stderr[-3000:]


def test_prefmatcher_closes_each_client_and_cache_once(instant_url, tmp_path, monkeypatch):
    """Each client (and its SQLite cache) a PrefMatcher opens is closed exactly once: per blocking call; at the end
    of `async with`; when `asyncio.run` ends; at `close()` for a loop of the caller's. Closing again does nothing."""
    from cupid.eval.benchmark import judges
    from cupid.serving import cache

    opened: list = []
    closes: dict[int, int] = {}
    sessions: list[aiohttp.ClientSession] = []  # the HTTP sessions the clients opened (one per endpoint asked)
    session = aiohttp.ClientSession

    def counted_session(*args, **kwargs) -> aiohttp.ClientSession:
        sessions.append(opened_session := session(*args, **kwargs))
        return opened_session

    class Counted(judges.Client):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened.append(self)

        async def aclose(self):
            closes[id(self)] = closes.get(id(self), 0) + 1
            await super().aclose()

    class CountedCache(cache.Cache):
        def close(self):
            closes[id(self)] = closes.get(id(self), 0) + 1
            super().close()

    monkeypatch.setattr(judges, "Client", Counted)  # where PrefMatcher's client and cache are opened
    monkeypatch.setattr(cache, "Cache", CountedCache)
    monkeypatch.setattr(aiohttp, "ClientSession", counted_session)

    def each_closed_once(n: int) -> None:
        assert len(opened) == n
        for client in opened:
            assert closes.get(id(client)) == 1 and closes.get(id(client.cache)) == 1
        assert sessions and all(s.closed for s in sessions)  # and no session left open

    pair = ("Prefers short answers", ["Is the answer short?"])
    with cupid.PrefMatcher(instant_url, model="local-prefmatcher", cache=tmp_path / "c.sqlite") as pm:
        assert pm.labels(*pair)[0].label in LABELS
        pm.labels_batch([pair, pair])
        each_closed_once(2)  # one client per blocking call, closed at its end
    pm.close()
    each_closed_once(2)

    async def twice():
        async with pm:
            await pm.alabels(*pair)
            await pm.alabels_batch([pair, pair])
            assert len(opened) == 3 and not closes.get(id(opened[-1]))  # one client, open for the next call
        each_closed_once(3)
        await pm.aclose()
        await pm.alabels(*pair)  # left open: closed when asyncio.run ends

    asyncio.run(twice())
    each_closed_once(4)
    pm.close()
    each_closed_once(4)

    own = asyncio.new_event_loop()
    own.run_until_complete(pm.alabels(*pair))
    assert len(opened) == 5 and not closes.get(id(opened[-1]))
    pm.close()
    pm.close()
    each_closed_once(5)
    own.close()

    async def inside():  # a running loop: close() cannot close its connections and says so
        await pm.alabels(*pair)
        with pytest.raises(RuntimeError, match="aclose"):
            pm.close()
        await pm.aclose()

    asyncio.run(inside())
    each_closed_once(6)


def test_an_endpoint_that_does_not_answer_fails_at_once(tmp_path, instant_url):
    import time

    from cupid.common.config import ConfigError
    from cupid.serving.servers.ports import free_port

    closed = f"http://127.0.0.1:{free_port()}/v1"
    endpoints = write_endpoints(
        tmp_path / "endpoints.yaml",
        cand={"base_url": instant_url, "model": "instant"},
        pm={"base_url": closed, "model": "local-prefmatcher"},
    )
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        cupid.evaluate("cand", matcher="pm", decomposer="cand", endpoints_file=endpoints, progress=False, limit=1)
    assert time.monotonic() - started < 5
    message = str(refused.value)
    assert message.startswith("matcher 'pm' at " + closed + " does not answer (ConnectError")
    assert (
        message.endswith("start its server (`cupid serve up`); nothing was sent to it")
        and "AttributeError" not in message
    )

    # PrefMatcher: a base URL where nothing listens is said so (no "pass model="); an endpoint, at its first call
    with pytest.raises(ConfigError, match=r"nothing answers \(ConnectError.*start the server") as refused:
        cupid.PrefMatcher(closed)
    assert "pass model=" not in str(refused.value)
    pm = cupid.PrefMatcher(cupid.Endpoint(base_url=closed, model="local-prefmatcher"))
    with pytest.raises(ConfigError, match=rf"^matcher 'matcher' at {closed} does not answer"):
        pm.labels("Prefers short answers", ["Is the answer short?"])


def test_a_misspelt_keyword_of_evaluate_is_named():
    with pytest.raises(TypeError, match=r"evaluate\(\) got an unexpected keyword argument 'endpoints'; did you mean "
                                        r"'endpoints_file'\?"):  # fmt: skip
        cupid.evaluate("cand", matcher="pm", endpoints="file.yaml")


def test_score_batch_and_its_async_twin_give_the_runs_scores(tmp_path, instant_url, cupid_home):
    """PrefMatcher.score_batch on the preferences a run inferred: the run's own counts and P/R/F1, unit by unit, in
    order; its async twin the same."""
    import asyncio

    from cupid.eval.benchmark.runner import RunConfig, run

    endpoints = write_endpoints(
        tmp_path / "ep.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
    )
    records = run(RunConfig(endpoints=str(endpoints), candidate="instant", decomposer="instant", matcher="pm",
                            limit=3, out=None, cache=None)).records  # fmt: skip
    triples = [(r.inferred_preference, r.gt_preference, r.gt_checklist) for r in records]
    pm = cupid.PrefMatcher(
        cupid.Endpoint(base_url=instant_url, model="local-prefmatcher"),
        decomposer=cupid.Endpoint(base_url=instant_url, model="instant"),
    )
    batch = pm.score_batch(triples)
    assert [s.counts for s in batch] == [r.counts for r in records] and all(s.scored for s in batch)
    assert [s.scores for s in batch] == [r.scores for r in records]

    async def twin():
        async with pm:
            return await pm.ascore_batch(triples)

    assert [s.scores for s in asyncio.run(twin())] == [r.scores for r in records]
