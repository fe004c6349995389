"""`make bench`: the client's overhead, what concurrency buys on a real server, a cached re-run, and two
side-by-side comparisons, each measured in one run on this machine:

1. vLLM's CPU build against `transformers serve` on the demo workload (configs/eval/tiny.yaml: every role
   the tiny model, its instances, both tasks), the same run config against each server in turn (never
   both at once), each with a fresh cache and its own run directory; wall time, units scored and failed,
   and each server's start-up time. `transformers serve` rejects vLLM's `structured_outputs` field (HTTP 422),
   so the comparison runs the demo without answer-format constraints on both engines (the same requests),
   and reports the demo as it runs (constrained) on vLLM beside it.
2. This project's client (32 in flight) against the reference implementation's pattern (a pool of 4 workers,
   each sending one blocking request at a time) on the same vLLM server with the same distinct requests.
3. The CPU a nightly's statistics add at 20 and 100 candidates on 252 personas (bench/night_stats.py).

    python -m bench.run [--compiled] [--quick] [--out PATH]

--compiled also starts the tiny profile without enforce-eager (slow start). --quick runs every section and every
server of the bench as it is, on a few requests with short answers (QUICK): a check that `make bench` still runs
end to end (tests/test_bench.py), whose figures mean nothing.

Prints the headline figures and writes every figure to bench/results.json (--quick: bench/results-quick.json; --out:
elsewhere).
Timing lives here, never in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import night_stats
from cupid.common.config import read_yaml
from cupid.common.errors import ServeError
from cupid.common.tls import http_post
from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.rundir import RunDir
from cupid.eval.benchmark.runner import RunConfig, run
from cupid.serving.client import ChatRequest, Client
from cupid.serving.endpoint import Endpoint
from cupid.serving.registry import DEFAULT_FILE, load_endpoints
from cupid.serving.servers import lifecycle, profiles, tiny_model
from cupid.serving.servers.instant import start as start_instant
from cupid.serving.servers.ports import free_port
from cupid.serving.servers.profiles import Profile
from cupid.serving.servers.state import ServerRecord

ROOT = Path(__file__).resolve().parents[1]
BENCHMARK_SIZE = 756
DEMO_CONFIG = "configs/eval/tiny.yaml"
TINY_PROFILE = "tiny"
REFERENCE_WORKERS = 4
OURS_IN_FLIGHT = 32
LEVELS = (1, 4, 32)  # requests in flight, for requests/s on vLLM CPU


@dataclass(frozen=True)
class Workload:
    """How much each section sends. The sections, servers and code paths are the same whatever the size, so the quick
    form checks what the full bench runs; only how many requests there are and how long they and their answers are
    change."""

    overhead_requests: int = 5000  # to the instant server: the client's own cost per request
    overhead_in_flight: int = 256
    rerun_limit: int | None = None  # instances of the bundled sample re-run from the cache; None: all 12
    demo_limit: int | None = None  # instances of the demo workload; None: the demo config's own
    demo_max_tokens: int | None = None  # answer cap of the demo's endpoints; None: configs/endpoints.yaml's
    demo_sessions: int | None = None  # prior sessions kept per demo instance (prompts' length); None: all
    compare_requests: int = 64  # this client against the reference pattern
    compare_max_tokens: int = 32
    level_requests: int = 32  # at each number in flight (LEVELS)
    level_max_tokens: int = 16
    night_candidates: tuple[int, ...] = (20, 100)  # a night's statistics on 252 personas (bench/night_stats.py)


FULL = Workload()
# A unit per task of the demo, on one prior session (~2.6k-token prompts take minutes on 2 cores, mostly under
# `transformers serve`), answers cut short (a cut answer fails to parse: the failure paths run too).
QUICK = Workload(
    overhead_requests=50, overhead_in_flight=8, rerun_limit=2, demo_limit=1, demo_max_tokens=24, demo_sessions=1,
    compare_requests=4, compare_max_tokens=4, level_requests=4, level_max_tokens=4, night_candidates=(2,),
)  # fmt: skip


def endpoint(base_url: str, model: str, **fields: Any) -> Endpoint:
    """An endpoint on a server the bench reaches by URL, validated as the endpoints file's entries are."""
    return Endpoint.model_validate({"base_url": base_url, "model": model, **fields})


