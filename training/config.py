"""A training run as one YAML file (`configs/train/*.yaml`): labelling (match data), fine-tune, export, check
(`TrainConfig`, `load`); and a GRPO recipe (`configs/train/grpo-*.yaml`: `GrpoRunConfig`, `load_grpo`), the two side
by side.

Every section forbids unknown keys, so a misspelt hyperparameter fails before anything runs
instead of silently taking its default. Paths are kept as written and resolved when used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cupid.common.config import ConfigError, read_yaml, validate
from cupid.eval.benchmark.inference import INFERENCE
from cupid.eval.benchmark.tasks import TaskName
from cupid.serving.cache import DEFAULT as DEFAULT_CACHE
from cupid.serving.endpoint import Endpoint
from cupid.serving.registry import DEFAULT_FILE as ENDPOINTS_FILE
from cupid.serving.servers.engines import capabilities
from cupid.serving.servers.profiles import DEFAULT_DIR as PROFILES_DIR
from cupid.training.grpo_memory import MemoryPlan

TEST_SPLIT_IDS = ("kixlab/cupid",)  # the benchmark itself: never training input unless forced


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Labelling(_Section):
    """Match data, labelled: candidates run the inference task, the teacher labels both directions (`cupid train
    label`; "synth" is the synthesis of new CUPID instances, `cupid synth`)."""

    data: str = Field(default="sample", description="'sample', a local CUPID-format file/dir, or a Hub id")
    split: str = Field(default="train", description="Hub split (local files have none)")
    endpoints: str | None = Field(default=ENDPOINTS_FILE, description="endpoints YAML file")
    add_endpoints: dict[str, Endpoint] = Field(
        default_factory=dict, description="more endpoints written inline (e.g. the candidates), on top of the file's"
    )
    instant_server: bool = Field(
        default=False,
        description="start serving/servers/instant.py and add an endpoint named `instant`: canned, well-formed CUPID "
        "answers that stand in for candidate/decomposer/teacher where no model here can play them (the CPU chain)",
    )
    candidates: list[str] = Field(min_length=1, description="endpoints whose inferred preferences get labelled")
    decomposer: str = Field(description="endpoint that turns each inferred preference into a checklist")
    teacher: str = Field(description="the matcher endpoint whose labels become the training targets")
    settings: list[Literal["standard", "oracle"]] = Field(
        default_factory=lambda: ["standard"],  # type: ignore[arg-type]
        min_length=1,
        description="the settings the candidates run in",
    )
    limit: int | None = Field(default=None, ge=1, description="only the first N instances")
    concurrency: int | None = Field(
        default=None, ge=1, description="requests in flight per endpoint (overrides every endpoint's max_concurrency)"
    )
    cache: str | None = Field(
        default=DEFAULT_CACHE, description="the request cache: a SQLite file, `default` (.cupid/cache.sqlite), or null"
    )
    validation_fraction: float = Field(default=0.1, gt=0, lt=1, description="share of personas held out")
    seed: int = Field(default=0, description="the seed of the persona split into train and validation")
    allow_test_split: bool = Field(default=False, description="allow kixlab/CUPID (the benchmark) as input")


# What the chain sets itself in each upstream configuration, whatever a config says: one list each. SFTConfig:
# checkpoints in the run directory, the precision `precision` picks, the loss on the answer only (the matcher's
# completion), no packing (see sft._loss), no tracker inside the trainer and no evaluation in it (the chain measures the
# loss itself). LoraConfig: a causal LM's adapter. BitsAndBytesConfig: the compute dtype `precision` picks.
def chain_sft_args(checkpoints: Path, precision: str) -> dict[str, Any]:
    return {
        "output_dir": str(checkpoints),
        "bf16": precision == "bf16",
        "fp16": False,
        "completion_only_loss": True,
        "packing": False,
        "report_to": "none",
        "eval_strategy": "no",
    }


SET_BY_THE_CHAIN = tuple(chain_sft_args(Path(), "fp32"))
LORA_SET_BY_THE_CHAIN = ("task_type",)
BNB_SET_BY_THE_CHAIN = ("bnb_4bit_compute_dtype",)

# The chain's defaults where a config is silent (the shipped recipes give every one): the paper's Table 4 adapter and
# QLoRA's NF4 with quantized block scales.
LORA_DEFAULTS: dict[str, Any] = {
    "lora_alpha": 128,
    "lora_dropout": 0.0,
    "target_modules": ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}
BNB_DEFAULTS: dict[str, Any] = {"bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}


class _Passthrough(_Section):
    """An upstream configuration's arguments under its own names, as given: its own class checks them (at `--dry-run`
    and when the run starts, `training.sft`), not a copy of their types here. Loading a config imports neither."""

    model_config = ConfigDict(extra="allow")
    owned: ClassVar[tuple[str, ...]] = ()
    defaults: ClassVar[dict[str, Any]] = {}

    @model_validator(mode="after")
    def _not_the_chains(self) -> Self:
        if owned := sorted(set(self.model_extra or {}) & set(self.owned)):
            raise ValueError(f"{owned[0]}: set by the chain itself ({', '.join(self.owned)} are)")
        return self

    @property
    def args(self) -> dict[str, Any]:
        """The arguments: the chain's defaults, then the config's."""
        return {**self.defaults, **self.model_dump()}


class Quantization(_Passthrough):
    """`quantization:` is transformers' `BitsAndBytesConfig` arguments: the frozen base in 4-bit NF4 is QLoRA;
    `load_in_4bit: false` (and no `load_in_8bit`) is plain LoRA, with no BitsAndBytesConfig at all. `load_in_4bit` is
    typed because the chain reads it before transformers does (the export dequantizes what was quantized)."""

    owned = BNB_SET_BY_THE_CHAIN
    defaults = BNB_DEFAULTS
    load_in_4bit: bool = Field(default=True, description="the frozen base in 4-bit (QLoRA); false: plain LoRA")

    @property
    def active(self) -> bool:
        return self.load_in_4bit or bool((self.model_extra or {}).get("load_in_8bit"))


class Lora(_Passthrough):
    """`lora:` is peft's `LoraConfig` arguments. `r` is typed because the chain reads it before peft does (the check's
    vLLM --max-lora-rank)."""

    owned = LORA_SET_BY_THE_CHAIN
    defaults = LORA_DEFAULTS
    r: int = Field(default=64, ge=1, description="the adapter's rank (peft's `r`)")


class GpuBatch(_Section):
    """A micro-batch for GPUs of at least `min_gib` GiB, under SFTConfig's names, and what it was measured to hold:
    a batch is padded to its longest example, so what must fit is micro-batch x `max_length`, not the typical one."""

    min_gib: float = Field(gt=0, description="the least GPU memory, in GiB, this entry is for")
    per_device_train_batch_size: int = Field(ge=1, description="the micro-batch (SFTConfig's name)")
    gradient_accumulation_steps: int = Field(ge=1, description="micro-batches an optimizer step (SFTConfig's name)")
    gradient_checkpointing: bool = Field(description="recompute activations in the backward pass (SFTConfig's name)")
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="padded tokens of one micro-batch (micro-batch x its longest example) measured to fit such a GPU",
    )
    peak_gib: float | None = Field(default=None, gt=0, description="the peak measured at max_tokens")
    liger: bool = Field(
        default=False,
        description="measured with Liger's kernels (TRL's use_liger_kernel): chosen only where the fine-tune uses "
        "them (`sft.liger`); an entry measured without them holds either way",
    )

    def line(self, gib: float, max_length: int) -> str:
        """What was chosen for a GPU of `gib` GiB, and why (`cupid train run --dry-run` prints it)."""
        checkpointing = "with" if self.gradient_checkpointing else "without"
        tokens = self.per_device_train_batch_size * max_length
        measured = (
            f"; {tokens:,} padded tokens a micro-batch (x max_length {max_length}), {self.max_tokens:,} measured to fit"
            + (f" at a peak of {self.peak_gib} GiB" if self.peak_gib else "")
            + (" with Liger's kernels" if self.liger else "")
            if self.max_tokens
            else "; not measured at max_length"
        )
        return (
            f"micro-batch {self.per_device_train_batch_size} x {self.gradient_accumulation_steps} accumulation, "
            f"{checkpointing} checkpointing, for a GPU of {gib:.1f} GiB (>= {self.min_gib:g}){measured}"
        )


class Sft(_Passthrough):
    """`sft:` is TRL's `SFTConfig` (transformers' `TrainingArguments` included) under TRL's own names, as given:
    any of its arguments reaches the trainer, and TRL checks them when the run starts and at `cupid train run
    --dry-run` (`sft.sft_config`), not a copy of their types here. The shipped configs hold the paper's
    recipe. Beside them, three fields of this project's own, which SFTConfig has no argument for, typed here.
    They stay in this section rather than one of their own because each is about the fine-tune and is read
    beside its arguments; every other key is SFTConfig's, so the two cannot be confused. The arguments the
    chain sets itself (`SET_BY_THE_CHAIN`) are refused by name. Loading a config does not import TRL (seconds):
    that waits for the run and `--dry-run`."""

    owned = SET_BY_THE_CHAIN

    precision: Literal["auto", "bf16", "fp32"] = Field(
        default="auto", description="auto: bf16 on a GPU that supports it, else fp32 (sets SFTConfig's bf16)"
    )
    resume: bool = Field(default=True, description="continue from the newest checkpoint in the run directory")
    measure_loss_on: list[Literal["train", "validation"]] = Field(
        default_factory=lambda: ["train", "validation"],  # type: ignore[arg-type]
        description="splits whose mean loss is reported before and after",
    )
    by_gpu_memory: list[GpuBatch] = Field(
        default_factory=list,
        description="the micro-batch for a GPU of at least this much memory (the first that fits the GPU at hand); "
        "the effective batch, and so the optimisation, stays the recipe's",
    )

    @property
    def args(self) -> dict[str, Any]:
        """The SFTConfig arguments as the config gives them (the typed fields are this project's own)."""
        return dict(self.model_extra or {})

    def effective_batch(self, args: dict[str, Any] | None = None) -> int:
        args = self.args if args is None else args
        return int(args.get("per_device_train_batch_size", 8)) * int(args.get("gradient_accumulation_steps", 1))

    @model_validator(mode="after")
    def _same_effective_batch(self) -> Self:
        max_length = int(self.args.get("max_length", 1024))
        for entry in self.by_gpu_memory:
            where = f"by_gpu_memory (min_gib {entry.min_gib})"
            if (got := entry.per_device_train_batch_size * entry.gradient_accumulation_steps) != self.effective_batch():
                raise ValueError(
                    f"{where}: {entry.per_device_train_batch_size} x "
                    f"{entry.gradient_accumulation_steps} = {got} examples a step, the recipe's is "
                    f"{self.effective_batch()}: the optimisation would change"
                )
            if entry.peak_gib and entry.peak_gib >= entry.min_gib:
                raise ValueError(
                    f"{where}: its peak, {entry.peak_gib} GiB, does not fit the smallest GPU it is for: measured "
                    "not to fit, so raise min_gib above the peak or give a smaller micro-batch"
                )
            if entry.max_tokens and (tokens := entry.per_device_train_batch_size * max_length) > entry.max_tokens:
                raise ValueError(
                    f"{where}: micro-batch {entry.per_device_train_batch_size} x max_length {max_length} = {tokens:,} "
                    f"padded tokens, over the {entry.max_tokens:,} measured to fit (a batch is padded to its longest "
                    f"example): lower per_device_train_batch_size to {max(1, entry.max_tokens // max_length)} and "
                    "raise gradient_accumulation_steps to keep the effective batch"
                )
        return self

    def gpu_batch(self, gib: float | None, liger: bool = False) -> GpuBatch | None:
        """The micro-batch for a GPU of `gib` GiB (None: no GPU, or none listed for it: the arguments as given): the
        largest tier the GPU holds, one measured with Liger's kernels only where `liger` (they are on), and of two
        for the same GPU the one measured as the fine-tune runs."""
        fits = [e for e in self.by_gpu_memory if gib and gib >= e.min_gib and (liger or not e.liger)]
        return min(fits, key=lambda e: (-e.min_gib, e.liger != liger), default=None)

    def for_gpu(self, gib: float | None, liger: bool = False) -> dict[str, Any]:
        """The SFTConfig arguments for a GPU of `gib` GiB (None: no GPU, the arguments as given)."""
        chosen = self.gpu_batch(gib, liger)
        return self.args | (chosen.model_dump(exclude={"min_gib", "max_tokens", "peak_gib", "liger"}) if chosen else {})


class Export(_Section):
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16",
        description="the merged model's weights: the adapter merged into the dequantized base, saved in this type",
    )


