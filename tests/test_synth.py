"""Synthesis: persona templates, the 13-session template (App. B.3), instance construction (App. B.5),
seeded choices, answer reading, failure and resume over real HTTP, and one CPU run with the tiny model."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import uvicorn
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from typer.testing import CliRunner

from cupid import app
from eval import data as cupid_data
from matcher import prompts
from serving.cache import Cache
from serving.client import Client
from serving.endpoints import load_endpoints
from serving.instant import free_port
from tests.conftest import write_endpoints
from training.synth import parse, tables
from training.synth.ask import Asker, StepFailed
from training.synth.config import SynthConfig
from training.synth.dialogue import Message, Turn, pick_unmet, score
from training.synth.factors import PAIR, Factor
from training.synth.instances import PersonaRecord, SessionRecord, draw_choices, prior_positions, rows, validated
from training.synth.personas import template
from training.synth.pipeline import RunDir, persona_id, run
from training.synth.sessions import FINAL, layout

REPO = Path(__file__).resolve().parents[1]
ATTRS = tables.attributes()
SEEDS = tables.load_seeds(None)


# --- persona templates (App. B.1, Table 5) ----------------------------------------------------


def test_attribute_tables_are_the_papers():
    assert len(ATTRS.career_levels) == 3 and len(ATTRS.decision_styles) == 4
    assert len(ATTRS.personal_values) == 10 and len(ATTRS.personality_traits) == 4
    assert len(ATTRS.factor_types) == 8 and len(ATTRS.task_types) == 12
    assert len(ATTRS.all_preference_types) == 16


def test_templates_are_balanced_and_do_not_depend_on_the_run_size():
    n = 24  # whole cycles of 3 career levels, 4 styles, 6 trait pairs, 4 level pairs
    ts = [template(7, i, ATTRS, SEEDS) for i in range(n)]
    assert set(Counter(t.career_level for t in ts).values()) == {8}
    assert set(Counter(t.decision_style for t in ts).values()) == {6}
    assert set(Counter(tuple(sorted(x for x, _ in t.personality_traits)) for t in ts).values()) == {4}
    assert set(Counter(trait for t in ts for trait, _ in t.personality_traits).values()) == {12}
    assert len({t.occupation for t in ts}) == n  # distinct occupations while the list lasts (40 here)
    assert all(len(set(t.personal_values)) == 2 for t in ts)
    assert all(t.seed_description in SEEDS.by_occupation[t.occupation] for t in ts)
    # persona i is the same whatever N is, and another seed gives other personas
    assert [template(7, i, ATTRS, SEEDS) for i in range(5)] == ts[:5]
    assert [template(8, i, ATTRS, SEEDS) for i in range(5)] != ts[:5]


# --- the 13-session template (App. B.3) -----------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_session_template_positions(seed):
    c = draw_choices(seed, persona_id(seed, 0), ATTRS)
    p = c.positions
    current = p.current_original + p.current_changed
    assert len(p.current_original) == len(p.current_changed) == 2 and len(p.contrastive) == 2
    assert max(p.current_original) < min(p.current_changed)  # first two original, last two changed
    assert p.final == FINAL == 13 and all(x < FINAL for x in current + p.contrastive + p.other)
    assert sorted(current + p.contrastive + p.other + [p.final]) == list(range(1, 14))
    assert sorted(p.other_factors) == [i for i in range(8) if i not in PAIR]  # each other factor once
    assert {c.current_factor, c.contrastive_factor} == set(PAIR)
    # the contrastive pair shares its types; the other factors have distinct factor types
    assert c.slots[PAIR[0]] == c.slots[PAIR[1]]
    assert len({s.factor_type for s in c.slots[: PAIR[1]]}) == 7
    slots = layout(p, c.current_factor, c.contrastive_factor)
    assert [s.position for s in slots] == list(range(1, 14))
    by_role = Counter(s.role for s in slots)
    assert by_role == {"current_original": 2, "current_changed": 2, "contrastive": 2, "other": 6, "final": 1}
    assert all(s.factor_index == c.current_factor for s in slots if s.role.startswith("current") or s.role == "final")
    assert all(s.factor_index == c.contrastive_factor for s in slots if s.role == "contrastive")
    assert all(c.slots[s.factor_index].task_types.count(c.task_types[s.position]) == 1 for s in slots)


def test_template_positions_are_random_but_seeded():
    draws = [draw_choices(0, persona_id(0, i), ATTRS) for i in range(60)]
    assert draws[3] == draw_choices(0, persona_id(0, 3), ATTRS)  # same seed and persona: same choices
    assert draw_choices(1, persona_id(1, 3), ATTRS) != draws[3]
    seen = Counter(x for d in draws for x in d.positions.current_original + d.positions.current_changed)
    assert set(seen) == set(range(1, 13))  # the current factor lands anywhere before the final session
    assert len({tuple(d.positions.contrastive) for d in draws}) > 20


# --- instance construction (App. B.5) ------------------------------------------------------------


def fake_record(seed: int) -> PersonaRecord:
    """A finished persona with code-written texts: enough to check which sessions each instance keeps."""
    pid = persona_id(seed, 0)
    c = draw_choices(seed, pid, ATTRS)
    factors = [
        Factor(index=i, **s.model_dump(), factor=f"Factor {i}", background="b", preference=f"Preference {i} holds.", checklist=[f"Is {i} met?"])
        for i, s in enumerate(c.slots)
    ]
    changed = "Preference changed holds."
    sessions = []
    for s in layout(c.positions, c.current_factor, c.contrastive_factor):
        pref = {"final": None, "current_changed": changed}.get(s.role, factors[s.factor_index].preference)
        dialogue = [] if s.role == "final" else [Message(role="user", content=f"request {s.position}"), Message(role="assistant", content="ok")]
        sessions.append(
            SessionRecord(
                position=s.position, role=s.role, factor_index=s.factor_index, context_factor=factors[s.factor_index].factor,
                contextual_preference=pref, checklist=["Is it?"], task_type=c.task_types[s.position], request=f"request {s.position}",
                dialogue=dialogue, turns=[] if s.role == "final" else [Turn(verdicts=[False], score=1, kind="feedback", items=[0])],
                ended=None if s.role == "final" else "turn_cap",
            )
        )  # fmt: skip
    template_ = template(seed, 0, ATTRS, SEEDS)
    return PersonaRecord(
        persona_id=pid, index=0, seed=seed, template=template_, description="d", choices=c, factors=factors,
        changed_preference=changed, changed_checklist=["Is it changed?"], sessions=sessions, example_copies=[], raw=[],
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(20))
def test_instance_construction_rules(seed):
    record = fake_record(seed)
    c, p = record.choices, record.choices.positions
    current, contrast = record.factors[c.current_factor], record.factors[c.contrastive_factor]
    built = {r["instance_type"]: r for r in validated(record)}
    assert set(built) == {"consistent", "contrastive", "changing"}
    for kind, row in built.items():
        kept = prior_positions(p, c.removed, kind)
        assert len(row["prior_interactions"]) == 8 and kept == sorted(kept)  # 8 sessions, in time order
        assert [s["dialogue"][0]["content"] for s in row["prior_interactions"]] == [f"request {x}" for x in kept]
        assert row["current_request"] == "request 13" and row["current_context_factor"] == current.factor
        prefs = Counter((s["context_factor"], s["contextual_preference"]) for s in row["prior_interactions"])
        with_original = prefs[(current.factor, current.preference)]
        with_changed = prefs[(current.factor, record.changed_preference)]
        with_contrast = prefs[(contrast.factor, contrast.preference)]
        others = 8 - with_original - with_changed - with_contrast
        if kind == "consistent":
            assert (with_original, with_changed, with_contrast, others) == (2, 0, 0, 6)
        elif kind == "contrastive":
            assert (with_original, with_changed, with_contrast, others) == (2, 0, 2, 4)
            assert set(c.removed["contrastive"]) <= set(p.other) and not set(c.removed["contrastive"]) & set(kept)
        else:
            assert (with_original, with_changed, with_contrast, others) == (2, 2, 0, 4)
            assert set(c.removed["changing"]) <= set(p.other) and not set(c.removed["changing"]) & set(kept)
            # the user held the original preference before the changed one
            order = [s["contextual_preference"] for s in row["prior_interactions"] if s["context_factor"] == current.factor]
            assert order == [current.preference] * 2 + [record.changed_preference] * 2
        expected = record.changed_preference if kind == "changing" else current.preference
        assert row["current_contextual_preference"] == expected
        assert row["current_checklist"] == (record.changed_checklist if kind == "changing" else current.checklist)
        # the oracle setting keeps exactly the sessions that hold the current preference
        instance = cupid_data.Instance.model_validate(row)
        assert len(instance.sessions("oracle")) == 2


def test_rows_fail_the_data_layer_when_a_field_is_missing(tmp_path):
    record = fake_record(3)
    record.sessions[-1].request = ""  # the final session's request is the current request: must not be empty
    with pytest.raises(ValueError, match="current_request"):
        validated(record)


def test_record_round_trips_through_json():
    record = fake_record(5)
    again = PersonaRecord.model_validate_json(record.model_dump_json())
    assert again == record and rows(again) == rows(record)


# --- reading answers ---------------------------------------------------------------------------------


def test_labelled_fields_tolerate_markdown_and_repeats():
    answer = "Here you go:\n**Factor:** Dr. Okafor\n- Background: Night hospitalist;\n  prefers stories.\nPreference: Updates should be told in order.\n\nFactor: Again"
    assert parse.labelled(answer, ("Factor", "Background", "Preference")) == {
        "Factor": "Dr. Okafor",
        "Background": "Night hospitalist; prefers stories.",
        "Preference": "Updates should be told in order.",
    }
    with pytest.raises(parse.Unusable, match="no 'Preference:'"):
        parse.require_fields("Factor: X\nBackground: Y", ("Factor", "Background", "Preference"))


def test_questions_yes_no_and_free_text():
    assert parse.questions('```json\n{"checklist": ["Is it short?"]}\n```') == ["Is it short?"]
    assert parse.questions("Questions:\n1. Is it short?\n2. **Does it** end with a question?\nThat is all.") == [
        "Is it short?",
        "Does it end with a question?",
    ]
    assert parse.yes_no("Yes.") is True and parse.yes_no("The answer is no, because") is False
    with pytest.raises(parse.Unusable):
        parse.yes_no("Maybe yes, maybe no")
    assert parse.free_text('Request: "Draft my update to Dr. Okafor."', ("request",)) == "Draft my update to Dr. Okafor."
    assert parse.echoes("Lena is a nurse who runs workshops", "Lena is a nurse who runs workshops for parents.")
    assert not parse.echoes("Please draft the update for Dr. Okafor", "Lena is a nurse who runs workshops.")


def test_dialogue_score_and_item_choice():
    assert score([True, True, True]) == 10 and score([True, True, False]) == 7 and score([False, False]) == 1
    assert pick_unmet([True, False, False], mentioned={1}) == 2  # an unmet item not mentioned yet
    assert pick_unmet([True, False, True], mentioned={1}) == 1  # else the first unmet one again


# --- failure and resume over real HTTP (the instant server answers "OK" to synthesis prompts) -------


def cfg_for(tmp_path: Path, endpoints: Path, **extra) -> SynthConfig:
    base = yaml.safe_load((REPO / "configs/synth/tiny.yaml").read_text())
    base |= {"endpoints": str(endpoints), "out": str(tmp_path / "run"), "cache": str(tmp_path / "cache.sqlite")} | extra
    return SynthConfig.model_validate(base)


def test_an_unusable_answer_is_retried_with_another_request_then_fails(tmp_path, instant_url):
    endpoints = write_endpoints(tmp_path / "e.yaml", tiny={"base_url": instant_url, "model": "m"})
    cfg = cfg_for(tmp_path, endpoints, retries=2)
    cache = Cache(tmp_path / "cache.sqlite")

    async def go():
        async with Client(load_endpoints(endpoints), cache) as client:
            asker = Asker(client, cfg, "p")
            with pytest.raises(StepFailed) as failed:
                await asker.ask("persona", "generator", [{"role": "user", "content": "Describe a nurse."}], parse.yes_no, 8)
            return asker, failed.value

    asker, failure = asyncio.run(go())
    assert failure.step == "persona" and "3 attempt(s)" in failure.reason and "neither yes nor no" in failure.reason
    assert [r["attempt"] for r in asker.raw] == [1, 2, 3] and all(r["content"] == "OK" for r in asker.raw)
    assert len(cache) == 3  # three different requests (note, seed, temperature), all sent and kept
    cache.close()


def test_failed_personas_are_recorded_whole_and_retried(tmp_path, instant_url):
    endpoints = write_endpoints(tmp_path / "e.yaml", tiny={"base_url": instant_url, "model": "m"})
    cfg = cfg_for(tmp_path, endpoints, personas=2, retries=1)
    summary = run(cfg)
    out = RunDir(cfg.out)
    assert summary["done"] == 0 and summary["failed"] == 2 and summary["failed_by_step"] == {"persona": 2}
    assert out.done_ids() == set() and out.instances_file.read_text() == ""  # nothing half-written
    failure = json.loads((out.failed / f"{persona_id(0, 1)}.json").read_text())
    assert failure["step"] == "persona" and "description needs" in failure["reason"]
    assert [r["content"] for r in failure["raw"]] == ["OK", "OK"]
    assert summary["requests"] == {"sent": 4, "cached": 0, "failed": 0}
    again = run(cfg)  # failed personas run again; the same attempts come from the cache
    assert again["failed"] == 2 and again["requests"] == {"sent": 0, "cached": 4, "failed": 0}
    more = run(cfg.model_copy(update={"retries": 2}))  # more attempts may rescue them: only the new one is sent
    assert more["failed"] == 2 and more["requests"] == {"sent": 2, "cached": 4, "failed": 0}
    assert "3 attempt(s)" in more["failures"][persona_id(0, 0)]["reason"]


def test_a_run_directory_refuses_another_run(tmp_path, instant_url):
    endpoints = write_endpoints(tmp_path / "e.yaml", tiny={"base_url": instant_url, "model": "m"})
    run(cfg_for(tmp_path, endpoints, personas=1, retries=0))
    with pytest.raises(ValueError, match="max_turns"):
        run(cfg_for(tmp_path, endpoints, personas=1, retries=0, max_turns=3))


def test_a_seeds_file_is_checked_by_entry(tmp_path):
    seeds = tmp_path / "seeds.yaml"
    seeds.write_text(yaml.safe_dump([{"occupation": "baker", "description": "A baker."}, {"occupation": "smith"}]))
    with pytest.raises(ValueError, match=r"(?s)seeds.yaml: entry 1.*description: Field required"):
        tables.load_seeds(str(seeds))
    seeds.write_text(yaml.safe_dump([{"occupation": "baker", "description": "A baker."}, {"occupation": "baker", "description": "A pastry baker."}]))
    loaded = tables.load_seeds(str(seeds))
    assert loaded.by_occupation == {"baker": ["A baker.", "A pastry baker."]}
    assert template(0, 1, ATTRS, loaded).occupation == "baker"  # one occupation: every persona takes it


def test_config_rejects_unknown_fields(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"generator": "tiny", "user_simulator": "tiny", "assistant_simulator": "tiny", "n_turns": 3}))
    result = CliRunner().invoke(app, ["synth", "--config", str(bad)])
    assert result.exit_code == 2 and "n_turns" in result.output


# --- end to end over HTTP with scripted answers ---------------------------------------------------------
#
# The tiny model cannot write usable factors often enough, and never satisfies a checklist, so the
# full pipeline (closing messages included) is also run against an HTTP server that answers each
# synthesis prompt in form, the way a capable model would; like serving/instant.py, it is a fixture
# for exact answers, not a model. `broken` makes its judge answer HTTP 500, to fail every persona.


def scripted_answer(messages: list[dict]) -> str:
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    user = messages[-1]["content"]
    tag = hashlib.sha256(user.encode()).hexdigest()[:6]
    if "Invent a realistic person" in user:
        return (
            f"Mara {tag} is a 41-year-old engineer. She wants her bridges inspected on time. She fears missing a crack. "
            "She cares about safety above all. Colleagues call her exacting but fair. She checks every report twice."
        )
    if system == prompts.load("project_synth_factor").system or system == prompts.load("project_synth_contrastive_factor").system:
        return f"Factor: Site {tag}\nBackground: She visits site {tag} monthly.\nPreference: Reports on site {tag} should list cracks by size."
    if system == prompts.load("project_synth_changed_preference").system:
        return f"New preference: Reports should group cracks by location {tag} instead of size."
    if system == prompts.load("project_synth_checklist").system:
        return f"Questions:\n1. Does the report list cracks {tag}?\n2. Is the report ordered as asked {tag}?"
    if "I need help from an AI assistant" in user:
        factor = re.search(r"task about (.*?)\. Write my request", user).group(1)
        return f"Please help me with the {factor} inspection summary, number {tag}; the notes are below."
    if system == prompts.load("synth_assistant_simulator").system:
        return f"Draft {sum(m['role'] == 'assistant' for m in messages) + 1}: here is the summary."
    if system == prompts.load("project_synth_judge").system:
        draft_two = "Draft 2" in user.split("The assistant's response:", 1)[1]
        first_item = "1. " not in user and re.search(r"Question: Does the report list", user) is not None
        return "Yes." if draft_two or first_item else "No."
    if "You are the user with this profile" in system:
        return "Thanks, that settles it." if "satisfies you" in user else f"Hmm, that is not how I read the site notes ({tag})."
    return "OK"


@pytest.fixture
def scripted_url():
    state = {"broken": False}
    api = FastAPI()

    @api.post("/v1/chat/completions")
    async def complete(request: Request) -> JSONResponse:
        body = await request.json()
        system = body["messages"][0]["content"]
        if state["broken"] and system == prompts.load("project_synth_judge").system:
            return JSONResponse({"error": {"message": "judge is down"}}, status_code=500)
        content = scripted_answer(body["messages"])
        return JSONResponse({"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}/v1", state
    server.should_exit = True
    thread.join()


def test_scripted_end_to_end_dialogue_rules_and_resume(tmp_path, scripted_url):
    url, state = scripted_url
    endpoints = write_endpoints(tmp_path / "e.yaml", tiny={"base_url": url, "model": "m", "max_retries": 0})
    cfg = cfg_for(tmp_path, endpoints, personas=2, max_turns=3, reject_example_copies=True)
    state["broken"] = True
    first = run(cfg)
    assert first["failed"] == 2 and first["failed_by_step"] == {"dialogue.judge": 2} and first["instances"] == 0
    assert all(f["reason"].startswith("request failed (http_500)") for f in first["failures"].values())
    state["broken"] = False
    second = run(cfg)  # the failed personas run again: everything before the judge comes from the cache
    assert second["done"] == 2 and second["failed"] == 0 and second["instances"] == 6
    assert second["requests"]["cached"] >= 2 * (1 + 8 + 1 + 9 + 13 + 12)
    out = RunDir(cfg.out)
    dataset = cupid_data.load(out.instances_file)
    assert dataset.bad_rows == [] and len(dataset.instances) == 6
    for record in out.records():
        assert record.example_copies == []
        for s in record.sessions:
            if s.role == "final":
                assert s.dialogue == [] and s.contextual_preference is None
                continue
            # draft 1 meets item 1 only: feedback on item 2; draft 2 meets both: closing on item 1, unmentioned so far
            assert [t.kind for t in s.turns] == ["feedback", "closing"] and s.ended == "satisfied"
            assert [t.items for t in s.turns] == [[1], [0]] and [t.score for t in s.turns] == [5, 10]
            assert [m.role for m in s.dialogue] == ["user", "assistant", "user", "assistant", "user"]
            assert s.dialogue[0].content == s.request and s.dialogue[-1].content == "Thanks, that settles it."
        assert len({s.request for s in record.sessions}) == 13
    snapshot = {p: p.read_bytes() for p in out.personas.glob("*.json")}
    third = run(cfg)  # nothing left to do: no request at all, finished personas untouched
    assert third["requests"] == {"sent": 0, "cached": 0, "failed": 0} and third["skipped_as_done"] == 2
    assert {p: p.read_bytes() for p in out.personas.glob("*.json")} == snapshot


# --- end to end on CPU with the tiny model --------------------------------------------------------------


def test_tiny_model_end_to_end_then_resume(tmp_path, tiny_server):
    """The real tiny model over real HTTP, one persona, then a rerun.

    A 135M model rarely writes a usable context factor, so the persona may end either way; both ways
    must be whole: finished with three valid instances, or failed at a named step with its reason and
    raw answers and nothing else written. The rerun must send nothing new and end the same way.
    """
    endpoints = write_endpoints(tmp_path / "e.yaml", tiny={**tiny_server, "max_concurrency": 16})
    # no retry (the config has 5): a failing persona stays short on a busy CPU, where a request takes ~30 s
    args = ["synth", "--config", "configs/synth/tiny.yaml", "--endpoints", str(endpoints), "--personas", "1",
            "--out", str(tmp_path / "run"), "--cache", str(tmp_path / "c.sqlite"), "--allow-failures",
            "--retries", "0"]  # fmt: skip
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    out = RunDir(tmp_path / "run")
    rows_ = [line for line in out.instances_file.read_text().splitlines() if line]
    if out.done_ids():
        dataset = cupid_data.load(out.instances_file)
        assert dataset.bad_rows == [] and len(dataset.instances) == 3 and out.failures() == {}
        record = out.records()[0]
        assert len(record.sessions) == 13 and all(s.dialogue[-1].role == "user" for s in record.sessions if s.role != "final")
    else:
        failure = json.loads((out.failed / f"{persona_id(0, 0)}.json").read_text())
        assert failure["step"] and failure["reason"] and rows_ == []
        assert failure["raw"] and all(r["content"] is not None for r in failure["raw"])  # the model did answer
        assert failure["raw"][0]["step"] == "persona"
    snapshot = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*.json*") if p.name != "summary.json"}
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "requests 0 sent" in again.output
    assert {p: p.read_bytes() for p in snapshot} == snapshot
