"""Synthesis of new CUPID-style instances from personas (paper §3 and App. B), on local models.

Code lays down the structure (persona templates, factor slots, the 13-session template, which
sessions each instance keeps); models write the free text (descriptions, factors, preferences,
checklists, requests, dialogue turns), each answer parsed, validated and retried, through the
project's client and request cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cupid.common.faces import lazy

# What the rest of the package uses of this room, by the module that defines it (imported on first use)
EXPORTS = {
    "Asker": "cupid.training.synth.ask",
    "FINAL": "cupid.training.synth.sessions",
    "Factor": "cupid.training.synth.factors",
    "MaxTokens": "cupid.training.synth.config",
    "Message": "cupid.training.synth.dialogue",
    "PAIR": "cupid.training.synth.factors",
    "PersonaRecord": "cupid.training.synth.instances",
    "SessionRecord": "cupid.training.synth.instances",
    "StepFailed": "cupid.training.synth.ask",
    "SynthConfig": "cupid.training.synth.config",
    "SynthesisDir": "cupid.training.synth.pipeline",
    "Turn": "cupid.training.synth.dialogue",
    "changed_shape": "cupid.training.synth.factors",
    "checklist_shape": "cupid.training.synth.factors",
    "draw_choices": "cupid.training.synth.instances",
    "factor_shape": "cupid.training.synth.factors",
    "judge_shape": "cupid.training.synth.dialogue",
    "layout": "cupid.training.synth.sessions",
    "message_shape": "cupid.training.synth.dialogue",
    "persona_id": "cupid.training.synth.pipeline",
    "pick_unmet": "cupid.training.synth.dialogue",
    "prior_positions": "cupid.training.synth.instances",
    "read_checklist": "cupid.training.synth.factors",
    "read_description": "cupid.training.synth.personas",
    "reply_shape": "cupid.training.synth.dialogue",
    "request_shape": "cupid.training.synth.sessions",
    "rows": "cupid.training.synth.instances",
    "run": "cupid.training.synth.pipeline",
    "score": "cupid.training.synth.dialogue",
    "shape": "cupid.training.synth.personas",
    "template": "cupid.training.synth.personas",
    "validated": "cupid.training.synth.instances",
}
__all__ = [
    "FINAL",
    "PAIR",
    "Asker",
    "Factor",
    "MaxTokens",
    "Message",
    "PersonaRecord",
    "SessionRecord",
    "StepFailed",
    "SynthConfig",
    "SynthesisDir",
    "Turn",
    "changed_shape",
    "checklist_shape",
    "draw_choices",
    "factor_shape",
    "judge_shape",
    "layout",
    "message_shape",
    "persona_id",
    "pick_unmet",
    "prior_positions",
    "read_checklist",
    "read_description",
    "reply_shape",
    "request_shape",
    "rows",
    "run",
    "score",
    "shape",
    "template",
    "validated",
]
__getattr__, __dir__ = lazy(__name__, EXPORTS)

if TYPE_CHECKING:
    from cupid.training.synth.ask import Asker, StepFailed
    from cupid.training.synth.config import MaxTokens, SynthConfig
    from cupid.training.synth.dialogue import Message, Turn, judge_shape, message_shape, pick_unmet, reply_shape, score
    from cupid.training.synth.factors import PAIR, Factor, changed_shape, checklist_shape, factor_shape, read_checklist
    from cupid.training.synth.instances import (
        PersonaRecord,
        SessionRecord,
        draw_choices,
        prior_positions,
        rows,
        validated,
    )
    from cupid.training.synth.personas import read_description, shape, template
    from cupid.training.synth.pipeline import SynthesisDir, persona_id, run
    from cupid.training.synth.sessions import FINAL, layout, request_shape
