"""Named OpenAI-compatible endpoints (`configs/endpoints.yaml`)."""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl

from cupid.serving.config import ConfigError, read_yaml, validate

DEFAULT_FILE = "configs/endpoints.yaml"


class Endpoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: HttpUrl
    model: str = Field(min_length=1)
    api_key_env: str | None = None
    max_concurrency: int = Field(default=64, ge=1, le=4096)
    timeout_s: float = Field(default=600.0, gt=0)
    max_retries: int = Field(default=4, ge=0, le=20)
    max_tokens: int | None = Field(default=None, ge=1, description="cap on answer length for every request")
    structured_output: bool = Field(
        default=False,
        description="the server enforces answer formats (vLLM's structured_outputs): judge roles then always get one",
    )
    constrain_candidate: bool = Field(
        default=False,
        description="as candidate, its answers are constrained to the task's answer format (recorded with the run)",
    )
    matcher_prompt: Literal["prefmatcher", "fewshot"] | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict, description="extra request fields, sent as is")

    @property
    def url(self) -> str:
        return str(self.base_url).rstrip("/")

    def api_key(self) -> str | None:
        if self.api_key_env is None:
            return None
        return os.environ.get(self.api_key_env)


def load_endpoints(path: str | Path) -> dict[str, Endpoint]:
    data = read_yaml(path)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: expected a mapping of endpoint name -> {{base_url, model, ...}}")
    return {name: validate(Endpoint, entry, f"{path}: endpoint '{name}'") for name, entry in data.items()}


def require(endpoints: dict[str, Endpoint], name: str, path: str | Path) -> Endpoint:
    if name not in endpoints:
        raise ConfigError(f"{path}: no endpoint named '{name}' (known: {', '.join(sorted(endpoints))})")
    return endpoints[name]


def lookup(
    names: Iterable[str],
    path: str | Path = DEFAULT_FILE,
    *,
    given: Mapping[str, Endpoint] | None = None,
    served: Mapping[str, Endpoint] | None = None,
) -> dict[str, Endpoint]:
    """Endpoints by name, the one resolver of role names. A name is, first found: an endpoint `given` as an
    object (the Python API's), an entry of the endpoints file, a server this run brings (`served`), or a
    server running under `cupid serve up` (by its profile name, its served name or an adapter's), so a
    running profile needs no entry."""
    names = sorted(set(names))
    known = {**(served or {}), **load_endpoints(path), **(given or {})}
    if set(names) - known.keys():
        from cupid.serving.lifecycle import live_endpoints  # lifecycle builds on this module

        known = {**live_endpoints(), **known}
    return {name: require(known, name, path) for name in names}


def missing_keys(endpoints: dict[str, Endpoint]) -> list[str]:
    """Environment variables that endpoints need but that are not set."""
    return sorted({e.api_key_env for e in endpoints.values() if e.api_key_env and not e.api_key()})


EndpointLike = Endpoint | str
"""An `Endpoint`, a base URL (`http://localhost:8000/v1`), or a name: an entry of the endpoints file
(`configs/endpoints.yaml`), or a server running under `cupid serve up` (its profile name)."""


def resolve(spec: EndpointLike, *, model: str | None = None, endpoints_file: str | Path = DEFAULT_FILE, **fields: Any) -> Endpoint:
    """An endpoint from any `EndpointLike`. A base URL takes `model` (default: the one model the server
    lists, its LoRA adapters aside) and any other `Endpoint` field (`structured_output=True`, `matcher_prompt="prefmatcher"`, ...)."""
    if isinstance(spec, Endpoint):
        return spec.model_copy(update=fields) if fields else spec
    if spec.startswith(("http://", "https://")):
        return Endpoint.model_validate({"base_url": spec, "model": model or _served_model(spec), **fields})
    found = lookup([spec], endpoints_file)[spec]
    return found.model_copy(update=fields) if fields else found


def _served_model(base_url: str) -> str:
    """The one model the server serves; LoRA adapters loaded into it (vLLM lists them with their `parent`) do not
    count: they come and go while it runs."""
    import httpx

    url = base_url.rstrip("/") + "/models"
    try:
        listed = [m["id"] for m in httpx.get(url, timeout=10).json()["data"] if m.get("parent") is None]
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{url}: no model list ({type(e).__name__}: {e}); pass model=") from None
    if len(listed) != 1:
        raise ConfigError(f"{url} serves {len(listed)} models ({', '.join(listed) or 'none'}): pass model=")
    return listed[0]