# What the check sets itself in the servers it starts; a config's `agreement.serve` leaves them out.
CHECK_OWNED = ("name", "model", "served_name", "host", "port", "lora_adapters")


class Agreement(_Section):
    """After training: serve the base (the trained LoRA adapter on it) and the export, run each as the matcher
    on the validation split. The servers are serve profiles (`configs/serve/*.yaml`): `serve` holds a profile's
    fields without model, names, port and adapters, which the check sets."""

    enabled: bool = Field(default=True, description="run the check after the export")
    baseline: bool = Field(default=True, description="also measure the base model before training")
    adapter: bool = Field(
        default=True,
        description="also measure the trained LoRA adapter, served on the base by vLLM (--enable-lora): base and "
        "adapter answer from one server; the merged export is served after it",
    )
    max_lora_rank: int = Field(default=64, description="vLLM's --max-lora-rank for the adapter: at least lora.r")
    serve: dict[str, Any] = Field(
        default_factory=dict,
        description="serve-profile fields for the check's servers (engine, device, cpu_kvcache_space_gib, "
        "startup_timeout_s, ..., and `vllm:`, vLLM's own arguments: dtype, max_model_len, ...); default: vLLM on CUDA",
    )
    max_tokens: int = Field(default=512, ge=1, description="cap of each matcher answer")
    concurrency: int = Field(default=64, ge=1, description="requests in flight per server")
    timeout_s: float = Field(default=900.0, gt=0, description="seconds a request may take")
    limit: int | None = Field(default=None, ge=1, description="only the first N validation examples")

    @model_validator(mode="after")
    def _servable(self) -> Agreement:
        owned = sorted(set(CHECK_OWNED) & set(self.serve))
        if owned:
            raise ValueError(
                f"serve.{owned[0]}: set by the check (it serves the base, the adapter and the export on free ports)"
            )
        if "max_lora_rank" in (self.serve.get("vllm") or {}):
            raise ValueError("serve.vllm.max_lora_rank: set by the check from agreement.max_lora_rank")
        if self.adapter and not capabilities(self.serve.get("engine", "vllm")).lora:
            raise ValueError(
                f"adapter: serving the LoRA adapter needs the vllm engine (serve.engine is {self.serve['engine']}); "
                "set adapter: false"
            )
        self.profile("check", "model", "model", {"adapter": "adapter"} if self.adapter else None, port=8000)
        return self

    def profile(
        self, name: str, model: str, served_name: str, adapters: dict[str, str] | None = None, port: int | None = None
    ):
        """The serve profile of one of the check's servers (`serving.servers.profiles.Profile`), on a free port by
        default."""
        from pydantic import ValidationError

        from cupid.serving.servers.ports import free_port
        from cupid.serving.servers.profiles import Profile

        fields = {**self.serve, "name": name, "model": model, "served_name": served_name, "port": port or free_port()}
        if adapters:
            fields.update(
                lora_adapters=adapters, vllm={**(self.serve.get("vllm") or {}), "max_lora_rank": self.max_lora_rank}
            )
        try:
            return Profile.model_validate(fields)
        except ValidationError as e:
            problems = [
                (".".join(map(str, err["loc"])), err["msg"].removeprefix("Value error, ")) for err in e.errors()
            ]
            raise ValueError(
                "; ".join(f"serve.{loc}: {msg}" if loc else f"serve: {msg}" for loc, msg in problems)
            ) from None


