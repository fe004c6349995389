"""The tiny profile's CPU settings, side by side: time to answer the same requests under each variant.

    python -m bench.cpu_serving [--variants shipped,bf16,reserve1,bf16-reserve1] [--requests 6] [--max-tokens 64]

Each variant is the shipped `tiny` profile (configs/serve/tiny.yaml) with one field changed: `bf16` serves in
bfloat16, `reserve1` leaves vLLM's default of one core kept from the model. One server at a time on the profile's
port; each is sent the bundled sample's first N instances (dialogues as the prompt, ~2.6k tokens each) at once,
twice: cold, then again (prefix cache warm, so the second pass is mostly decode). Figures only, never pass/fail:
on a CPU with AVX512-BF16 or AMX, bf16 may win, and that is what this measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from cupid.eval.benchmark import data as cupid_data
from cupid.serving.client import Client
from cupid.serving.endpoint import Endpoint
from cupid.serving.servers import lifecycle, profiles, tiny_model

# Each variant: the profile's own fields it changes, and vLLM's arguments (the profile's `vllm:`) it sets.
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "shipped": ({}, {}),
    "bf16": ({}, {"dtype": "bfloat16"}),
    "reserve1": ({"cpu_reserved_cores": None}, {}),
    "bf16-reserve1": ({"cpu_reserved_cores": None}, {"dtype": "bfloat16"}),
}


def variant(shipped: profiles.Profile, name: str) -> profiles.Profile:
    """The shipped profile with the variant's changes, validated again: `dtype` is one of vLLM's arguments, and a
    copy that set it as a field of the profile would serve float32 under the name bf16."""
    fields, args = VARIANTS[name]
    changed = {**shipped.model_dump(), **fields, "vllm": {**shipped.vllm, **args}, "name": f"bench-{name}"}
    return profiles.Profile.model_validate(changed)


def prompts(n: int) -> list[list[dict[str, str]]]:
    rows = [json.loads(line) for line in cupid_data.SAMPLE_PATH.read_text().splitlines()][:n]
    return [
        [{"role": "user", "content": json.dumps(r["prior_interactions"])[:9000] + "\n" + r["current_request"]}]
        for r in rows
    ]


async def send_all(endpoint: Endpoint, batch: list[list[dict[str, str]]], max_tokens: int) -> tuple[float, int, int]:
    """All requests at once through the project's client (no cache, no retries): wall time, prompt and answer tokens."""
    async with Client({"bench": endpoint}, concurrency=len(batch)) as client:
        start = time.perf_counter()
        answers = await asyncio.gather(*[client.chat("bench", m, max_tokens=max_tokens, temperature=0) for m in batch])
        wall = time.perf_counter() - start
    usage = [a.usage or {} for a in answers]
    return wall, sum(u.get("prompt_tokens", 0) for u in usage), sum(u.get("completion_tokens", 0) for u in usage)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    tiny_model.ensure()
    shipped = profiles.load("tiny")
    batch = prompts(args.requests)
    print(f"{'variant':<14} {'start s':>8} {'cold s':>8} {'warm s':>8} {'prompt tok':>10} {'answer tok':>10}")
    for name in args.variants.split(","):
        profile = variant(shipped, name)
        started = time.perf_counter()
        record = lifecycle.up(profile, tied=True)
        start_s = time.perf_counter() - started
        try:
            endpoint = Endpoint.model_validate({"base_url": record.base_url, "model": profile.served, "timeout_s": 1800,
                                                "max_retries": 0})  # fmt: skip
            cold, n_prompt, n_answer = asyncio.run(send_all(endpoint, batch, args.max_tokens))
            warm, _, _ = asyncio.run(send_all(endpoint, batch, args.max_tokens))
        finally:
            lifecycle.down(profile.name)
        print(f"{name:<14} {start_s:>8.1f} {cold:>8.1f} {warm:>8.1f} {n_prompt:>10} {n_answer:>10}", flush=True)


if __name__ == "__main__":
    main()