async def fire(
    endpoint: Endpoint, n: int, in_flight: int, tag: str, max_tokens: int | None = None
) -> tuple[float, float]:
    """Send n distinct requests with `in_flight` at a time; return (wall seconds, client CPU seconds)."""
    async with Client({"e": endpoint}, concurrency=in_flight) as client:
        messages = [[{"role": "user", "content": f"{tag} request {i}: name a colour."}] for i in range(n)]
        await client.chat("e", messages[0], max_tokens=max_tokens)  # warm the connection pool
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*[client.chat("e", m, max_tokens=max_tokens) for m in messages[1:]])
        return time.perf_counter() - wall, time.process_time() - cpu


def client_overhead(url: str, n: int, in_flight: int) -> dict:
    wall, cpu = asyncio.run(fire(endpoint(url, "instant"), n + 1, in_flight, "overhead"))
    return {
        "requests": n,
        "in_flight": in_flight,
        "client_cpu_ms_per_request": round(1000 * cpu / n, 3),
        "requests_per_s": round(n / wall, 1),
    }


def concurrency_levels(endpoint: Endpoint, levels: tuple[int, ...], n: int, max_tokens: int) -> dict:
    out = {}
    for level in levels:
        wall, _ = asyncio.run(fire(endpoint, n + 1, level, f"level{level}", max_tokens=max_tokens))
        out[str(level)] = {"requests": n, "requests_per_s": round(n / wall, 2)}
    return out


def cached_rerun(url: str, limit: int | None) -> dict:
    """The bundled sample (its first `limit` instances) run twice against the instant server: the second run,
    answered from the cache, timed."""
    with tempfile.TemporaryDirectory() as tmp:
        endpoints = Path(tmp) / "endpoints.yaml"
        endpoints.write_text(json.dumps({"instant": {"base_url": url, "model": "instant"}}))

        def config(out: str) -> RunConfig:
            return RunConfig(endpoints=str(endpoints), candidate="instant", decomposer="instant", matcher="instant",
                             cache=str(Path(tmp) / "cache.sqlite"), limit=limit, out=str(Path(tmp) / out))  # fmt: skip

        run(config("first"))
        started = time.perf_counter()
        summary = run(config("again")).summary
        wall = time.perf_counter() - started
    assert summary.requests is not None and summary.requests.sent == 0, "the re-run sent requests"
    return {
        "instances": summary.n_instances,
        "cached_requests": summary.requests.cached,
        "wall_s": round(wall, 3),
        "extrapolated_wall_s_per_756": round(wall * BENCHMARK_SIZE / summary.n_instances, 2),
    }


# --- servers -------------------------------------------------------------------------------------------


def start(profile: Profile) -> tuple[ServerRecord, dict[str, float]]:
    """Start a server tied to this process; return its record and its start-up: seconds until it reported
    ready, and seconds until it answered a first one-token request (a server that loads its model lazily,
    as `transformers serve` does, pays for the load there)."""
    started = time.perf_counter()
    record = lifecycle.up(profile, tied=True)
    ready = time.perf_counter() - started
    body = {
        "model": profile.served,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "temperature": 0.0,
    }
    http_post(record.base_url + "/chat/completions", json=body, timeout=600).raise_for_status()
    return record, {"ready_s": round(ready, 1), "first_answer_s": round(time.perf_counter() - started, 1)}


def vllm_profile(model_dir: Path, name: str, *, eager: bool = True) -> Profile:
    """The shipped tiny profile on a free port under its own name (a demo server on :8011 is left alone)."""
    profile = profiles.load(TINY_PROFILE)
    if not eager:
        profile = profile.with_args(enforce_eager=False)
    return profile.model_copy(update={"model": str(model_dir), "name": name, "port": free_port()})


def transformers_profile(model_dir: Path, name: str) -> Profile:
    """`transformers serve` on the same model directory, under the same served name as the tiny profile."""
    served = profiles.load(TINY_PROFILE).served
    return Profile(
        name=name,
        engine="transformers",
        device="cpu",
        model=str(model_dir),
        served_name=served,
        port=free_port(),
        startup_timeout_s=600,
    )


# --- 1. the demo workload against one server -------------------------------------------------------------


