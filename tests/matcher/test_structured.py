"""Answer-format constraints: each role's pattern admits the exact form its model was prompted or trained to
write (checked against those forms with Python's regex engine), and the real tiny model under vLLM, held to
them, answers every role in a form that parses; a constrained candidate is recorded and named."""

import asyncio
import json
import re

import pytest

from cupid.common.config import ConfigError
from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.runner import RunConfig, run
from cupid.eval.benchmark.stages import constraint
from cupid.matcher import parse, prompts, schemas
from cupid.serving.client import Client
from cupid.serving.endpoint import Endpoint
from cupid.serving.registry import load_endpoints
from cupid.training.examples import completion_text
from tests.helpers import REPO, write_endpoints

ITEMS = ["Is the plan short?", 'Does it say "hi"?', "Is the tone polite, même en français?"]


def pattern(fields: dict) -> str:
    return fields["structured_outputs"]["regex"]


def admits(fields: dict, text: str) -> bool:
    return re.fullmatch(pattern(fields), text) is not None


def labelled(labels):
    return [
        {"index": i, "entry": item, "label": label}
        for i, (item, label) in enumerate(zip(ITEMS, labels, strict=True), start=1)
    ]


def test_prefmatcher_pattern_keeps_the_fence_it_was_trained_to_write():
    fields = schemas.matcher("prefmatcher", ITEMS)
    rows = labelled(["Fully Covered", "Not Covered", "Partially Covered"])
    assert admits(fields, completion_text(rows))  # exactly what `make train` teaches
    assert admits(fields, "```json\n" + json.dumps(rows, indent=4, ensure_ascii=False) + "\n```")  # pretty-printed too
    assert not admits(fields, json.dumps(rows, ensure_ascii=False))  # a bare array: not the trained form
    assert not admits(fields, completion_text(rows[:2]))  # every item labelled ...
    assert not admits(fields, completion_text([rows[1], rows[0], rows[2]]))  # ... in order
    assert not admits(fields, completion_text(labelled(["Yes", "No", "No"])))  # with the three labels only
    assert parse.matches(completion_text(rows), ITEMS)[1].label == "Not Covered"


def test_fewshot_pattern_admits_the_prompt_examples_form_and_its_reasoning_field():
    fields = schemas.matcher("fewshot", ITEMS)
    rows = labelled(["Fully Covered", "Not Covered", "Partially Covered"])
    assert admits(fields, "```json\n" + json.dumps({"results": rows}, indent=2, ensure_ascii=False) + "\n```")
    with_reasoning = [
        {"index": r["index"], "entry": r["entry"], "reasoning": "It is covered.", "label": r["label"]} for r in rows
    ]
    assert admits(fields, "```json\n" + json.dumps({"results": with_reasoning}, indent=2, ensure_ascii=False) + "\n```")
    assert not admits(fields, "```json\n" + json.dumps(rows, indent=2, ensure_ascii=False) + "\n```")


def test_judge_pattern_is_the_prompt_format_with_a_score_that_matches_its_label():
    fields = schemas.judge(None)
    answer = (
        "### Evaluation of AI Assistant's Response\n\n1. **Is the plan short?**: Yes, three steps.\n\n"
        "2. **Is it polite?**: Mostly.\n\n### Evaluation Label\n\nVery Good\n\n### Evaluation Score\n\n8"
    )
    assert admits(fields, answer) and parse.score(answer) == 8
    assert not admits(fields, answer.replace("Score\n\n8", "Score\n\n9"))  # 9 is "Excellent"
    assert not admits(
        fields, answer.replace("Very Good\n\n### Evaluation Score\n\n8", "Superb\n\n### Evaluation Score\n\n11")
    )
    assert admits(fields, answer.replace("Very Good", "Exceptional").replace("Score\n\n8", "Score\n\n10"))


def test_the_decomposer_pattern_admits_its_prompted_form_up_to_four_entries():
    checklist = (
        "**Analysis**\n\nTwo aspects: tone and length.\n\n**Checklist**\n\n```json\n"
        + json.dumps({"checklist": ["Is the tone direct?", "Is it short?"]}, indent=2)
        + "\n```"
    )
    assert admits(schemas.decomposer(None), checklist) and parse.checklist(checklist) == [
        "Is the tone direct?",
        "Is it short?",
    ]
    five = checklist.replace('"Is it short?"', '"a?", "b?", "c?", "d?"')
    assert not admits(schemas.decomposer(None), five)  # at most 4 entries, as the prompt says


def test_the_summarizer_pattern_admits_its_prompted_form():
    summary = {
        "summaries": [
            {"session_id": 1, "analysis": "The user plans.", "context": ["A trip"], "preferences": ["Short plans"]}
        ]
    }
    text = "```json\n" + json.dumps(summary, indent=2) + "\n```"
    assert admits(schemas.summarizer(None), text) and parse.session_summary(text)["preferences"] == ["Short plans"]


