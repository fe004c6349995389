"""One OpenAI-compatible endpoint: where a client sends a model's requests, and how.

Its own module, below both the named endpoints and their resolver (`serving.registry`) and the servers this project
starts (`serving.servers.lifecycle`, which gives an endpoint for each one running), so that neither imports the other.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl


class Endpoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: HttpUrl = Field(description="the OpenAI-compatible server's base URL (`http://localhost:8000/v1`)")
    model: str = Field(min_length=1, description="the `model` of its requests (a vLLM server's served name)")
    api_key_env: str | None = Field(
        default=None, description="environment variable holding the API key; none: no key is sent"
    )
    max_concurrency: int = Field(
        default=64, ge=1, le=4096, description="requests in flight at once (vLLM batches what is in flight)"
    )
    timeout_s: float = Field(default=600.0, gt=0, description="seconds a request may take before it is retried")
    max_retries: int = Field(
        default=4, ge=0, le=20, description="retries of a failed request (with backoff) before it is a recorded failure"
    )
    max_tokens: int | None = Field(default=None, ge=1, description="cap on answer length for every request")
    structured_output: bool = Field(
        default=False,
        description="the server enforces answer formats (vLLM's structured_outputs): judge roles then always get one",
    )
    constrain_candidate: bool = Field(
        default=False,
        description="as candidate, its answers are constrained to the task's answer format (recorded with the run)",
    )
    matcher_prompt: Literal["prefmatcher", "fewshot"] | None = Field(
        default=None,
        description="the matcher's prompt format: prefmatcher (the fine-tuned judge) or fewshot (general models); "
        "default: prefmatcher for a model whose name contains `prefmatcher`, else fewshot",
    )
    profile: str | None = Field(
        default=None,
        description="the serve profile whose server this is: where `cupid serve` runs that profile, the endpoint "
        "follows it (its address), whatever base_url says",
    )
    extra_body: dict[str, Any] = Field(default_factory=dict, description="extra request fields, sent as is")
    revision: str | None = Field(
        default=None,
        description="the served weights' fingerprint (set by a run that serves this judge from its profile; never "
        "sent): part of every request's cache key and of the run's identity, so that weights refitted under the "
        "same name are never answered from the old ones' cache and a comparison names the change",
    )

    @property
    def identity(self) -> str:
        """The model as a run's identity names it: its served name, and its weights' fingerprint where known."""
        return f"{self.model}@{self.revision}" if self.revision else self.model

    @property
    def url(self) -> str:
        return str(self.base_url).rstrip("/")

    def api_key(self) -> str | None:
        if self.api_key_env is None:
            return None
        return os.environ.get(self.api_key_env)


def bearer(api_key: str | None) -> dict[str, str]:
    """The header an OpenAI-compatible server takes its key in; none without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
