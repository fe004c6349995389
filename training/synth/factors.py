"""Context factors, the changed preference and the checklists (paper §3.1, App. B.2, Table 7).

Code draws each factor's slot: its factor type, preference type and task types. The paper lets the
model pick them; a small model cannot, and drawn slots keep the types balanced (the alternative the
paper names in App. B.2). Slots 0-6 get distinct factor types and distinct preference types; slot 7
is the contrastive partner of slot 6 and shares its types, as in the paper's examples. The model
writes the name, background and preference of each factor, one request per factor, in order; a
factor that repeats an earlier one is refused and asked again.
"""

from __future__ import annotations

import random
import re

from pydantic import BaseModel, ConfigDict

from cupid.matcher import prompts, schemas
from cupid.training.synth.ask import Asker
from cupid.training.synth.parse import (
    STOPWORDS,
    YES_NO_STARTS,
    Unusable,
    free_text,
    normalized,
    questions,
    require_fields,
    sentences,
    words,
)
from cupid.training.synth.tables import Attributes, examples

N_FACTORS = 8
PAIR = (6, 7)  # the last two factors: the contrastive pair
TASK_TYPES_PER_FACTOR = 2
MAX_NAME_WORDS = 12
MIN_PREFERENCE_WORDS = 5
MAX_CHECKLIST = 4