def demo_workload(base_url: str, workdir: Path, workload: Workload, *, free: bool = False) -> dict[str, Any]:
    """configs/eval/tiny.yaml as `make demo` runs it (at the workload's size), its endpoints pointed at `base_url`,
    with a fresh cache and run directory under `workdir`. `free`: without answer-format constraints (what
    `transformers serve` accepts), so both engines get the same kind of requests."""
    cfg = dict(read_yaml(ROOT / DEMO_CONFIG))
    workdir.mkdir(parents=True, exist_ok=True)
    if workload.demo_limit is not None:
        cfg["limit"] = workload.demo_limit
    if workload.demo_sessions is not None:
        cfg["data"] = str(fewer_sessions(cfg.get("data", "sample"), workload.demo_sessions, workdir / "data.jsonl"))
    shipped = load_endpoints(ROOT / cfg.get("endpoints", DEFAULT_FILE))
    roles = RunConfig(**cfg).roles().bound()
    unconstrained = {"structured_output": False, "constrain_candidate": False} if free else {}
    capped = {"max_tokens": workload.demo_max_tokens} if workload.demo_max_tokens is not None else {}
    endpoints = {name: {**shipped[name].model_dump(mode="json"), "base_url": base_url, **unconstrained, **capped}
                 for name in set(roles.values())}  # fmt: skip
    (workdir / "endpoints.yaml").write_text(json.dumps(endpoints, indent=2))
    cfg.update(
        endpoints=str(workdir / "endpoints.yaml"),
        out=str(workdir / "run"),
        cache=str(workdir / "cache.sqlite"),
    )
    started = time.perf_counter()
    summary = run(RunConfig(**cfg)).summary
    wall = time.perf_counter() - started
    # One example of each failure reason, as the run recorded it.
    examples: dict[str, str] = {}
    for record in RunDir(workdir / "run").records().values():
        if not record.scored and (error := record.error) is not None:
            key = f"{record.task}/{error.stage}: {error.reason}"
            examples.setdefault(key, str(error.detail or error.raw or "")[:300])
    return {
        "wall_s": round(wall, 1),
        "units": summary.n_runs,
        "scored": summary.n_scored,
        "failed": summary.n_failed,
        "by_task": {t: {"scored": b.overall.n_scored, "failed": b.overall.n_failed} for t, b in summary.tasks.items()},
        "failures": summary.failures,
        "failure_examples": examples,
        "requests": summary.requests.model_dump() if summary.requests else None,
    }


def fewer_sessions(source: str, sessions: int, path: Path) -> Path:
    """The data with each instance's first `sessions` prior sessions only: shorter prompts, the same kind of run."""
    instances = cupid_data.load(source).instances
    with path.open("w", encoding="utf-8") as f:
        for instance in instances:
            row = instance.model_dump()
            f.write(json.dumps({**row, "prior_interactions": row["prior_interactions"][:sessions]}) + "\n")
    return path


# --- 2. this client against the reference implementation's pattern ---------------------------------------


def short_requests(model: str, n: int, max_tokens: int, tag: str) -> list[ChatRequest]:
    """n distinct short chat requests, exactly as this project's client sends them (temperature 0)."""
    client = Client({"e": endpoint("http://127.0.0.1:1/v1", model)})
    return [
        client.request(
            "e", [{"role": "user", "content": f"{tag} {i}: name a colour and say why."}], max_tokens=max_tokens
        )
        for i in range(n)
    ]


def ours(endpoint: Endpoint, requests: list[ChatRequest], warm: ChatRequest, in_flight: int) -> dict[str, Any]:
    async def go() -> tuple[float, list]:
        async with Client({"e": endpoint}, concurrency=in_flight) as client:  # no cache
            await client.send("e", warm)
            started = time.perf_counter()
            answers = await asyncio.gather(*[client.send("e", r) for r in requests], return_exceptions=True)
            return time.perf_counter() - started, answers

    wall, answers = asyncio.run(go())
    ok = [a for a in answers if not isinstance(a, BaseException)]
    tokens = sum((a.usage or {}).get("completion_tokens", 0) for a in ok)
    return _throughput(len(requests), len(ok), tokens, wall, in_flight=in_flight)


