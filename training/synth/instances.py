"""A finished persona's record and its three CUPID instances (paper §3.1 "Creating Instances", App. B.5).

From sessions 1-12 (session 13 gives the current request), each instance keeps 8 prior sessions:
- consistent: without the 2 changed-preference sessions and the 2 contrastive-factor sessions;
  current preference = the original one.
- contrastive: without the 2 changed-preference sessions and 2 random sessions of other factors;
  current preference = the original one.
- changing: without the 2 contrastive-factor sessions and 2 random sessions of other factors;
  current preference = the changed one.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel, ConfigDict

from cupid.eval.benchmark.data import INSTANCE_TYPES, Dataset, Message, validate_rows
from cupid.training.synth.dialogue import Turn
from cupid.training.synth.factors import PAIR, Factor, Slot, draw_slots
from cupid.training.synth.personas import Template
from cupid.training.synth.sessions import FINAL, Positions, draw_positions
from cupid.training.synth.tables import Attributes

N_PRIOR = 8
REMOVED_OTHERS = 2


class Choices(BaseModel):
    """Every random choice of a persona, drawn from its seed before any model call, and recorded."""

    model_config = ConfigDict(extra="forbid")
    slots: list[Slot]
    current_factor: int
    contrastive_factor: int
    positions: Positions
    task_types: dict[int, str]  # session position -> task type
    removed: dict[str, list[int]]  # instance type -> the `other` positions it drops


def draw_choices(seed: int, persona_id: str, attrs: Attributes) -> Choices:
    rng = random.Random(f"{seed}/{persona_id}/choices")
    slots = draw_slots(rng, attrs)
    current = rng.choice(PAIR)
    contrastive = PAIR[0] if current == PAIR[1] else PAIR[1]
    positions = draw_positions(rng, [i for i in range(len(slots)) if i not in PAIR])
    by_position = {p: current for p in positions.current_original + positions.current_changed + [positions.final]}
    by_position |= {p: contrastive for p in positions.contrastive}
    by_position |= dict(zip(positions.other, positions.other_factors, strict=True))
    task_types = {p: rng.choice(slots[by_position[p]].task_types) for p in sorted(by_position)}
    removed = {kind: sorted(rng.sample(positions.other, REMOVED_OTHERS)) for kind in ("contrastive", "changing")}
    return Choices(
        slots=slots,
        current_factor=current,
        contrastive_factor=contrastive,
        positions=positions,
        task_types=task_types,
        removed=removed,
    )


class SessionRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    position: int
    role: str
    factor_index: int
    context_factor: str
    contextual_preference: str | None  # None for the final session: it depends on the instance type
    checklist: list[str]
    task_type: str
    request: str
    dialogue: list[Message]  # empty for the final session
    turns: list[Turn]
    ended: str | None


class PersonaRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    persona_id: str
    index: int
    seed: int
    template: Template
    description: str
    choices: Choices
    factors: list[Factor]
    changed_preference: str
    changed_checklist: list[str]
    sessions: list[SessionRecord]
    example_copies: list[str]  # steps whose answer copied its one-shot example (allowed by the config)
    raw: list[dict[str, Any]]


def prior_positions(p: Positions, removed: dict[str, list[int]], instance_type: str) -> list[int]:
    if instance_type == "consistent":
        drop = p.current_changed + p.contrastive
    elif instance_type == "contrastive":
        drop = p.current_changed + removed["contrastive"]
    elif instance_type == "changing":
        drop = p.contrastive + removed["changing"]
    else:
        raise ValueError(f"unknown instance type {instance_type!r}")
    kept = [x for x in range(1, FINAL) if x not in drop]
    assert len(kept) == N_PRIOR, (instance_type, kept)
    return kept


def rows(record: PersonaRecord) -> list[dict[str, Any]]:
    """The three instances in the exact CUPID row schema."""
    sessions = {s.position: s for s in record.sessions}
    current = record.factors[record.choices.current_factor]
    out = []
    for instance_type in INSTANCE_TYPES:
        changed = instance_type == "changing"
        prior = [
            {
                "context_factor": sessions[x].context_factor,
                "contextual_preference": sessions[x].contextual_preference,
                "dialogue": [m.model_dump() for m in sessions[x].dialogue],
            }
            for x in prior_positions(record.choices.positions, record.choices.removed, instance_type)
        ]
        out.append(
            {
                "persona_id": record.persona_id,
                "instance_type": instance_type,
                "current_request": sessions[FINAL].request,
                "current_context_factor": current.factor,
                "current_contextual_preference": record.changed_preference if changed else current.preference,
                "current_checklist": record.changed_checklist if changed else current.checklist,
                "prior_interactions": prior,
            }
        )
    return out


def validated(record: PersonaRecord) -> list[dict[str, Any]]:
    """The rows, checked by the project's data layer; any problem names the persona and the field."""
    built = rows(record)
    dataset: Dataset = validate_rows(
        ((f"{record.persona_id}/{r['instance_type']}", r) for r in built), record.persona_id
    )
    if dataset.bad_rows:
        raise ValueError("; ".join(str(bad) for bad in dataset.bad_rows))
    return built
