"""Synthesis: persona templates, the 13-session template (App. B.3), instance construction (App. B.5),
seeded choices, answer reading, each step's answer shape (structured output), failure and resume over
real HTTP, and one CPU run with the tiny model held to the shapes."""

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

from cupid.cli import app
from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.data import Message
from cupid.matcher import prompts, schemas
from cupid.serving.cache import Cache
from cupid.serving.client import Client
from cupid.serving.registry import load_endpoints
from cupid.serving.servers.ports import free_port
from cupid.training.synth import parse, tables
from cupid.training.synth.ask import Asker, StepFailed
from cupid.training.synth.config import MaxTokens, SynthConfig
from cupid.training.synth.dialogue import Turn, judge_shape, message_shape, pick_unmet, reply_shape, score
from cupid.training.synth.factors import PAIR, Factor, changed_shape, checklist_shape, factor_shape, read_checklist
from cupid.training.synth.instances import PersonaRecord, SessionRecord, draw_choices, prior_positions, rows, validated
from cupid.training.synth.personas import read_description, template
from cupid.training.synth.personas import shape as persona_shape
from cupid.training.synth.pipeline import SynthesisDir, persona_id, run
from cupid.training.synth.sessions import FINAL, layout, request_shape
from tests.helpers import write_endpoints

REPO = Path(__file__).resolve().parents[2]
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
        Factor(
            index=i,
            **s.model_dump(),
            factor=f"Factor {i}",
            background="b",
            preference=f"Preference {i} holds.",
            checklist=[f"Is {i} met?"],
        )
        for i, s in enumerate(c.slots)
    ]
    changed = "Preference changed holds."
    sessions = []
    for s in layout(c.positions, c.current_factor, c.contrastive_factor):
        pref = {"final": None, "current_changed": changed}.get(s.role, factors[s.factor_index].preference)
        dialogue = (
            []
            if s.role == "final"
            else [Message(role="user", content=f"request {s.position}"), Message(role="assistant", content="ok")]
        )
        sessions.append(
            SessionRecord(
                position=s.position,
                role=s.role,
                factor_index=s.factor_index,
                context_factor=factors[s.factor_index].factor,
                contextual_preference=pref,
                checklist=["Is it?"],
                task_type=c.task_types[s.position],
                request=f"request {s.position}",
                dialogue=dialogue,
                turns=[] if s.role == "final" else [Turn(verdicts=[False], score=1, kind="feedback", items=[0])],
                ended=None if s.role == "final" else "turn_cap",
            )
        )
    template_ = template(seed, 0, ATTRS, SEEDS)
    return PersonaRecord(
        persona_id=pid,
        index=0,
        seed=seed,
        template=template_,
        description="d",
        choices=c,
        factors=factors,
        changed_preference=changed,
        changed_checklist=["Is it changed?"],
        sessions=sessions,
        example_copies=[],
        raw=[],
    )


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
            order = [
                s["contextual_preference"] for s in row["prior_interactions"] if s["context_factor"] == current.factor
            ]
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
    answer = (
        "Here you go:\n**Factor:** Dr. Okafor\n- Background: Night hospitalist;\n  prefers stories.\n"
        "Preference: Updates should be told in order.\n\nFactor: Again"
    )
    assert parse.labelled(answer, ("Factor", "Background", "Preference")) == {
        "Factor": "Dr. Okafor",
        "Background": "Night hospitalist; prefers stories.",
        "Preference": "Updates should be told in order.",
    }
    with pytest.raises(parse.Unusable, match="no 'Preference:'"):
        parse.require_fields("Factor: X\nBackground: Y", ("Factor", "Background", "Preference"))


def test_questions_are_read_from_json_or_a_numbered_list():
    assert parse.questions('```json\n{"checklist": ["Is it short?"]}\n```') == ["Is it short?"]
    assert parse.questions("Questions:\n1. Is it short?\n2. **Does it** end with a question?\nThat is all.") == [
        "Is it short?",
        "Does it end with a question?",
    ]


def test_yes_no_reads_a_plain_answer_not_a_hedge():
    assert parse.yes_no("Yes.") is True and parse.yes_no("The answer is no, because") is False
    with pytest.raises(parse.Unusable):
        parse.yes_no("Maybe yes, maybe no")


def test_free_text_is_read_after_its_label():
    assert (
        parse.free_text('Request: "Draft my update to Dr. Okafor."', ("request",)) == "Draft my update to Dr. Okafor."
    )