def reference_pattern(
    endpoint: Endpoint, requests: list[ChatRequest], warm: ChatRequest, workers: int
) -> dict[str, Any]:
    """The reference's shape: a pool of `workers` threads, each with a blocking HTTP client, one request at a time."""
    local = threading.local()
    opened: list[httpx.Client] = []
    url = endpoint.url + "/chat/completions"

    def send(request: ChatRequest) -> dict[str, Any]:
        http = getattr(local, "http", None)
        if http is None:
            http = local.http = httpx.Client(timeout=endpoint.timeout_s)
            opened.append(http)
        response = http.post(url, json=request.body())
        response.raise_for_status()
        return response.json()

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            pool.submit(send, warm).result()
            started = time.perf_counter()
            futures = [pool.submit(send, r) for r in requests]
            results = []
            for future in futures:
                try:
                    results.append(future.result())
                except (httpx.HTTPError, ValueError):
                    pass
            wall = time.perf_counter() - started
    finally:
        for http in opened:
            http.close()
    tokens = sum(r.get("usage", {}).get("completion_tokens", 0) for r in results)
    return _throughput(len(requests), len(results), tokens, wall, workers=workers)


def _throughput(n: int, ok: int, tokens: int, wall: float, **shape: int) -> dict[str, Any]:
    return {**shape, "requests": n, "answered": ok, "completion_tokens": tokens, "wall_s": round(wall, 2),
            "requests_per_s": round(n / wall, 2), "completion_tokens_per_s": round(tokens / wall, 1)}  # fmt: skip


def client_vs_reference(endpoint: Endpoint, n: int, max_tokens: int) -> dict[str, Any]:
    """Ours first, then the reference: should the server's prefix cache help a repeat, it helps the reference."""
    requests = short_requests(endpoint.model, n, max_tokens, "compare")
    warm = short_requests(endpoint.model, 1, max_tokens, "warm-up")[0]
    mine = ours(endpoint, requests, warm, OURS_IN_FLIGHT)
    reference = reference_pattern(endpoint, requests, warm, REFERENCE_WORKERS)
    return {
        "requests": n,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        f"ours_{OURS_IN_FLIGHT}_in_flight": mine,
        f"reference_{REFERENCE_WORKERS}_workers": reference,
        "ratio_requests_per_s": round(mine["requests_per_s"] / reference["requests_per_s"], 2),
    }


# --- the run -------------------------------------------------------------------------------------------


def loadavg(before: tuple[float, float, float]) -> dict[str, list[float]]:
    """Load averages (1, 5, 15 min) before and after a phase: the machine is shared, other work shows here."""
    return {"before": [round(x, 2) for x in before], "after": [round(x, 2) for x in os.getloadavg()]}


def vllm_part(model_dir: Path, workdir: Path, workload: Workload) -> dict[str, Any]:
    profile = vllm_profile(model_dir, "bench-vllm")
    before = os.getloadavg()
    try:
        record, startup = start(profile)
        server = endpoint(record.base_url, profile.served, timeout_s=1800)
        print(f"vLLM (CPU, eager) up: {startup}; demo workload ...", file=sys.stderr)
        demo = demo_workload(record.base_url, workdir / "vllm", workload)
        print("demo workload without answer formats (as transformers serve gets it) ...", file=sys.stderr)
        free = demo_workload(record.base_url, workdir / "vllm-free", workload, free=True)
        print("client against the reference pattern ...", file=sys.stderr)
        compare = client_vs_reference(server, workload.compare_requests, workload.compare_max_tokens)
        print(f"requests/s at {'/'.join(map(str, LEVELS))} in flight ...", file=sys.stderr)
        levels = concurrency_levels(server, LEVELS, workload.level_requests, workload.level_max_tokens)
    finally:
        lifecycle.down(profile.name)
    return {
        "startup_s": startup,
        "demo": demo,
        "demo_free": free,
        "client_vs_reference": compare,
        "concurrency": levels,
        "loadavg": loadavg(before),
    }


def transformers_part(model_dir: Path, workdir: Path, workload: Workload) -> dict[str, Any]:
    profile = transformers_profile(model_dir, "bench-transformers")
    before = os.getloadavg()
    try:
        try:
            record, startup = start(profile)
        except (ServeError, httpx.HTTPError) as e:
            return {"error": f"{type(e).__name__}: {e}"[:2000]}
        print(f"transformers serve up: {startup}; demo workload ...", file=sys.stderr)
        demo = demo_workload(record.base_url, workdir / "transformers", workload, free=True)
    finally:
        lifecycle.down(profile.name)
    return {"startup_s": startup, "demo": demo, "loadavg": loadavg(before)}


