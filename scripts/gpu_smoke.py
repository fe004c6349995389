#!/usr/bin/env python
"""Smoke test for a served matcher: serve a profile, ask one matcher question with the spec's prompt, check
that the answer parses, print throughput at 1 / 32 / 256 requests in flight, shut the server down.

    .venv/bin/python scripts/gpu_smoke.py                         # GPU: profile prefmatcher
    .venv/bin/python scripts/gpu_smoke.py --profile tiny --in-flight 1 8 --max-tokens 200   # vLLM on CPU

The question is the first few-shot example of the matcher spec (a preference and its checklist, with
human labels), sent in the `prefmatcher` prompt format and, as evaluation runs send it to vLLM, with
the prefmatcher answer format enforced (`--free` asks without it, to see what the model writes on its
own). A server already running under the profile's name is used as is and left running; one this
script starts dies with it. Exit status: 0 when the answer parses, 1 when it does not (throughput is
measured anyway), 2 when the server cannot be started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from importlib import resources

from cupid.common.config import ConfigError
from cupid.common.errors import ServeError
from cupid.matcher import parse, prompts, schemas
from cupid.serving.client import Client, RequestFailed
from cupid.serving.endpoint import Endpoint
from cupid.serving.fleet import gpu_memory
from cupid.serving.servers import lifecycle, probes, profiles, state
from cupid.serving.servers.engines import get_engine


def examples() -> list[dict]:
    return json.loads(
        (resources.files("cupid.matcher") / "prompts" / "matcher_fewshot.examples.json").read_text(encoding="utf-8")
    )


def start(profile: profiles.Profile, keep: bool) -> tuple[state.ServerRecord, bool]:
    """The profile's live record, starting the server when it is not running; and whether we started it."""
    record = state.find(profile.name)
    if record and probes.alive(record.pid) and probes.healthy(record.base_url):
        print(f"using the running server '{profile.name}' at {record.base_url}")
        return record, False
    get_engine(profile.engine).preflight(profile)
    profile.check_local_files()
    gpu_memory.Plan([profile], [r for r in lifecycle.status() if r.alive], gpu_memory.gpus()).check()
    print(f"starting '{profile.name}' ({profile.engine}, {profile.served}) ...", flush=True)
    started = time.monotonic()
    record = lifecycle.up(profile, tied=not keep)
    print(f"serving at {record.base_url} after {time.monotonic() - started:.0f}s")
    return record, True


def question(example: dict, max_tokens: int, free: bool) -> tuple[list[dict], dict]:
    """The matcher's messages and request fields, with the answer format unless `free`."""
    items = [item["entry"] for item in example["checklist"]]
    fields = {"max_tokens": max_tokens, **({} if free else schemas.matcher("prefmatcher", items, max_tokens))}
    return prompts.matcher(example["preference"], items, "prefmatcher"), fields


async def check_answer(client: Client, example: dict, max_tokens: int, free: bool) -> bool:
    items = [item["entry"] for item in example["checklist"]]
    messages, fields = question(example, max_tokens, free)
    answer = await client.chat("smoke", messages, **fields)
    print(
        f"\nmatcher answer ({answer.usage.get('completion_tokens') if answer.usage else '?'} tokens, "
        f"{answer.finish_reason}):"
    )
    print(answer.content)
    try:
        matches = parse.matches(answer.content, items)
    except parse.ParseError as e:
        print(f"\nFAILED: the answer does not parse as the matcher's labels: {e.message}")
        return False
    agree = sum(m.label == item["label"] for m, item in zip(matches, example["checklist"], strict=True))
    print(f"\nOK: the answer parses; {agree}/{len(items)} labels agree with the example's human labels")
    return True


async def throughput(endpoint: Endpoint, in_flight: int, n_requests: int, max_tokens: int, free: bool) -> str:
    """`n_requests` matcher requests with `in_flight` of them open at a time. Each carries its own `seed`: at
    temperature 0 it changes nothing in the answer, but keeps the requests distinct (no deduplication)."""
    pool = examples()
    async with Client({"smoke": endpoint}, concurrency=in_flight) as client:
        jobs = []
        for i in range(n_requests):
            messages, fields = question(pool[i % len(pool)], max_tokens, free)
            jobs.append(client.chat("smoke", messages, **fields, seed=i))
        started = time.perf_counter()
        answers = await asyncio.gather(*jobs, return_exceptions=True)
        wall = time.perf_counter() - started
    done = [a for a in answers if not isinstance(a, BaseException)]
    failed = [a for a in answers if isinstance(a, BaseException)]
    tokens = sum((a.usage or {}).get("completion_tokens", 0) for a in done)
    reasons = sorted({a.reason if isinstance(a, RequestFailed) else type(a).__name__ for a in failed})
    line = (
        f"{in_flight:>4} in flight: {len(done) / wall:7.2f} requests/s  {tokens / wall:8.1f} output tokens/s  "
        f"({len(done)} requests in {wall:.1f}s"
    )
    return line + (f", {len(failed)} failed: {', '.join(reasons)})" if failed else ")")


async def measure(record: state.ServerRecord, profile: profiles.Profile, args: argparse.Namespace) -> bool:
    endpoint = Endpoint.model_validate(
        {
            "base_url": record.base_url,
            "model": profile.served,
            "api_key_env": profile.api_key_env,
            "max_concurrency": max(args.in_flight),
            "timeout_s": args.request_timeout,
            "max_retries": 0,
        }
    )
    async with Client({"smoke": endpoint}) as client:
        parsed = await check_answer(client, examples()[0], args.max_tokens, args.free)
    shape = "free answers" if args.free else "answer format enforced"
    print(f"\nthroughput ({profile.served}, max_tokens {args.max_tokens}, temperature 0, {shape}):")
    for n in args.in_flight:
        print(await throughput(endpoint, n, max(n, args.min_requests), args.max_tokens, args.free), flush=True)
    return parsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="prefmatcher", help="name in configs/serve/ or a YAML path")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument(
        "--min-requests", type=int, default=8, help="requests per level at least (1 in flight is noisy)"
    )
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--request-timeout", type=float, default=1800.0)
    parser.add_argument("--keep", action="store_true", help="leave a server this script started running")
    parser.add_argument("--free", action="store_true", help="ask without the answer format (see what the model writes)")
    args = parser.parse_args()

    try:
        profile = profiles.load(args.profile)
        record, started = start(profile, args.keep)
    except (ConfigError, ServeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        parsed = asyncio.run(measure(record, profile, args))
    finally:
        if started and not args.keep:
            lifecycle.down(profile.name)
            print(f"stopped '{profile.name}'")
    return 0 if parsed else 1


if __name__ == "__main__":
    sys.exit(main())