def test_an_answer_that_repeats_its_prompt_is_an_echo():
    assert parse.echoes("Lena is a nurse who runs workshops", "Lena is a nurse who runs workshops for parents.")
    assert not parse.echoes("Please draft the update for Dr. Okafor", "Lena is a nurse who runs workshops.")


def test_a_dialogues_score_runs_from_1_to_10_with_the_items_met():
    assert score([True, True, True]) == 10 and score([True, True, False]) == 7 and score([False, False]) == 1


def test_the_next_item_raised_is_an_unmet_one_not_mentioned_yet():
    assert pick_unmet([True, False, False], mentioned={1}) == 2  # an unmet item not mentioned yet
    assert pick_unmet([True, False, True], mentioned={1}) == 1  # else the first unmet one again


# --- answer shapes: what each step's request carries where the engine enforces structured output -----

SHAPES = {  # every model step of the pipeline, with the cap it is sized for
    "persona (paper prompt)": (persona_shape("synth_persona"), "persona"),
    "persona": (persona_shape("project_synth_persona"), "persona"),
    "factor": (factor_shape, "factor"),
    "changed_preference": (changed_shape, "changed_preference"),
    "checklist": (checklist_shape, "checklist"),
    "request": (request_shape("Dr. Okafor's Night Shift (Ward 4)"), "request"),
    "assistant": (reply_shape, "assistant"),
    "judge": (judge_shape, "judge"),
    "message": (message_shape, "message"),
}
TINY_CAPS = SynthConfig.model_validate(yaml.safe_load((REPO / "configs/synth/tiny.yaml").read_text())).max_tokens
DEFAULT_CAPS = MaxTokens()  # MaxTokens' own defaults


def shaped(name: str, caps: MaxTokens = DEFAULT_CAPS) -> str:
    shape, cap = SHAPES[name]
    return schemas.constrained(shape, getattr(caps, cap))["structured_outputs"]["regex"]


def admits(name: str, text: str, caps: MaxTokens = DEFAULT_CAPS) -> bool:
    return re.fullmatch(shaped(name, caps), text) is not None


@pytest.mark.parametrize("name", SHAPES)
def test_every_shape_ends_within_the_request_cap(name):
    """A finite longest match that fits the tokens the request allows, even at one character per token."""
    shape, cap = SHAPES[name]
    for caps in (MaxTokens(), TINY_CAPS, MaxTokens(**{field: 8 for field in MaxTokens.model_fields})):
        fields = schemas.constrained(shape, getattr(caps, cap))
        assert 0 < schemas.width(fields["structured_outputs"]["regex"]) <= fields.get("max_tokens", getattr(caps, cap))


def example_factor(ex: dict) -> str:
    return f"Factor: {ex['factor']}\nBackground: {ex['background']}\nPreference: {ex['preference']}"


def test_factor_shape_admits_the_prompt_examples_and_nothing_around_them():
    ex = tables.examples()
    shown = ex["factors"] + [member for pair in ex["contrastive_pairs"] for member in pair]
    assert all(admits("factor", example_factor(e)) for e in shown)  # what the prompts show (the CPU caps shorten it)
    good = example_factor(shown[0])
    assert parse.require_fields(good, ("Factor", "Background", "Preference"))["Factor"] == "Progress Report"
    assert not admits("factor", good + "\n\nThis is a new context factor.")  # no chatter after the lines
    assert not admits("factor", good.replace("\nBackground:", "\n\nBackground:"))
    assert not admits("factor", "**Factor:** Progress Report" + good[len("Factor: Progress Report") :])  # no markup
    assert not admits("factor", good.replace("Progress Report", "Report: quarterly"))  # a name has no colon
    assert not admits("factor", "Factor: Progress Report\nPreference: " + shown[0]["preference"])  # all three lines
    assert not admits("factor", good.replace(shown[0]["preference"], "Short."))  # a preference of a few words at least


