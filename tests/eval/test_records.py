"""Typed unit records: what a scorer returns, what `instances.jsonl` holds, and how it is read back."""

import asyncio
import json
from dataclasses import dataclass

import pytest

from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.generation import GenerationScorer
from cupid.eval.benchmark.inference import InferenceScorer
from cupid.eval.benchmark.records import RecordError, Scoring, StageError, UnitRecord
from cupid.eval.benchmark.rundir import RunDir
from cupid.matcher.parse import MatchItem
from cupid.serving.client import RequestFailed
from cupid.serving.endpoint import Endpoint


@dataclass
class Answer:
    content: str


class Scripted:
    """A client whose endpoints answer from a function of (endpoint, user message): no server needed."""

    def __init__(self, answer):
        self.answer = answer
        self.endpoints = {
            name: Endpoint(base_url="http://127.0.0.1:9/v1", model=name) for name in ("dec", "match", "judge")
        }

    async def chat(self, name, messages, **params):
        return Answer(self.answer(name, messages[-1]["content"]))


INSTANCE = cupid_data.load("sample").instances[0]
CANDIDATE = "### Analysis\nshort.\n### Most Likely Preference\nKeep it brief."


def test_a_failed_match_keeps_every_earlier_stage_and_both_raw_answers():
    labels = json.dumps(
        [
            {"index": 1, "entry": "Brief", "label": "Fully Covered"},
            {"index": 2, "entry": "Plain", "label": "Not Covered"},
        ]
    )

    def answer(name, user):
        if name == "dec":
            return '{"checklist": ["Brief", "Plain"]}'
        return labels if INSTANCE.current_contextual_preference in user else "no labels here"

    scorer = InferenceScorer(Scripted(answer), "dec", "match", "prefmatcher")
    scoring = asyncio.run(scorer.score(INSTANCE, CANDIDATE))
    assert not scoring.scored and scoring.error.stage == "match_gt_to_infer" and scoring.error.raw == "no labels here"
    assert scoring.inferred_preference == "Keep it brief."
    assert scoring.decomposer_answer == '{"checklist": ["Brief", "Plain"]}' and scoring.inferred_checklist == [
        "Brief",
        "Plain",
    ]
    assert scoring.matcher_answers == {"infer_to_gt": labels, "gt_to_infer": "no labels here"}
    assert [m.label for m in scoring.infer_to_gt] == ["Fully Covered", "Not Covered"]
    assert scoring.counts is None and scoring.scores is None


def test_a_failed_request_keeps_the_parsed_preference():
    class Down(Scripted):
        async def chat(self, name, messages, **params):
            raise RequestFailed("connection_error", "refused")

    scoring = asyncio.run(InferenceScorer(Down(None), "dec", "match", "prefmatcher").score(INSTANCE, CANDIDATE))
    assert scoring.error == StageError(stage="decompose", reason="connection_error", detail="refused")
    assert scoring.inferred_preference == "Keep it brief." and scoring.decomposer_answer is None


def test_the_judge_answer_is_kept_scored_or_not():
    scorer = GenerationScorer(Scripted(lambda name, user: "### Evaluation Label\nno score"), "judge")
    scoring = asyncio.run(scorer.score(INSTANCE, "a response"))
    assert (
        not scoring.scored
        and scoring.error.stage == "judge"
        and scoring.judge_answer == "### Evaluation Label\nno score"
    )


def _record(**kw) -> UnitRecord:
    unit = {
        "key": "p1/consistent",
        "persona_id": "p1",
        "instance_type": "consistent",
        "task": "inference",
        "setting": "standard",
    }
    return UnitRecord(**{**unit, **kw})


def test_records_round_trip_through_instances_jsonl_unit_fields_first(tmp_path):
    full = _record(
        status="scored",
        candidate_answer="...",
        inferred_preference="brief",
        decomposer_answer='{"checklist": ["a"]}',
        inferred_checklist=["a"],
        matcher_answers={"infer_to_gt": "[1]", "gt_to_infer": "[2]"},
        infer_to_gt=[MatchItem(index=1, entry="a", label="Fully Covered")],
        gt_to_infer=[],
        reference=Scoring(error=StageError(stage="decompose", reason="parse_error", detail="no JSON", raw="?")),
        written_by_a_newer_version=1,
    )
    failed = _record(setting="oracle", error=StageError(stage="infer", reason="timeout", detail="600 s"))
    run = RunDir(tmp_path)
    with run.append() as sink:
        for record in (full, failed):
            sink.write(record.to_json() + "\n")
    lines = run.records_file.read_text().splitlines()
    assert list(json.loads(lines[0]))[:5] == ["key", "persona_id", "instance_type", "task", "setting"]
    assert "error" not in json.loads(lines[0]) and json.loads(lines[0])["written_by_a_newer_version"] == 1
    assert run.records() == {full.unit: full, failed.unit: failed}


def test_a_torn_last_line_is_passed_over_without_spoiling_the_next_append(tmp_path):
    run = RunDir(tmp_path)
    run.records_file.write_text(_record().to_json() + "\n" + _record(setting="oracle").to_json()[:40])
    assert list(run.records()) == [("p1/consistent", "inference", "standard")]
    with run.append() as sink:
        sink.write(_record(setting="summary").to_json() + "\n")
    assert [unit[2] for unit in run.records()] == ["standard", "summary"]


def test_a_line_that_is_not_a_record_is_named_by_file_and_line(tmp_path):
    run = RunDir(tmp_path)
    run.records_file.write_text(_record().to_json() + "\n" + json.dumps({"key": "k"}) + "\n")
    with pytest.raises(RecordError, match=r"instances.jsonl:2: not a unit record"):
        run.records()