class TrainConfig(_Section):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$", description="also the served name of the export")
    out: str = Field(description="run directory: match data, checkpoints, adapter, export, reports")
    base_model: str = Field(min_length=1, description="local model directory, Hub id, or `tiny` (SmolLM2-135M)")
    match_data: str | None = Field(
        default=None, description="an existing match-data directory (train.jsonl, validation.jsonl): skips labelling"
    )
    labelling: Labelling | None = None
    quantization: Quantization = Field(default_factory=Quantization)
    lora: Lora = Field(default_factory=Lora)
    sft: Sft = Field(default_factory=Sft)
    export: Export = Field(default_factory=Export, description="the merged model vLLM serves")
    agreement: Agreement = Field(default_factory=Agreement)
    source: str = Field(default="(inline)", exclude=True, description="the file this config came from")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "synthesis" in data:
            raise ValueError("`synthesis` is now `labelling` (the same fields): rename the section")
        return data

    @model_validator(mode="after")
    def _data_source(self) -> TrainConfig:
        if (self.labelling is None) == (self.match_data is None):
            raise ValueError("give exactly one of `labelling` (build match data) or `match_data` (use existing)")
        if self.agreement.enabled and self.agreement.adapter and self.lora.r > self.agreement.max_lora_rank:
            raise ValueError(
                f"agreement.max_lora_rank {self.agreement.max_lora_rank} is below lora.r {self.lora.r}: "
                "vLLM would refuse the adapter (raise agreement.max_lora_rank, or set agreement.adapter: false)"
            )
        return self

    @property
    def out_dir(self) -> Path:
        return Path(self.out)