def compiled_part(model_dir: Path, workload: Workload) -> dict[str, Any]:
    """The tiny profile without enforce-eager: its start-up, and requests/s at 32 in flight to set against eager's."""
    profile = vllm_profile(model_dir, "bench-vllm-compiled", eager=False)
    try:
        try:
            record, startup = start(profile)
        except (ServeError, httpx.HTTPError) as e:
            return {"error": f"{type(e).__name__}: {e}"[:2000]}
        server = endpoint(record.base_url, profile.served, timeout_s=1800)
        levels = concurrency_levels(server, (32,), workload.level_requests, workload.level_max_tokens)
    finally:
        lifecycle.down(profile.name)
    return {"startup_s": startup, "concurrency": levels}


def answered(cache: Path) -> dict[str, dict[str, Any]]:
    """What a run's cache holds: every answered request by its key."""
    if not cache.is_file():
        return {}
    with sqlite3.connect(f"file:{cache}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT key, content, usage, latency_s FROM responses").fetchall()
    return {
        key: {"content": content, "usage": json.loads(usage) if usage else {}, "latency_s": latency}
        for key, content, usage, latency in rows
    }


def shared_requests(vllm_cache: Path, transformers_cache: Path) -> dict[str, Any]:
    """The identical requests both servers answered (same body, so same key): the one like-for-like slice of the
    two demo runs. Latencies are per request as each run saw them, under that run's own concurrency."""
    a, b = answered(vllm_cache), answered(transformers_cache)
    both = sorted(a.keys() & b.keys())

    def side(answers: dict[str, dict[str, Any]]) -> dict[str, Any]:
        latencies = [answers[k]["latency_s"] or 0.0 for k in both]
        return {
            "completion_tokens": sum(answers[k]["usage"].get("completion_tokens", 0) for k in both),
            "prompt_tokens": sum(answers[k]["usage"].get("prompt_tokens", 0) for k in both),
            "mean_latency_s": round(sum(latencies) / len(both), 2) if both else None,
        }

    return {
        "requests": len(both),
        "vllm_cpu": side(a),
        "transformers_serve": side(b),
        "identical_answers": sum(a[k]["content"] == b[k]["content"] for k in both),
    }