def test_the_candidate_inference_pattern_admits_one_preference_line():
    answer = (
        "### Analysis\n\nThe user wanted short plans before.\n\n### Most Likely Preference\n\nPlans should be short."
    )
    assert admits(schemas.inference_answer(None), answer) and parse.preference(answer) == "Plans should be short."
    assert not admits(schemas.inference_answer(None), answer + "\nAnd a second line.")


def test_every_pattern_fits_in_the_tokens_its_request_allows():
    for cap in (64, 200, 2048):
        for fields in (
            schemas.judge(cap),
            schemas.decomposer(cap),
            schemas.summarizer(cap),
            schemas.inference_answer(cap),
            schemas.matcher("prefmatcher", ITEMS, cap),
            schemas.matcher("fewshot", ITEMS, cap),
        ):
            # a token is at least one character: the answer always fits in the tokens the request allows
            assert schemas.width(pattern(fields)) <= fields.get("max_tokens", cap)


def test_the_gpt4o_reference_keeps_the_reference_request_shape():
    shipped = load_endpoints(REPO / "configs" / "endpoints.yaml")
    client = Client(shipped)
    assert constraint(client, "gpt-4o", schemas.judge) == {}
    assert pattern(constraint(client, "prefmatcher", lambda cap: schemas.matcher("prefmatcher", ITEMS, cap)))
    assert not shipped["tiny"].constrain_candidate and shipped["tiny-constrained"].constrain_candidate


def test_every_role_held_to_its_format_on_the_real_tiny_model(tiny_server):
    """The random-weight model never writes any of these forms on its own; held to them by vLLM, every answer
    parses."""
    endpoint = Endpoint(**{**tiny_server, "structured_output": True})
    session = cupid_data.load("sample").instances[0].sessions("standard")[0]
    asks = {
        "prefmatcher": (
            prompts.matcher("Plans should be short and polite.", ITEMS, "prefmatcher"),
            schemas.matcher("prefmatcher", ITEMS, endpoint.max_tokens),
            lambda a: parse.matches(a, ITEMS),
        ),
        "fewshot": (
            prompts.matcher("Plans should be short and polite.", ITEMS, "fewshot"),
            schemas.matcher("fewshot", ITEMS, endpoint.max_tokens),
            lambda a: parse.matches(a, ITEMS),
        ),
        "decomposer": (
            prompts.decomposer("Plans should be short and polite."),
            schemas.decomposer(endpoint.max_tokens),
            parse.checklist,
        ),
        "summarizer": (prompts.summarizer(session), schemas.summarizer(endpoint.max_tokens), parse.session_summary),
        "judge": (
            prompts.judge("Plans should be short.", ITEMS, "Plan my day", "Wake up. Work. Sleep."),
            schemas.judge(endpoint.max_tokens),
            parse.score,
        ),
        "candidate": (
            prompts.inference(prompts.format_interaction_log([session]), "Plan my day"),
            schemas.inference_answer(endpoint.max_tokens),
            parse.preference,
        ),
    }

    async def ask_all():
        async with Client({"t": endpoint}) as client:
            return await asyncio.gather(
                *[client.chat("t", messages, **fields) for messages, fields, _ in asks.values()]
            )

    answers = dict(zip(asks, asyncio.run(ask_all()), strict=True))
    for role, answer in answers.items():
        assert answer.finish_reason == "stop", (role, answer.content)
        asks[role][2](answer.content)  # raises ParseError if it does not parse
    assert 1 <= parse.score(answers["judge"].content) <= 10


def test_constrained_tiny_candidate_reaches_scoring_and_says_so(tmp_path, tiny_server, cupid_home):
    """The demo's setting: the tiny model in every role, its inference answers held to the task's format, judge
    roles held to theirs. Every unit is scored; run.json and the tables say the candidate was constrained, and
    the same directory refuses the free candidate (another run)."""
    endpoints = write_endpoints(
        tmp_path / "endpoints.yaml",
        tinyformat={**tiny_server, "structured_output": True},
        tinyconstrained={**tiny_server, "structured_output": True, "constrain_candidate": True},
    )
    common = {
        "endpoints": str(endpoints),
        "decomposer": "tinyformat",
        "matcher": "tinyformat",
        "judge": "tinyformat",
        "tasks": ["inference", "generation"],
        "limit": 1,
        "out": str(tmp_path / "run"),
        "cache": str(tmp_path / "cache.sqlite"),
    }
    summary = run(RunConfig(candidate="tinyconstrained", **common)).summary
    assert summary.n_failed == 0 and summary.n_scored == 2, summary.failures
    assert summary.candidate_constrained == ["inference"]
    identity = json.loads((tmp_path / "run" / "run.json").read_text())
    assert identity["roles"]["candidate"].endswith("[answer format constrained: inference]")
    markdown = (tmp_path / "run" / "summary.md").read_text()
    assert "CUPID inference (candidate answers constrained to the task's format)" in markdown
    assert "CUPID generation: preference alignment" in markdown  # generation answers stay free
    with pytest.raises(ConfigError, match="holds another run"):
        run(RunConfig(candidate="tinyformat", **common))