def test_content_rules_stay_checks_inside_the_shape():
    """Answers the factor shape admits that no later step could use are refused, with a reason for the retry."""
    from cupid.training.synth.factors import Slot, read_factor

    cfg = SynthConfig(generator="t", user_simulator="t", assistant_simulator="t")
    slot = Slot(factor_type="Location/Place", preference_type="Clarity", task_types=["Planning", "Learning"])
    earlier = [
        Factor(
            index=0,
            **slot.model_dump(),
            factor="Harbor Office",
            background="b",
            preference="Plans should list every berth.",
        )
    ]
    example = tables.examples()["factors"][0]
    read = read_factor(Asker(None, cfg, "p"), "factor[1]", 1, slot, earlier, {"example": example})
    line = "\nBackground: The user walks the harbor each morning.\nPreference: "
    refusals = {
        "Location/Place": "names a type",
        "Location/Place for this user, about Clarity": "repeats the type",
        "Harbor Office": "already exists",
        "Plans should list every berth": "states a preference",
    }
    for name, reason in refusals.items():
        answer = f"Factor: {name}{line}Maps should mark the tide times in red."
        assert admits("factor", answer)
        with pytest.raises(parse.Unusable, match=reason):
            read(answer)
    assert (
        read(f"Factor: Pier 39 Ferry Dock{line}Maps should mark the tide times in red.").factor == "Pier 39 Ferry Dock"
    )


def test_checklist_and_changed_preference_shapes_admit_the_examples():
    for ex in tables.examples()["checklists"]:
        answer = "\n".join(f"{i}. {q}" for i, q in enumerate(ex["checklist"], start=1))
        assert admits("checklist", answer) and read_checklist(answer) == ex["checklist"]
    one = "1. Is the tone direct?"
    assert not admits("checklist", "Questions:\n" + one)  # the prompt already ends in "Questions:"
    assert not admits("checklist", "1. What is the tone?")  # a yes/no question
    assert not admits("checklist", "1. Is the tone direct")  # ending in '?'
    assert not admits("checklist", "2. Is the tone direct?")  # numbered from 1, in order
    assert not admits("checklist", "\n".join(f"{i}. Is item {i} done here?" for i in range(1, 6)))  # 4 at most
    for change in tables.examples()["changes"]:
        assert admits("changed_preference", change["new"])
    assert not admits("changed_preference", "Meetings should be short. They should end on time.")  # one sentence
    assert not admits("changed_preference", "- Meetings should be short and end on time.")
    assert not admits("changed_preference", "Should meetings be short and end on time?")  # a statement


def test_prose_shapes_hold_their_sentences_and_paragraphs():
    six = (
        "Mara Ilić is a 41-year-old bridge engineer. She wants every inspection filed on time. She fears missing a "
        "hairline crack. She cares about safety above all else. Colleagues call her exacting but fair. She checks "
        "every report twice before signing."
    )
    assert admits("persona", six) and read_description(template(0, 0, ATTRS, SEEDS))(six) == six
    assert not admits("persona", six.rsplit(" She checks", 1)[0])  # six sentences, as the prompt asks
    assert not admits("persona", "## Persona\n\n" + six) and not admits(
        "persona", six.replace(". She wants", ".\n\nShe wants")
    )
    paper = (
        "```json\n"
        + json.dumps(
            {"personas": [{"description": six, "occupation": "bridge engineer"}]}, indent=2, ensure_ascii=False
        )
        + "\n```"
    )
    assert admits("persona (paper prompt)", paper) and read_description(template(0, 0, ATTRS, SEEDS))(paper) == six
    factor = "Dr. Okafor's Night Shift (Ward 4)"
    request = f"Please draft my handover notes for {factor}; the patient list is below."
    assert admits("request", request) and admits("request", f"{factor} needs a summary of tonight's admissions.")
    assert not admits("request", "Please draft my handover notes for the night shift; the list is below.")  # names it
    assert not admits("request", f"Please draft my handover notes for {factor}s and the list below.")  # as a word
    assert parse.mentions(f"Please draft {factor}'s handover notes.", factor)
    assert not admits("request", f"{request}\n\n1. Bed 3: stable.")  # one paragraph
    reply = "Here is a plan. Start with the ward list. Then the admissions. Add the open tasks. Keep it short. Sign it."
    assert admits("assistant", reply) and admits(
        "assistant", "Sure: " + "the plan has the ward list, then " * 20 + "the end."
    )
    assert not admits("assistant", reply + " " + reply * 9)  # the cap: 1000 characters by default
    assert not admits("assistant", "### Plan\n\n" + reply) and not admits("assistant", "**Plan:** " + reply)
    assert not admits("assistant", reply.replace(" Then", "\n- Then"))
    assert admits("judge", "Yes") and admits("judge", "No") and not admits("judge", "Yes, it does.")
    assert admits("message", "Hmm, that is not how I read the site notes. Can you check them again?")
    assert not admits("message", "Ok.") and not admits("message", "Thanks!\n\nBest, Mara.")


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
                await asker.ask(
                    "persona",
                    "generator",
                    [{"role": "user", "content": "Describe a nurse."}],
                    parse.yes_no,
                    8,
                    judge_shape,
                )
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
    out = SynthesisDir(cfg.out)
    assert summary["done"] == 0 and summary["failed"] == 2 and summary["failed_by_step"] == {"persona": 2}
    assert out.done_ids() == set() and out.records_file.read_text() == ""  # nothing half-written
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
    seeds.write_text(
        yaml.safe_dump(
            [
                {"occupation": "baker", "description": "A baker."},
                {"occupation": "baker", "description": "A pastry baker."},
            ]
        )
    )
    loaded = tables.load_seeds(str(seeds))
    assert loaded.by_occupation == {"baker": ["A baker.", "A pastry baker."]}
    assert template(0, 1, ATTRS, loaded).occupation == "baker"  # one occupation: every persona takes it