class Slot(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    factor_type: str
    preference_type: str
    task_types: list[str]


class Factor(BaseModel):
    model_config = ConfigDict(extra="forbid")
    index: int
    factor_type: str
    preference_type: str
    task_types: list[str]
    factor: str
    background: str
    preference: str
    related_factor: str | None = None
    checklist: list[str] = []


def draw_slots(rng: random.Random, attrs: Attributes) -> list[Slot]:
    factor_types = rng.sample(attrs.factor_types, N_FACTORS - 1)
    preference_types = rng.sample(attrs.all_preference_types, N_FACTORS - 1)
    slots = [
        Slot(factor_type=f, preference_type=p, task_types=rng.sample(attrs.task_types, TASK_TYPES_PER_FACTOR))
        for f, p in zip(factor_types, preference_types, strict=True)
    ]
    return slots + [slots[PAIR[0]]]


def _check_new(fields: dict[str, str], slot: Slot, factors: list[Factor]) -> None:
    name, preference = fields["Factor"].rstrip("."), fields["Preference"]
    if len(words(name)) > MAX_NAME_WORDS:
        raise Unusable(f"the factor name has more than {MAX_NAME_WORDS} words; give a short specific name")
    if not [w for w in words(name) if w not in STOPWORDS]:
        raise Unusable("the factor name is empty")
    if normalized(name) in {normalized(t) for t in [slot.factor_type, slot.preference_type, *slot.task_types]}:
        raise Unusable(f"'{name}' names a type, not a factor; give the specific name of one {slot.factor_type}")
    if normalized(slot.factor_type) in normalized(name):  # "Location/Place for this user": the prompt, not a name
        raise Unusable(
            f"'{name}' repeats the type {slot.factor_type}; give the specific name of one {slot.factor_type}"
        )
    if len(words(preference)) < MIN_PREFERENCE_WORDS:
        raise Unusable(f"the preference needs at least {MIN_PREFERENCE_WORDS} words")
    if any(normalized(p) in normalized(name) for p in [preference, *(f.preference for f in factors)]):
        # every request names its factor and none may state a preference: no request could be written
        raise Unusable("the factor name states a preference; give the name of the factor itself")
    for other in factors:
        if normalized(other.factor) == normalized(name):
            raise Unusable(f"the factor '{name}' already exists; invent a different one")
        if normalized(other.preference) == normalized(preference):
            raise Unusable(f"the preference of '{other.factor}' is the same; write a different preference")


NAME_CHARS = 60
LINE_LEAST = 20  # characters of a background or preference at least: about four words


def factor_shape(chars: int) -> str:
    """The three lines both factor prompts ask for and nothing else: `Factor: <name>` (no colon, at most
    NAME_CHARS), `Background: <one line>`, `Preference: <one statement>`, sharing `chars` between the last two."""
    name = rf"[A-Za-z0-9][^:{schemas.PLAIN}]{{1,{NAME_CHARS - 1}}}"
    background = schemas.paragraph(chars // 2, LINE_LEAST)
    return (
        rf"Factor: {name}\nBackground: {background}\nPreference: {schemas.sentence(chars // 2, LINE_LEAST, ends='.')}"
    )


def changed_shape(chars: int) -> str:
    """One sentence, a statement like the old preference, as the prompt asks."""
    return schemas.sentence(chars, LINE_LEAST, ends=".")


QUESTION_STARTS = sorted(w.capitalize() for w in YES_NO_STARTS)


def checklist_shape(chars: int) -> str:
    """1 to MAX_CHECKLIST numbered yes/no questions, one per line, as the prompt's examples show them."""
    question = rf"({'|'.join(QUESTION_STARTS)}) [^?{schemas.PLAIN}]{{8,{8 + chars // MAX_CHECKLIST}}}\?"
    pattern = ""
    for n in range(MAX_CHECKLIST, 0, -1):  # "1. q(\n2. q(\n3. q ...)?)?": numbered in order
        pattern = rf"{n}\. {question}" + (f"(\\n{pattern})?" if pattern else "")
    return pattern


def example_lists() -> tuple[list[dict], list[list[dict]]]:
    """Examples for single factors (all different) and contrastive pairs.

    Factor i shows single example i (attempt k: i + k - 1), so that factors stay apart even when a
    small model copies its example; the pair prompt shows the last pair first, whose members no
    single factor shows on a first attempt.
    """
    ex = examples()
    pairs = ex["contrastive_pairs"]
    singles = ex["factors"] + [member for pair in pairs[:-1] for member in pair]
    return singles, pairs[::-1]


_LABELLED_START = re.compile(r"^\W*(factor|background|preference)\b", re.IGNORECASE)


def read_factor(
    asker: Asker, step: str, index: int, slot: Slot, factors: list[Factor], shown: dict, related: str | None = None
):
    def read(answer: str) -> Factor:
        first = next((line for line in answer.splitlines() if line.strip()), "")
        if first and not _LABELLED_START.match(first):  # the prompt ends in "Factor:", so the name may come bare
            answer = "Factor: " + answer.lstrip()
        fields = require_fields(answer, ("Factor", "Background", "Preference"))
        _check_new(fields, slot, factors)
        preference = " ".join(sentences(fields["Preference"])[:1]) or fields["Preference"]
        example = shown["example"]
        asker.check_copy(step, f"{fields['Factor']} {preference}", f"{example['factor']} {example['preference']}")
        return Factor(
            index=index,
            **slot.model_dump(),
            factor=fields["Factor"].rstrip("."),
            background=fields["Background"],
            preference=preference,
            related_factor=related,
        )

    return read


async def generate_factors(asker: Asker, persona: str, slots: list[Slot]) -> list[Factor]:
    """Factors in slot order; the last one contrasts with the one before it (paper: the last two)."""
    singles, pairs = example_lists()
    factors: list[Factor] = []
    for index, slot in enumerate(slots[: PAIR[1]]):
        shown: dict = {}

        def build(attempt: int, index: int = index, slot: Slot = slot, shown: dict = shown) -> list[dict[str, str]]:
            example = shown["example"] = singles[(index + attempt - 1) % len(singles)]
            return prompts.load("project_synth_factor").render(
                persona=persona,
                example_factor=example["factor"],
                example_background=example["background"],
                example_preference=example["preference"],
                factor_type=slot.factor_type,
                preference_type=slot.preference_type,
            )

        step = f"factor[{index}]"
        read = read_factor(asker, step, index, slot, factors, shown)
        factors.append(await asker.ask(step, "generator", build, read, asker.cfg.max_tokens.factor, factor_shape))
    first = factors[PAIR[0]]
    shown = {}

    def build_pair(attempt: int) -> list[dict[str, str]]:
        pair = pairs[(attempt - 1) % len(pairs)]
        shown["example"] = pair[1]
        return prompts.load("project_synth_contrastive_factor").render(
            persona=persona,
            example_first_factor=pair[0]["factor"],
            example_first_preference=pair[0]["preference"],
            example_factor=pair[1]["factor"],
            example_background=pair[1]["background"],
            example_preference=pair[1]["preference"],
            factor=first.factor,
            preference=first.preference,
            factor_type=first.factor_type,
            preference_type=first.preference_type,
        )

    step = f"factor[{PAIR[1]}]"
    read = read_factor(asker, step, PAIR[1], slots[PAIR[1]], factors, shown, related=first.factor)
    second = await asker.ask(step, "generator", build_pair, read, asker.cfg.max_tokens.factor, factor_shape)
    first.related_factor = second.factor
    return factors + [second]


def _read_changed(asker: Asker, factors: list[Factor], shown: dict):
    def read(answer: str) -> str:
        text = free_text(answer, prefixes=("new preference", "preference"))
        text = " ".join(sentences(" ".join(text.split()))[:1])
        if len(words(text)) < MIN_PREFERENCE_WORDS:
            raise Unusable(f"the new preference needs at least {MIN_PREFERENCE_WORDS} words")
        if any(normalized(text) == normalized(f.preference) for f in factors):
            raise Unusable(
                "the new preference repeats an existing preference; write one that contradicts the old preference"
            )
        if any(normalized(text) in normalized(f.factor) for f in factors):
            raise Unusable("the new preference is a factor's name; write a preference that contradicts the old one")
        asker.check_copy("changed_preference", text, shown["example"]["new"])
        return text

    return read


async def change_preference(asker: Asker, factor: Factor, factors: list[Factor]) -> str:
    """The current factor's changed preference (paper: A', contradicting the original)."""
    changes = examples()["changes"]
    shown: dict = {}

    def build(attempt: int) -> list[dict[str, str]]:
        ex = shown["example"] = changes[(attempt - 1) % len(changes)]
        return prompts.load("project_synth_changed_preference").render(
            example_factor=ex["factor"],
            example_old=ex["old"],
            example_new=ex["new"],
            factor=factor.factor,
            preference=factor.preference,
        )

    read = _read_changed(asker, factors, shown)
    return await asker.ask(
        "changed_preference", "generator", build, read, asker.cfg.max_tokens.changed_preference, changed_shape
    )


def _examples_block() -> str:
    blocks = []
    for ex in examples()["checklists"]:
        items = "\n".join(f"{i}. {q}" for i, q in enumerate(ex["checklist"], start=1))
        blocks.append(f"Preference: {ex['preference']}\nQuestions:\n{items}\n")
    return "\n".join(blocks)


def read_checklist(answer: str) -> list[str]:
    items: list[str] = []
    for q in questions(answer):
        if normalized(q) not in {normalized(i) for i in items}:
            items.append(q)
    if not items:
        raise Unusable("the answer has no question ending in '?'; write one yes/no question per line")
    if len(items) > MAX_CHECKLIST:
        items = items[:MAX_CHECKLIST]  # a model that keeps going past 4 has still answered the first 4
    for q in items:
        first = words(q)[:1]
        if not first or first[0] not in YES_NO_STARTS:
            raise Unusable(f"'{q}' is not a yes/no question; start each question with Is, Are, Does or Do")
        if len(words(q)) < 3:
            raise Unusable(f"'{q}' is too short to check anything")
    return items


async def checklist(asker: Asker, step: str, preference: str) -> list[str]:
    msgs = prompts.load("project_synth_checklist").render(examples=_examples_block(), preference=preference)
    return await asker.ask(step, "generator", msgs, read_checklist, asker.cfg.max_tokens.checklist, checklist_shape)
