"""An instant-answer OpenAI-compatible server: well-formed CUPID answers with no model behind them.

It exists for what a model cannot give: the client's own overhead (`make bench`), and exact,
repeatable answers for checking the scoring path over real HTTP (retries, resume, arithmetic).
Answers depend only on the request: the inference prompt gets a fixed preference, the decomposer
splits a preference into yes/no questions, the matcher labels items by word overlap.

    python -m cupid.serving.servers.instant --port 8099 [--fail-first N] [--context-window TOKENS] [--preference TEXT]
        [--no-preference-for REGEX] [--nonsense-for REGEX]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from cupid.common.tls import http_get
from cupid.matcher import prompts
from cupid.serving.servers.ports import free_port

PREFERENCE = "Updates should be brief, use bullet points, and end with a clear question."
NONSENSE = "Zebras prefer quantum marmalade."  # shares no word with any sample preference: F1 0, yet an answer
_WORD = re.compile(r"[a-z]+")
_STOP = {
    "the",
    "a",
    "an",
    "and",
    "or",
    "be",
    "is",
    "are",
    "does",
    "do",
    "with",
    "should",
    "must",
    "to",
    "of",
    "in",
    "for",
    "use",
    "clear",
    "response",
}


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 2}


def label(item: str, preference: str) -> str:
    item_words, pref_words = _words(item), _words(preference)
    overlap = len(item_words & pref_words) / max(len(item_words), 1)
    return "Fully Covered" if overlap >= 0.5 else "Partially Covered" if overlap > 0 else "Not Covered"


def answer(
    messages: list[dict[str, str]],
    preference: str = PREFERENCE,
    no_preference: str | None = None,
    nonsense: str | None = None,
) -> str:
    """`preference`: what the candidate infers (and writes its responses by), the same for every instance.
    `no_preference`: a regex; an inference prompt it matches gets an answer that states no preference (a candidate
    that fails on some instances). `nonsense`: a regex; an inference prompt it matches gets `NONSENSE` as its
    preference (a candidate that answers worse on some instances)."""
    system, user = messages[0]["content"], messages[-1]["content"]
    if system == prompts.load("inference").system:
        if no_preference is not None and re.search(no_preference, user):
            return "### Analysis\n\nThe conversations do not say what the user wants.\n"
        if nonsense is not None and re.search(nonsense, user):
            preference = NONSENSE
        return f"### Analysis\n\nThe user asked for short updates.\n\n### Most Likely Preference\n\n{preference}\n"
    if system == prompts.load("decomposer").system.format():
        preference = user.split("**Preferences**", 1)[1].strip()
        parts = [p.strip(" .") for p in re.split(r",\s*(?:and\s+)?|\s+and\s+", preference) if p.strip(" .")]
        checklist = [f"Does the response satisfy: {p}?" for p in parts[:4]]
        return (
            "**Analysis**\n\nSplit on clauses.\n\n**Checklist**\n\n```json\n"
            + json.dumps({"checklist": checklist}, indent=2)
            + "\n```"
        )
    if system == prompts.load("generation").system:
        return f"Here is a short update. {preference}"
    if system == prompts.load(prompts.ORACLE_PREFERENCE).system:
        given = user.split("## User's Preference", 1)[1].split("---", 1)[0].strip()
        return f"Here is a short update. {given}"
    if system.startswith(prompts.load("judge").system.split("{preference}")[0]):
        preference = system.split('**Preference**: "', 1)[1].split('"\n', 1)[0]
        response = user.split("### AI Assistant's Response", 1)[1]
        overlap = len(_words(preference) & _words(response)) / max(len(_words(preference)), 1)
        evaluation = (
            "### Evaluation of AI Assistant's Response\n\n1. **Overlap**: words of the preference in the response."
        )
        return f"{evaluation}\n\n### Evaluation Label\n\nGood\n\n### Evaluation Score\n\n{1 + round(9 * overlap)}"
    if system == prompts.load("summarizer").system:
        first = user.split("#### User\n\n", 1)[1].split("\n", 1)[0]
        summary = {"session_id": 1, "analysis": "First message.", "context": [first[:200]], "preferences": [PREFERENCE]}
        return "```json\n" + json.dumps({"summaries": [summary]}, indent=2) + "\n```"
    if "#### Checklist" in user:
        head, listed = user.split("#### Checklist", 1)
        preference = head.split("\n\n", 1)[1].strip()
        items = [re.sub(r"^\d+\.\s*", "", line) for line in listed.strip().splitlines()]
        results = [{"index": i, "entry": item, "label": label(item, preference)} for i, item in enumerate(items, 1)]
        if system == prompts.load("prefmatcher").system:
            return "```json\n" + json.dumps(results, indent=2) + "\n```"
        return "```json\n" + json.dumps({"results": results}, indent=2) + "\n```"
    return "OK"


def create_app(
    fail_first: int = 0,
    context_window: int = 0,
    preference: str = PREFERENCE,
    no_preference: str | None = None,
    nonsense: str | None = None,
) -> FastAPI:
    """`fail_first`: answer each distinct request with 503 that many times before answering it.
    `context_window`: refuse prompts longer than this many tokens (about 4 characters each) with
    the 400 error vLLM gives, as a small-context model's server does."""
    app = FastAPI()
    seen: Counter[str] = Counter()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict:
        # It answers under any model name: `*` says so to a run's pre-check (`serving.registry.endpoint_problem`).
        return {"object": "list", "data": [{"id": "instant", "object": "model"}, {"id": "*", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        key = json.dumps(body["messages"], sort_keys=True)
        seen[key] += 1
        if seen[key] <= fail_first:
            return JSONResponse({"error": {"message": "busy, try again"}}, status_code=503)
        prompt_tokens = sum(len(m["content"]) for m in body["messages"]) // 4
        if context_window and prompt_tokens + (body.get("max_tokens") or 0) > context_window:
            message = (
                f"This model's maximum context length is {context_window} tokens. However, you requested "
                f"{prompt_tokens + (body.get('max_tokens') or 0)} tokens ({prompt_tokens} in the messages, "
                f"{(body.get('max_tokens') or 0)} in the completion). "
                "Please reduce the length of the messages or completion."
            )
            return JSONResponse(
                {"object": "error", "message": message, "type": "BadRequestError", "code": 400}, status_code=400
            )
        content = answer(body["messages"], preference, no_preference, nonsense)
        return JSONResponse(
            {
                "id": "instant",
                "object": "chat.completion",
                "model": body.get("model", "instant"),
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                ],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            }
        )

    return app


def start(*args: str) -> tuple[subprocess.Popen, str]:
    """Run this server in a child process on a free port; return it and its base URL once it answers."""
    port = free_port()
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cupid.serving.servers.instant", "--port", str(port), *args], cwd=root
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if http_get(url + "/health").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    return proc, url + "/v1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--context-window", type=int, default=0)
    parser.add_argument(
        "--preference", default=PREFERENCE, help="the preference the candidate infers for every instance"
    )
    parser.add_argument(
        "--no-preference-for", default=None, help="a regex: inference prompts it matches get no preference"
    )
    parser.add_argument(
        "--nonsense-for",
        default=None,
        help="a regex: inference prompts it matches get a preference that matches nothing",
    )
    args = parser.parse_args()
    uvicorn.run(
        create_app(args.fail_first, args.context_window, args.preference, args.no_preference_for, args.nonsense_for),
        host=args.host,
        port=args.port,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
