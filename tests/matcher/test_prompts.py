import json
import re
from pathlib import Path

import pytest

from cupid.matcher import prompts

SPEC = Path(__file__).resolve().parents[3] / "shared" / "spec" / "prompts.md"
PROMPTS = Path(prompts.__file__).parent / "prompts"


@pytest.mark.skipif(not SPEC.is_file(), reason="the benchmark spec is not beside this checkout")
def test_prompt_files_are_byte_identical_to_the_spec():
    spec = SPEC.read_text(encoding="utf-8")
    compared = set()
    for section in re.split(r"^## (?=prompt: )", spec, flags=re.MULTILINE)[1:]:
        name = section.split("\n", 1)[0].removeprefix("prompt: ").strip()
        for role in ("system", "user"):
            m = re.search(r"^### " + role + r"\n\n````text\n(.*?)\n````\n", section, flags=re.DOTALL | re.MULTILINE)
            if m:
                assert getattr(prompts.load(name), role) == m.group(1), f"{name}.{role} differs from the spec"
                compared.add((name, role))
    # every prompt file the spec gives (the project's own are named project_*) was found there and compared
    shipped = {tuple(f.name.split(".")[:2]) for f in PROMPTS.glob("*.txt") if not f.name.startswith("project_")}
    assert compared == shipped


def test_decomposer_renders_literal_braces_and_the_preference():
    system, user = prompts.decomposer("Be terse.")
    assert '```json\n{\n  "checklist": [' in system["content"]
    assert "{{" not in system["content"]
    assert user["content"] == "**Preferences**\n\nBe terse."


def test_fewshot_examples_render_as_specified():
    block = prompts.fewshot_examples()
    assert block.startswith("#### Preference\n\nProcedures must prioritize equipment security")
    assert block.count("#### Output\n\n```json\n") == 8
    assert block.endswith("```\n\n---")  # only whitespace is stripped, as in the reference
    first = block.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(first)["results"][0] == {
        "index": 1,
        "entry": "Does the protocol incorporate detailed weather monitoring procedures?",
        "label": "Partially Covered",
    }
    assert '  "results": [\n    {\n      "index": 1,' in first  # json.dumps(indent=2)


def test_matcher_dialects():
    pm = prompts.matcher("Be terse.", ["Is it short?", "Is it blunt?"], "prefmatcher")
    assert pm[1]["content"] == "#### Criterion\n\nBe terse.\n\n#### Checklist\n\n1. Is it short?\n2. Is it blunt?"
    fs = prompts.matcher("Be terse.", ["Is it short?"], "fewshot")
    assert fs[0]["content"].endswith(prompts.fewshot_examples())
    assert fs[1]["content"] == "#### Preference\n\nBe terse.\n\n#### Checklist\n\n1. Is it short?"
    assert prompts.matcher_dialect_for("kixlab/prefmatcher-7b") == "prefmatcher"
    assert prompts.matcher_dialect_for("gpt-4o-2024-11-20") == "fewshot"


def test_interaction_log_matches_the_reference_layout():
    sessions = [
        {"dialogue": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]},
        {"dialogue": [{"role": "user", "content": "Again"}]},
    ]
    assert prompts.format_interaction_log(sessions) == (
        "### Session 1\n\n#### User\n\nHi\n\n#### AI Assistant\n\nHello\n\n---\n\n"
        "### Session 2\n\n#### User\n\nAgain\n\n---"
    )
    messages = prompts.inference(prompts.format_interaction_log(sessions), "Write it.")
    assert messages[1]["content"].startswith("## Log of Previous Interaction Sessions\n\n### Session 1")
    assert "### User\n\nWrite it.\n\n---" in messages[1]["content"]


def test_versions_change_with_the_text():
    assert prompts.load("inference").version != prompts.load("decomposer").version
    assert len(prompts.versions("inference", "prefmatcher")) == 2
