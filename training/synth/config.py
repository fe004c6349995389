"""A synthesis run as a YAML file (`configs/synth/*.yaml`); command-line options override it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cupid.serving.cache import DEFAULT as DEFAULT_CACHE
from cupid.serving.cache import renamed_no_cache
from cupid.serving.registry import DEFAULT_FILE as ENDPOINTS_FILE

Role = Literal["generator", "user_simulator", "assistant_simulator"]


class Temperatures(BaseModel):
    """Defaults are the paper's (App. B): generation 0.7, user simulator 0.3, assistant simulator 0.7."""

    model_config = ConfigDict(extra="forbid")
    generator: float = Field(default=0.7, ge=0, le=2, description="sampling temperature of the generator's steps")
    user_simulator: float = Field(default=0.3, ge=0, le=2, description="sampling temperature of the simulated user")
    assistant_simulator: float = Field(
        default=0.7, ge=0, le=2, description="sampling temperature of the simulated assistant"
    )


class MaxTokens(BaseModel):
    """Answer caps per step: small ones keep CPU runs short, large ones give strong models space.

    Where the endpoint enforces structured output, a step's shape is sized so that its longest answer
    fits the cap at one character per token (`matcher.schemas.constrained`): the cap is then the
    answer's length in characters at most, and a model spends about a quarter of it in tokens.
    """

    model_config = ConfigDict(extra="forbid")
    persona: int = Field(default=1500, ge=1, description="cap of the persona step's answer")
    factor: int = Field(default=600, ge=1, description="cap of a context factor's answer")
    changed_preference: int = Field(default=250, ge=1, description="cap of the changed preference's answer")
    checklist: int = Field(default=500, ge=1, description="cap of a checklist's answer")
    request: int = Field(default=1000, ge=1, description="cap of a session's request")
    assistant: int = Field(default=1000, ge=1, description="cap of the simulated assistant's reply")
    judge: int = Field(
        default=16, ge=1, description="cap of the simulated user's verdict on a checklist item (yes or no)"
    )
    message: int = Field(default=400, ge=1, description="cap of the simulated user's feedback message")


class SynthConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        return renamed_no_cache(data, "synthesis config")

    endpoints: str = Field(default=ENDPOINTS_FILE, description="endpoints YAML the roles are looked up in")
    generator: str = Field(description="endpoint that writes personas, factors, preferences, checklists and requests")
    user_simulator: str = Field(description="endpoint that plays the user: judges checklist items, writes feedback")
    assistant_simulator: str = Field(description="endpoint that plays the AI assistant in the dialogues")
    personas: int = Field(default=4, ge=1, description="personas 0..N-1 of this seed; raising N later extends a run")
    seed: int = Field(
        default=0, description="the seed of every random choice and request: the same seed, the same personas"
    )
    out: str = Field(
        default="runs/synth",
        description="output directory (resumable): instances.jsonl, personas/, failed/, summary.json",
    )
    cache: str | None = Field(
        default=DEFAULT_CACHE, description="the request cache: a SQLite file, `default` (.cupid/cache.sqlite), or null"
    )
    parallel_personas: int = Field(default=8, ge=1, description="personas in flight at once")
    seeds: str | None = Field(
        default=None,
        description="seed persona descriptions (YAML list of {occupation, description}); default: the bundled list",
    )
    persona_prompt: Literal["synth_persona", "project_synth_persona"] = Field(
        default="synth_persona",
        description="the paper's persona prompt (Fig. 13, JSON answer) or the project's short one for small models",
    )
    persona_in_prompts: Literal["description", "first_sentence"] = Field(
        default="description",
        description="what later prompts show of the persona: the whole description, or its first sentence "
        "(name, age, occupation), which tiny models can still read past",
    )
    max_turns: int = Field(default=8, ge=1, description="assistant replies per dialogue at most (the turn cap)")
    retries: int = Field(
        default=2, ge=0, le=10, description="extra attempts for an answer that does not parse or validate"
    )
    reject_example_copies: bool = Field(
        default=True,
        description="refuse an answer that copies its prompt's one-shot example (tiny models do little else: "
        "the CPU check keeps them and counts them instead)",
    )
    retry_temperature: float = Field(default=0.7, ge=0, le=2, description="temperature of retries, at least")
    retry_params: dict[str, Any] = Field(
        default_factory=dict,
        description="further sampling fields of retries, sent as they are (e.g. vLLM's repetition_penalty, which "
        "moves a small model off copying its prompt, the usual reason an answer is refused)",
    )
    temperature: Temperatures = Field(default_factory=Temperatures)
    max_tokens: MaxTokens = Field(default_factory=MaxTokens)

    def endpoint(self, role: Role) -> str:
        return getattr(self, role)
