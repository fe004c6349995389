"""Serving engines: how to start an OpenAI-compatible server for a model, one class per engine.

An engine only knows its command line, its environment and what it needs before starting; the
lifecycle (port check, process group, readiness, records) is shared in `serving.lifecycle`.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field


class ServeError(RuntimeError):
    pass


class ServeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: str = "transformers"
    model: str = Field(min_length=1, description="local model directory (or Hub id, for engines that fetch)")
    name: str = Field(min_length=1, description="served model name, the `model` field of requests")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    startup_timeout_s: float = Field(default=600.0, gt=0)
    extra_args: list[str] = Field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


class Engine:
    name: ClassVar[str]
    ready_paths: ClassVar[tuple[str, ...]] = ("/health",)

    def preflight(self, spec: ServeSpec) -> None:
        """Fail before starting anything when the engine cannot run this spec."""

    def command(self, spec: ServeSpec, workdir: Path) -> list[str]:
        raise NotImplementedError

    def env(self, spec: ServeSpec, workdir: Path) -> dict[str, str]:
        return {}


def _bin(name: str) -> str:
    """A console script of the running environment, so a server starts from the same .venv."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


class TransformersEngine(Engine):
    """`transformers serve` pinned to one local model: the CPU path, and any box without vLLM.

    It serves a model under the name it was started with, so the model directory is linked into the
    server's working directory under the served name and started by that relative name.
    """

    name = "transformers"

    def preflight(self, spec: ServeSpec) -> None:
        model_dir = Path(spec.model)
        if not (model_dir / "config.json").is_file():
            raise ServeError(
                f"model directory {model_dir} not found or has no config.json "
                "(the transformers engine serves local model directories; run `cupid serve prepare-tiny` for the tiny model)"
            )
        if spec.name.startswith("/") or ".." in Path(spec.name).parts:
            raise ServeError(f"served name {spec.name!r} must be a relative name such as 'org/model'")

    def command(self, spec: ServeSpec, workdir: Path) -> list[str]:
        link = workdir / spec.name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path(spec.model).resolve(), target_is_directory=True)
        return [
            _bin("transformers"), "serve", spec.name,
            "--host", spec.host, "--port", str(spec.port),
            "--continuous-batching", "--log-level", "info",
            *spec.extra_args,
        ]  # fmt: skip

    def env(self, spec: ServeSpec, workdir: Path) -> dict[str, str]:
        cache = workdir / "hf-cache"  # `/v1/models` scans a Hub cache and fails when there is none
        cache.mkdir(exist_ok=True)
        return {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "TOKENIZERS_PARALLELISM": "false"}


class VllmEngine(Engine):
    """`vllm serve`: the GPU path. Profiles, LoRA adapters and memory splits build on this."""

    name = "vllm"
    ready_paths = ("/health", "/v1/models")

    def preflight(self, spec: ServeSpec) -> None:
        if shutil.which("nvidia-smi") is None:
            raise ServeError(
                "no CUDA device here (nvidia-smi not found): vLLM needs a GPU. "
                "On CPU, serve a local model directory with `cupid serve up --engine transformers`."
            )
        if shutil.which(_bin("vllm")) is None:
            raise ServeError("vLLM is not installed: pip install -e '.[gpu]'")

    def command(self, spec: ServeSpec, workdir: Path) -> list[str]:
        return [
            _bin("vllm"), "serve", spec.model,
            "--served-model-name", spec.name,
            "--host", spec.host, "--port", str(spec.port),
            "--generation-config", "vllm",  # the model's generation config must not override request sampling
            *spec.extra_args,
        ]  # fmt: skip


ENGINES: dict[str, type[Engine]] = {TransformersEngine.name: TransformersEngine, VllmEngine.name: VllmEngine}


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ServeError(f"unknown engine {name!r} (known: {', '.join(sorted(ENGINES))})")
    return ENGINES[name]()