def is_test_split(data: str) -> bool:
    return data.strip().rstrip("/").lower() in TEST_SPLIT_IDS


def load(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """The config at `path`, with dotted `overrides` (`{"labelling.allow_test_split": True}`) applied first."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of training settings")
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise ConfigError(f"{path}: cannot set {dotted}: section '{part}' is not in this config")
            node = node[part]
        node[leaf] = value
    cfg = validate(TrainConfig, data, str(path))
    cfg.source = str(path)
    return cfg


# GRPOConfig arguments the run sets itself: checkpoints (and TRL's completion tables) in the run directory.
GRPO_SET_BY_THE_RUN = {"output_dir"}


class Data(_Section):
    """The prompts (`cupid.reward_dataset`): any CUPID-format data; train on synthesized personas, evaluate on
    others."""

    source: str = Field(default="sample", description="'sample', a CUPID-format file or directory, or a Hub id")
    setting: Literal["standard", "oracle"] = Field(
        default="standard",
        description="the setting the prompts show (standard: all 8 prior sessions; oracle: the relevant ones)",
    )
    types: list[str] | None = Field(
        default=None, description="only these instance types (consistent, contrastive, changing); default: all"
    )
    limit: int | None = Field(default=None, ge=1, description="only the first N instances")


class Reward(_Section):
    """The arguments of `cupid.reward`."""

    task: TaskName = Field(
        default=INFERENCE.name, description="inference (the inferred preference's F1) or generation (the judge's score)"
    )
    matcher: str = Field(
        default="prefmatcher", description="the matcher endpoint (inference): a name, a running profile or a base URL"
    )
    decomposer: str = Field(default="decomposer", description="the decomposer endpoint (inference)")
    judge: str = Field(default="judge", description="the judge endpoint (generation)")
    endpoints_file: str = Field(default=ENDPOINTS_FILE, description="endpoints YAML the names are looked up in")
    metric: str | None = Field(default=None, description="inference: f1 (default), precision or recall")
    cache: str | None = Field(default=None, description="the request cache: a SQLite file, `default`, or null (none)")
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="requests in flight per judge endpoint (default: the endpoint's max_concurrency)",
    )


class Evaluation(_Section):
    """After training: `cupid eval run` of the adapter served by vLLM on the policy, and of the policy alone, on the
    evaluation data's instances of personas the training data does not hold."""

    enabled: bool = Field(default=True, description="evaluate after training")
    data: Data = Field(
        default_factory=Data, description="where the held-out instances come from (training personas left out)"
    )
    profile: str = Field(default="tiny", description="the serve profile that serves the policy (PROFILES/NAME.yaml)")
    profiles: str = Field(default=str(PROFILES_DIR), description="the serve profiles' directory")
    baseline: bool = Field(default=True, description="also evaluate the policy without the adapter (a second server)")
    runtime_lora: bool = Field(
        default=False,
        description=(
            "load the adapter into the profile's server of the policy at run time (one already answering, started "
            "with a runtime_lora_rank, is used as it is) instead of serving it on a server of its own"
        ),
    )
    endpoint: dict[str, Any] = Field(
        default_factory=dict, description="the served candidate's endpoint fields (max_tokens, ...)"
    )


class GrpoRunConfig(_Section):
    name: str = Field(
        min_length=1, pattern=r"^[A-Za-z0-9._-]+$", description="the run's name: the adapter's served name"
    )
    out: str = Field(description="run directory: checkpoints, adapter, report, evaluations")
    policy: str = Field(
        min_length=1, description="local model directory, Hub id or prepared:NAME (<state>/models/NAME)"
    )
    lora: dict[str, Any] = Field(
        default_factory=lambda: {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"},
        description="peft's LoraConfig arguments",
    )
    data: Data = Field(default_factory=Data)
    reward: Reward = Field(default_factory=Reward)
    grpo: dict[str, Any] = Field(default_factory=dict, description="TRL's GRPOConfig arguments")
    format_reward: bool = Field(
        default=False,
        description="cupid's format reward beside the judges' (inference): graded, so a small policy's groups vary; "
        "weigh the two with grpo.reward_weights",
    )
    evaluate: Evaluation = Field(default_factory=Evaluation)
    memory: MemoryPlan | None = Field(
        default=None, description="the GPU memory plan (GPU recipes): checked before the policy loads"
    )
    source: str = Field(default="(inline)", exclude=True)

    @property
    def out_dir(self) -> Path:
        return Path(self.out)


def load_grpo(path: str | Path, overrides: dict[str, Any] | None = None) -> GrpoRunConfig:
    """A GRPO recipe from its YAML file (`overrides` over it), checked: `cupid train grpo --config FILE`."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of GRPO settings")
    cfg = validate(GrpoRunConfig, {**data, **(overrides or {})}, str(path))
    cfg.source = str(path)
    if owned := sorted(GRPO_SET_BY_THE_RUN & cfg.grpo.keys()):
        named = ", ".join(sorted(GRPO_SET_BY_THE_RUN))
        raise ConfigError(f"{path}: grpo.{owned[0]}: set by the run itself ({named} are)")
    return cfg
