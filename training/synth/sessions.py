"""The 13-session template (paper App. B.3) and each session's request (Fig. 18, one request at a time).

Template: 4 random positions among 1-12 hold the current factor, the first two with its original
preference and the last two with the changed one; 2 random positions of the remaining ones hold
the contrastive factor; the other 6 hold the 6 remaining factors in random order; position 13
holds the current factor (the instance's current request).
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, model_validator

from cupid.matcher import schemas
from cupid.training.synth.ask import Asker, Shape, chat
from cupid.training.synth.factors import Factor
from cupid.training.synth.parse import Unusable, echoes, free_text, mentions, normalized, words

N_SESSIONS = 13
FINAL = N_SESSIONS
MIN_REQUEST_WORDS = 6


class Positions(BaseModel):
    """1-based positions of the 13-session series."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    current_original: list[int]
    current_changed: list[int]
    contrastive: list[int]
    other: list[int]
    other_factors: list[int]  # the factor index at each `other` position
    final: int = FINAL

    @model_validator(mode="after")
    def _is_a_partition(self) -> Positions:
        used = self.current_original + self.current_changed + self.contrastive + self.other + [self.final]
        if sorted(used) != list(range(1, N_SESSIONS + 1)):
            raise ValueError(f"positions do not cover 1..{N_SESSIONS} exactly once: {sorted(used)}")
        if max(self.current_original) > min(self.current_changed):
            raise ValueError("the original preference must come before the changed one")
        return self


def draw_positions(rng: random.Random, other_factor_indices: list[int]) -> Positions:
    before_final = list(range(1, FINAL))
    current = sorted(rng.sample(before_final, 4))
    rest = [p for p in before_final if p not in current]
    contrastive = sorted(rng.sample(rest, 2))
    other = [p for p in rest if p not in contrastive]
    return Positions(
        current_original=current[:2],
        current_changed=current[2:],
        contrastive=contrastive,
        other=other,
        other_factors=rng.sample(other_factor_indices, len(other_factor_indices)),
    )


class SessionSlot(BaseModel):
    """What the template puts at one position."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    position: int
    role: str  # current_original | current_changed | contrastive | other | final
    factor_index: int


def layout(p: Positions, current: int, contrastive: int) -> list[SessionSlot]:
    slots = [SessionSlot(position=x, role="current_original", factor_index=current) for x in p.current_original]
    slots += [SessionSlot(position=x, role="current_changed", factor_index=current) for x in p.current_changed]
    slots += [SessionSlot(position=x, role="contrastive", factor_index=contrastive) for x in p.contrastive]
    slots += [
        SessionSlot(position=x, role="other", factor_index=f) for x, f in zip(p.other, p.other_factors, strict=True)
    ]
    slots.append(SessionSlot(position=p.final, role="final", factor_index=current))
    return sorted(slots, key=lambda s: s.position)


def request_shape(factor: str) -> Shape:
    """One self-contained paragraph that names the factor, as the prompt asks: no headings, lists or line
    breaks, and the factor's name as the prompt spells it, as a whole word (small models otherwise write
    about anything, or run on into "JavaScripter")."""

    def shape(chars: int) -> str:
        before, after = chars // 3, chars - chars // 3
        text = f"[^{schemas.PLAIN}]"
        opening = rf"[A-Z]{text}{{0,{before}}}[ \"'(]"
        rest = rf"[^A-Za-z0-9{schemas.PLAIN}]{text}{{{MIN_REQUEST_WORDS * 3},{MIN_REQUEST_WORDS * 3 + after}}}[.!?]"
        return rf"({opening})?{schemas.lit(factor)}{rest}"

    return shape


def read_request(persona: str, factor: str, preferences: list[str], earlier: list[str]):
    def read(answer: str) -> str:
        text = free_text(answer, prefixes=("request", "message", "user"))
        if len(words(text)) < MIN_REQUEST_WORDS:
            raise Unusable(f"the request needs at least {MIN_REQUEST_WORDS} words")
        if not mentions(text, factor):
            raise Unusable(f"the request does not name {factor}; write the user's request and name {factor} in it")
        if echoes(text, persona):
            raise Unusable("the answer repeats the persona description; write the user's own request to the assistant")
        if any(normalized(text) == normalized(e) for e in earlier):
            raise Unusable("this request was already made in an earlier session; write a new one")
        for preference in preferences:
            if normalized(preference) in normalized(text):
                raise Unusable("the request states the user's preference; leave the preference out")
        return text

    return read


async def write_requests(
    asker: Asker,
    persona: str,
    slots: list[SessionSlot],
    factors: list[Factor],
    task_types: dict[int, str],
    preferences: list[str],
) -> dict[int, str]:
    """One request per position, in order: each sees the previous one, which links them in time.

    The prompt has no one-shot example: small models copy examples instead of naming the factor.

    All requests differ (a prior session with the current factor must not repeat the current request).
    """
    requests: dict[int, str] = {}
    for slot in slots:
        factor = factors[slot.factor_index]
        previous = requests.get(slot.position - 1)
        msgs = chat(
            "project_synth_request",
            persona=persona,
            previous=f'\nMy previous request to the assistant was: "{previous}"' if previous else "",
            task_type=task_types[slot.position].lower(),
            factor=factor.factor,
        )
        step = f"request[{slot.position}]"
        read = read_request(persona, factor.factor, preferences, list(requests.values()))
        requests[slot.position] = await asker.ask(
            step, "generator", msgs, read, asker.cfg.max_tokens.request, request_shape(factor.factor)
        )
    return requests
