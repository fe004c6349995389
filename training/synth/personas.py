"""Persona templates by balanced sampling (paper App. B.1, Table 5) and their expansion by a model.

Balance: every attribute is drawn from a stream of shuffled cycles over its values (pairs of traits
and pairs of values count as one value each), so within each cycle every value appears exactly
once. Persona i takes element i of each stream: its template depends on the seed and i alone, so
`--personas 10` after `--personas 4` keeps the first four personas as they were.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from cupid.matcher import prompts, schemas
from cupid.training.synth.ask import Asker, Shape
from cupid.training.synth.parse import Unusable, complete_sentences, echoes, free_text, json_value, sentences, words
from cupid.training.synth.tables import Attributes, Seeds

MIN_SENTENCES = 3
MIN_WORDS = 30
SENTENCES = 6  # both prompts ask for six
SENTENCE_LEAST = 24  # characters: a sentence of about five words at least


class Template(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    occupation: str
    seed_description: str
    career_level: str
    personality_traits: list[tuple[str, str]]  # (trait, level), two of them
    personal_values: list[str]  # two
    decision_style: str


def cycled(seed: int, stream: str, pool: Sequence[Any], i: int) -> Any:
    """Element i of the stream of shuffled copies of `pool` (copy c shuffled by its own seed)."""
    cycle, position = divmod(i, len(pool))
    order = random.Random(f"{seed}/{stream}/{cycle}").sample(list(pool), len(pool))
    return order[position]


def template(seed: int, i: int, attrs: Attributes, seeds: Seeds) -> Template:
    occupation = cycled(seed, "occupation", seeds.occupations, i)
    description = random.Random(f"{seed}/seed-description/{i}").choice(seeds.by_occupation[occupation])
    traits = cycled(seed, "traits", list(itertools.combinations(attrs.personality_traits, 2)), i)
    levels = cycled(seed, "trait-levels", list(itertools.product(attrs.trait_levels, repeat=2)), i)
    values = cycled(seed, "values", list(itertools.combinations(attrs.personal_values, 2)), i)
    return Template(
        occupation=occupation,
        seed_description=description,
        career_level=cycled(seed, "career", attrs.career_levels, i),
        personality_traits=list(zip(traits, levels, strict=True)),
        personal_values=list(values),
        decision_style=cycled(seed, "decision", list(attrs.decision_styles), i),
    )


def _traits(t: Template, lower: bool = False) -> str:
    text = ", ".join(f"{level} {trait}" for trait, level in t.personality_traits)
    return text.lower() if lower else text


def messages(t: Template, prompt_name: str) -> list[dict[str, str]]:
    prompt = prompts.load(prompt_name)
    if prompt_name == "synth_persona":  # the paper's prompt: a list of basic personas, here of one
        seed_block = (
            f"1. {t.seed_description}\n   - Occupation: {t.occupation}\n   - Career Level: {t.career_level}\n"
            f"   - Personality Traits: {_traits(t)}\n   - Personal Values: {', '.join(t.personal_values)}\n"
            f"   - Decision-Making Style: {t.decision_style}"
        )
        return prompt.render(seed_descriptions=seed_block)
    description = t.seed_description[:1].lower() + t.seed_description[1:]
    return prompt.render(
        description=description.rstrip("."),
        career_level=t.career_level.split("/")[0].lower(),
        traits=_traits(t, lower=True),
        values=", ".join(t.personal_values).lower(),
        decision_style=t.decision_style.lower(),
    )


def shape(prompt_name: str) -> Shape:
    """The paper's prompt (Fig. 13): its fenced `{"personas": [{description, occupation}]}`, of one persona
    here; the project's: the six sentences in one paragraph."""
    if prompt_name == "synth_persona":

        def paper(chars: int) -> str:  # a JSON string's longest match has every character escaped: half of them
            persona = schemas.jobject(
                [("description", schemas.jstring(max(1, chars // 2))), ("occupation", schemas.jstring(40))]
            )
            return schemas.fenced(schemas.jobject([("personas", schemas.jlist([persona]))]))

        return paper
    return lambda chars: schemas.sentences(SENTENCES, SENTENCES, chars, least=SENTENCE_LEAST)


def read_description(t: Template):
    """The description from the paper prompt's JSON ({"personas": [...]} or a list) or from plain text."""

    def read(answer: str) -> str:
        payload = json_value(answer)
        if isinstance(payload, dict) and isinstance(payload.get("personas"), list):
            payload = payload["personas"]
        if isinstance(payload, list) and payload and isinstance(payload[0], dict):
            payload = payload[0]
        if isinstance(payload, dict) and isinstance(payload.get("description"), str):
            text = payload["description"]
        else:
            text = free_text(answer, prefixes=("description", "persona"))
        text = complete_sentences(" ".join(text.split()))
        distinct = {" ".join(words(s)) for s in sentences(text)}
        if len(distinct) < MIN_SENTENCES or len(words(text)) < MIN_WORDS:
            raise Unusable(
                f"the description needs at least {MIN_SENTENCES} different sentences and {MIN_WORDS} words "
                f"(it has {len(distinct)} and {len(words(text))})"
            )
        if echoes(text, t.seed_description, share=0.8):
            raise Unusable(
                "the description only repeats the basic description; describe the person in six new sentences"
            )
        return text

    return read


async def expand(asker: Asker, t: Template) -> str:
    cfg = asker.cfg
    return await asker.ask(
        "persona",
        "generator",
        messages(t, cfg.persona_prompt),
        read_description(t),
        cfg.max_tokens.persona,
        shape(cfg.persona_prompt),
    )