def engine_comparison(vllm: dict[str, Any], transformers: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "workload": (
            f"{DEMO_CONFIG}, without answer-format constraints on either engine (transformers serve refuses them)"
        ),
        "vllm_cpu": vllm["demo_free"],
        "transformers_serve": transformers.get("demo", transformers),
        "vllm_cpu_as_the_demo_runs_it": vllm["demo"],
    }
    out["startup_s"] = {"vllm_cpu_eager": vllm["startup_s"], "transformers_serve": transformers.get("startup_s")}
    out["loadavg_during"] = {"vllm_cpu_phase": vllm["loadavg"], "transformers_serve_phase": transformers.get("loadavg")}
    if "demo" in transformers:
        v, t = vllm["demo_free"], transformers["demo"]
        out["ratio_wall_transformers_over_vllm"] = round(t["wall_s"] / v["wall_s"], 2)
        out["ratio_startup_vllm_over_transformers"] = round(
            vllm["startup_s"]["first_answer_s"] / transformers["startup_s"]["first_answer_s"], 2
        )
        out["note"] = (
            f"same units ({v['units']}) against each server; scored/failed: vLLM {v['scored']}/{v['failed']}, "
            f"transformers {t['scored']}/{t['failed']}. Units that fail early do less work, so the wall ratio "
            "compares the runs as they ran, not equal work: see requests and failures."
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--compiled", action="store_true", help="also time a compiled (non-eager) vLLM start-up (70-175 s more)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="every section on a few short requests: does it all run? (its figures mean nothing)",
    )
    parser.add_argument(
        "--out", type=Path, help="the results file (default bench/results.json; with --quick bench/results-quick.json)"
    )
    args = parser.parse_args(argv)
    workload = QUICK if args.quick else FULL
    path = args.out.resolve() if args.out else ROOT / "bench" / ("results-quick.json" if args.quick else "results.json")
    os.chdir(ROOT)
    os.environ.setdefault("CUPID_HOME", str(ROOT / ".cupid"))
    load_before = os.getloadavg()
    started = time.perf_counter()

    proc, url = start_instant()
    try:
        results: dict[str, Any] = {
            "client_overhead": client_overhead(url, workload.overhead_requests, workload.overhead_in_flight),
            "cached_rerun": cached_rerun(url, workload.rerun_limit),
        }
    finally:
        proc.terminate()
        proc.wait()

    results["night_statistics"] = [night_stats.night(n) for n in workload.night_candidates]

    # The quick form's figures mean nothing: the random-weight model runs its code paths in a fraction of the time.
    model_dir = tiny_model.ensure_random() if args.quick else tiny_model.ensure()
    with tempfile.TemporaryDirectory(prefix="cupid-bench-") as tmp:
        vllm = vllm_part(model_dir, Path(tmp), workload)
        transformers = transformers_part(model_dir, Path(tmp), workload)
        shared = shared_requests(Path(tmp) / "vllm-free" / "cache.sqlite", Path(tmp) / "transformers" / "cache.sqlite")
        compiled = compiled_part(model_dir, workload) if args.compiled else None
    results["concurrency_tiny_vllm_cpu"] = vllm["concurrency"]
    results["client_vs_reference"] = vllm["client_vs_reference"]
    results["vllm_vs_transformers_serve"] = {**engine_comparison(vllm, transformers), "shared_requests": shared}
    results["vllm_startup_s"] = {
        "eager": vllm["startup_s"],
        "compiled": compiled.get("startup_s") if compiled else None,
    }
    if compiled:
        results["vllm_compiled"] = compiled
    results["machine"] = {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "loadavg": loadavg(load_before),
        "bench_wall_s": round(time.perf_counter() - started, 1),
    }
    results["workload"] = {"form": "quick" if args.quick else "full", **asdict(workload)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print(headline(results))
    print(f"every figure in {path}")


def headline(results: dict[str, Any]) -> str:
    def up(s: dict[str, float] | None) -> str:
        return f"ready {s['ready_s']} s, first answer {s['first_answer_s']} s" if s else "-"

    cmp = results["vllm_vs_transformers_serve"]
    v, t = cmp["vllm_cpu"], cmp["transformers_serve"]
    lines = [
        (
            f"demo workload ({cmp['workload']}, {v['units']} units), vLLM CPU: {v['wall_s']} s, "
            f"{v['scored']} scored / {v['failed']} failed; start-up: {up(cmp['startup_s']['vllm_cpu_eager'])}"
        )
    ]
    if "wall_s" in t:
        lines.append(
            f"demo workload, transformers serve: {t['wall_s']} s, {t['scored']} scored / {t['failed']} failed; "
            f"start-up: {up(cmp['startup_s']['transformers_serve'])}"
        )
        lines.append(
            f"  wall transformers/vLLM: {cmp['ratio_wall_transformers_over_vllm']}x; "
            f"transformers failures: {t['failures']}"
        )
    else:
        lines.append(f"transformers serve: {t.get('error', '?')[:300]}")
    c = results["client_vs_reference"]
    mine, ref = c[f"ours_{OURS_IN_FLIGHT}_in_flight"], c[f"reference_{REFERENCE_WORKERS}_workers"]
    lines.append(
        f"{c['requests']} short requests on vLLM CPU: "
        f"this client ({OURS_IN_FLIGHT} in flight) {mine['requests_per_s']}/s, "
        f"reference pattern ({REFERENCE_WORKERS} workers) {ref['requests_per_s']}/s: {c['ratio_requests_per_s']}x"
    )
    for night in results["night_statistics"]:
        lines.append(
            f"a night's statistics, {night['candidates']} candidates ({night['headline tests']} headline tests, "
            f"{night_stats.PERSONAS} personas): {night['total s']} s"
        )
    levels = results["concurrency_tiny_vllm_cpu"]
    lines.append(
        "requests/s on vLLM CPU by in flight: " + ", ".join(f"{k}: {x['requests_per_s']}" for k, x in levels.items())
    )
    if compiled := results.get("vllm_compiled"):
        if "error" in compiled:
            lines.append(f"vLLM compiled: {compiled['error'][:300]}")
        else:
            lines.append(
                f"vLLM compiled start-up: {up(compiled['startup_s'])}; "
                f"requests/s at 32 in flight: {compiled['concurrency']['32']['requests_per_s']}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