def test_config_rejects_unknown_fields(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump({"generator": "tiny", "user_simulator": "tiny", "assistant_simulator": "tiny", "n_turns": 3})
    )
    result = CliRunner().invoke(app, ["synth", "--config", str(bad)])
    assert result.exit_code == 2 and "n_turns" in result.output


# --- end to end over HTTP with scripted answers ---------------------------------------------------------
#
# The tiny model rarely satisfies a whole checklist, so the full pipeline (several turns, closing
# messages) is also run against an HTTP server that answers each synthesis prompt in form, the way a
# capable model would; like serving/servers/instant.py, it is a fixture for exact answers, not a model. It
# checks each answer against the regex its request carries. `broken` makes its judge answer HTTP 500,
# to fail every persona.


def scripted_answer(messages: list[dict]) -> str:
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    user = messages[-1]["content"]
    tag = hashlib.sha256(user.encode()).hexdigest()[:6]
    if "Invent a realistic person" in user:
        return (
            f"Mara {tag} is a 41-year-old engineer. She wants her bridges inspected on time. "
            "She fears missing a crack. She cares about safety above all. Colleagues call her exacting but fair. "
            "She checks every report twice."
        )
    if (
        system == prompts.load("project_synth_factor").system
        or system == prompts.load("project_synth_contrastive_factor").system
    ):
        return (
            f"Factor: Site {tag}\nBackground: She visits site {tag} monthly.\n"
            f"Preference: Reports on site {tag} should list cracks by size."
        )
    if system == prompts.load("project_synth_changed_preference").system:
        return f"New preference: Reports should group cracks by location {tag} instead of size."
    if system == prompts.load("project_synth_checklist").system:
        return f"1. Does the report list cracks {tag}?\n2. Is the report ordered as asked {tag}?"
    if "I need help from an AI assistant" in user:
        factor = re.search(r"task about (.*?)\. Write my request", user).group(1)
        return f"Please help me with the {factor} inspection summary, number {tag}; the notes are below."
    if system == prompts.load("synth_assistant_simulator").system:
        return f"Draft {sum(m['role'] == 'assistant' for m in messages) + 1}: here is the summary."
    if system == prompts.load("project_synth_judge").system:
        draft_two = "Draft 2" in user.split("The assistant's response:", 1)[1]
        first_item = "1. " not in user and re.search(r"Question: Does the report list", user) is not None
        return "Yes" if draft_two or first_item else "No"
    if "You are the user with this profile" in system:
        return (
            "Thanks, that settles it."
            if "satisfies you" in user
            else f"Hmm, that is not how I read the site notes ({tag})."
        )
    return "OK"


@pytest.fixture
def scripted_url():
    """The server, and its state: `broken`, the request bodies it got, and every answer outside its request's regex."""
    state = {"broken": False, "bodies": [], "outside": []}
    api = FastAPI()

    @api.post("/v1/chat/completions")
    async def complete(request: Request) -> JSONResponse:
        body = await request.json()
        state["bodies"].append(body)
        system = body["messages"][0]["content"]
        if state["broken"] and system == prompts.load("project_synth_judge").system:
            return JSONResponse({"error": {"message": "judge is down"}}, status_code=500)
        content = scripted_answer(body["messages"])
        regex = body.get("structured_outputs", {}).get("regex")
        if regex is not None and not re.fullmatch(regex, content):
            state["outside"].append((content, regex))
        return JSONResponse(
            {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}
        )

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}/v1", state
    server.should_exit = True
    thread.join()


