"""`make bench`: the client's overhead, what concurrency buys on a real server, and a cached re-run.

Prints the figures and writes them to bench/results.json. Timing lives here, never in tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from eval.runner import RunConfig, run
from serving import lifecycle, tiny_model
from serving.client import Client
from serving.endpoints import Endpoint
from serving.engines import ServeSpec
from serving.instant import free_port
from serving.instant import start as start_instant

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_SIZE = 12
BENCHMARK_SIZE = 756


async def fire(endpoint: Endpoint, n: int, in_flight: int, tag: str, max_tokens: int | None = None) -> tuple[float, float]:
    """Send n distinct requests with `in_flight` at a time; return (wall seconds, client CPU seconds)."""
    async with Client({"e": endpoint}, concurrency=in_flight) as client:
        messages = [[{"role": "user", "content": f"{tag} request {i}: name a colour."}] for i in range(n)]
        await client.chat("e", messages[0], max_tokens=max_tokens)  # warm the connection pool
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*[client.chat("e", m, max_tokens=max_tokens) for m in messages[1:]])
        return time.perf_counter() - wall, time.process_time() - cpu


def client_overhead(url: str, n: int = 5000, in_flight: int = 256) -> dict:
    wall, cpu = asyncio.run(fire(Endpoint(base_url=url, model="instant"), n + 1, in_flight, "overhead"))
    return {"requests": n, "in_flight": in_flight, "client_cpu_ms_per_request": round(1000 * cpu / n, 3), "requests_per_s": round(n / wall, 1)}


def concurrency_on_tiny(levels=(1, 4, 32), n: int = 32) -> dict:
    model_dir = tiny_model.ensure()
    spec = ServeSpec(model=str(model_dir), name="bench-tiny", port=free_port(), startup_timeout_s=600)
    record = lifecycle.up(spec)
    try:
        endpoint = Endpoint(base_url=record["base_url"], model="bench-tiny", timeout_s=1800)
        out = {}
        for level in levels:
            wall, _ = asyncio.run(fire(endpoint, n + 1, level, f"level{level}", max_tokens=16))
            out[str(level)] = {"requests": n, "requests_per_s": round(n / wall, 2)}
        return out
    finally:
        lifecycle.down("bench-tiny")


def cached_rerun(url: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        endpoints = Path(tmp) / "endpoints.yaml"
        endpoints.write_text(json.dumps({"instant": {"base_url": url, "model": "instant"}}))
        common = dict(endpoints=str(endpoints), candidate="instant", decomposer="instant", matcher="instant", cache=str(Path(tmp) / "cache.sqlite"))
        run(RunConfig(**common, out=str(Path(tmp) / "first")))
        started = time.perf_counter()
        summary = run(RunConfig(**common, out=str(Path(tmp) / "again")))
        wall = time.perf_counter() - started
    assert summary["requests"]["sent"] == 0, "the re-run sent requests"
    return {
        "instances": SAMPLE_SIZE,
        "cached_requests": summary["requests"]["cached"],
        "wall_s": round(wall, 3),
        "extrapolated_wall_s_per_756": round(wall * BENCHMARK_SIZE / SAMPLE_SIZE, 2),
    }


def main() -> None:
    os.environ.setdefault("CUPID_HOME", str(ROOT / ".cupid"))
    proc, url = start_instant()
    try:
        results = {"client_overhead": client_overhead(url), "cached_rerun": cached_rerun(url)}
    finally:
        proc.terminate()
    results["concurrency_tiny_cpu"] = concurrency_on_tiny()
    results["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    path = ROOT / "bench" / "results.json"
    path.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