def test_every_step_asks_for_its_shape_where_the_endpoint_enforces_it(tmp_path, scripted_url):
    """Each request carries its step's regex, with a cap its longest answer fits, and the scripted answers (in
    the forms the prompts ask for) are inside it; without structured output no request carries one."""
    url, state = scripted_url
    for structured in (True, False):
        state["bodies"].clear()
        endpoints = write_endpoints(
            tmp_path / "e.yaml", tiny={"base_url": url, "model": "m", "structured_output": structured}
        )
        cfg = cfg_for(tmp_path, endpoints, personas=1, max_turns=2, out=str(tmp_path / f"run-{structured}"))
        assert run(cfg)["done"] == 1
        bodies = state["bodies"]
        assert len(bodies) > 40  # persona, 8 factors, changed preference, 9 checklists, 13 requests, dialogues
        if structured:
            regexes = [b["structured_outputs"]["regex"] for b in bodies]
            assert all(b["max_tokens"] >= schemas.width(r) for b, r in zip(bodies, regexes, strict=True))
            assert {r for r in regexes} >= {shaped("factor", cfg.max_tokens), shaped("judge", cfg.max_tokens)}
        else:
            assert not any("structured_outputs" in b for b in bodies)
    assert state["outside"] == []


def test_scripted_end_to_end_dialogue_rules_and_resume(tmp_path, scripted_url):
    url, state = scripted_url
    endpoints = write_endpoints(
        tmp_path / "e.yaml", tiny={"base_url": url, "model": "m", "max_retries": 0, "structured_output": True}
    )
    cfg = cfg_for(tmp_path, endpoints, personas=2, max_turns=3, reject_example_copies=True)
    state["broken"] = True
    first = run(cfg)
    assert first["failed"] == 2 and first["failed_by_step"] == {"dialogue.judge": 2} and first["instances"] == 0
    assert all(f["reason"].startswith("request failed (http_500)") for f in first["failures"].values())
    state["broken"] = False
    second = run(cfg)  # the failed personas run again: everything before the judge comes from the cache
    assert second["done"] == 2 and second["failed"] == 0 and second["instances"] == 6
    assert second["requests"]["cached"] >= 2 * (1 + 8 + 1 + 9 + 13 + 12)
    out = SynthesisDir(cfg.out)
    dataset = cupid_data.load(out.records_file)
    assert dataset.bad_rows == [] and len(dataset.instances) == 6
    for record in out.persona_records():
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
    assert state["outside"] == [] and all("structured_outputs" in b for b in state["bodies"])


# --- end to end on CPU with the tiny model --------------------------------------------------------------


def test_tiny_model_held_to_the_shapes_writes_a_persona_then_resumes(tmp_path, tiny_server):
    """The session's model (random weights: what is checked is the pipeline) under vLLM, every step held to its
    shape (structured output), the shipped CPU config: one persona comes out whole, as three instances the data
    layer accepts; a rerun sends nothing.

    A small model left free never gets past the factors (SmolLM2-135M drops the Background line, chats, copies the
    prompt); held to the shapes, only content checks refuse its answers, and retries get past those.
    """
    endpoints = write_endpoints(tmp_path / "e.yaml", tiny={**tiny_server, "structured_output": True})
    args = ["synth", "--config", "configs/synth/tiny.yaml", "--endpoints", str(endpoints), "--personas", "1",
            "--out", str(tmp_path / "run"), "--cache", str(tmp_path / "c.sqlite")]  # fmt: skip
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    out = SynthesisDir(tmp_path / "run")
    dataset = cupid_data.load(out.records_file)
    assert dataset.bad_rows == [] and len(dataset.instances) == 3 and out.failures() == {}
    record = out.persona_records()[0]
    assert len(record.sessions) == 13 and all(
        s.dialogue[-1].role == "user" for s in record.sessions if s.role != "final"
    )
    caps = SynthConfig.model_validate(yaml.safe_load((REPO / "configs/synth/tiny.yaml").read_text())).max_tokens
    factors = [r["content"] for r in record.raw if r["step"].startswith("factor[")]
    assert factors and all(
        re.fullmatch(schemas.constrained(factor_shape, caps.factor)["structured_outputs"]["regex"], f) for f in factors
    )
    snapshot = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*.json*") if p.name != "summary.json"}
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "requests 0 sent" in again.output
    assert {p: p.read_bytes() for p in snapshot} == snapshot
