"""A GRPO run's GPU memory plan: what each part holds on which GPU, while training and while evaluating, checked
against each GPU's memory before the policy loads (`cupid train grpo --dry-run` prints it).

The parts: the reward's judge servers (their serve profiles' `gpu_memory_utilization`, up through the whole run), the
trainer's policy (computed from the recipe by `policy_estimate`: weights, the adapter with its optimizer state,
activations, the completion's logits), TRL's colocated
vLLM (`vllm_gpu_memory_utilization` of the GPU it shares with the policy), then, once the trainer's memory is released,
the evaluation's server of the policy (its profile's share). A vLLM share is a fraction of the whole GPU, whatever else
holds memory on it, so shares and the policy's estimate add up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cupid.common.config import ConfigError
from cupid.serving.servers import profiles


class MemoryPlan(BaseModel):
    """`memory:` of a GRPO recipe for GPUs: how many, their size, and where the policy and the judges run."""

    model_config = ConfigDict(extra="forbid")

    gpus: int = Field(ge=1, description="the GPUs the recipe needs")
    gpu_gib: float = Field(gt=0, description="each GPU's memory, GiB (an 80 GB card: 79.6)")
    policy_gpu: int = Field(0, ge=0, description="the trainer, its colocated vLLM and the evaluation's server")
    prompt_tokens: int | None = Field(
        default=None,
        gt=0,
        description="the longest prompt of the data the policy trains on (CUPID's inference prompts: ~8.2k)",
    )
    policy_training_gib: float | None = Field(
        default=None,
        gt=0,
        description="the trainer's peak, where it is known better than `policy_estimate` computes it from the recipe",
    )
    judges_gpu: int = Field(0, ge=0, description="where the reward's judge servers run")
    judges: list[str] = Field(default_factory=list, description="the serve profiles of the reward's judges")

    @model_validator(mode="after")
    def _gpus_exist(self) -> MemoryPlan:
        if self.prompt_tokens is None and self.policy_training_gib is None:
            raise ValueError("prompt_tokens: needed to compute the trainer's peak (or give it as policy_training_gib)")
        for name in ("policy_gpu", "judges_gpu"):
            if getattr(self, name) >= self.gpus:
                raise ValueError(
                    f"{name} {getattr(self, name)}: the recipe has {self.gpus} GPU(s), 0 to {self.gpus - 1}"
                )
        return self


@dataclass(frozen=True)
class Part:
    phase: str  # training, evaluation
    gpu: int
    name: str
    gib: float


# The fields of a model's config.json that size its memory; Qwen2.5-7B-Instruct's, so that a plan of the 7B recipe
# needs no Hub (and scripts/gpu_train_check.py makes its random-weight model in this shape).
QWEN_7B = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
KNOWN_SHAPES = {"Qwen/Qwen2.5-7B-Instruct": QWEN_7B}


def shape_of(policy: str, source: str) -> dict[str, Any]:
    """The policy's config.json: a local model directory's, else a known Hub id's (`KNOWN_SHAPES`)."""
    local = Path(policy) / "config.json"
    if local.is_file():
        return dict(json.loads(local.read_text()))
    if policy in KNOWN_SHAPES:
        return KNOWN_SHAPES[policy]
    raise ConfigError(
        f"{source}: memory: the shape of policy {policy} is not known here: give a local model directory as "
        "`policy:`, or the trainer's peak as `memory.policy_training_gib`"
    )


@dataclass(frozen=True)
class Estimate:
    """The trainer's peak, part by part, in GiB (`line` is how `--dry-run` prints it)."""

    parts: dict[str, float]

    @property
    def gib(self) -> float:
        return sum(self.parts.values())

    def line(self) -> str:
        return (
            "policy in training: "
            + " + ".join(f"{k} {v:.1f}" for k, v in self.parts.items())
            + f" = {self.gib:.1f} GiB"
        )


GIB = 2**30
# Tensors kept per token of a layer for its backward pass, in widths of the hidden size and of the MLP's
# intermediate size (bf16): the norms' inputs, q, k and v, attention's output and o's, the residuals, LoRA's inputs
# and down-projections (hidden); gate, up, the activation and their product (intermediate).
SAVED_HIDDEN, SAVED_INTERMEDIATE = 10, 4
# The completion's logits: bf16 from the head, their fp32 copy and the log-softmax in fp32 (TRL's per-token log-probs).
LOGIT_BYTES = 2 + 4 + 4
CONTEXT_GIB = 2.0  # the CUDA context, cuBLAS's workspace and the allocator's slack


def policy_estimate(
    shape: dict[str, Any], lora_r: int, batch: int, prompt_tokens: int, completion_tokens: int, checkpointing: bool
) -> Estimate:
    """The trainer's peak for a LoRA on every linear layer, bf16 weights, AdamW: a micro-batch of `batch` sequences
    padded to the longest prompt plus the longest completion. With gradient checkpointing, each layer keeps only its
    input and one layer at a time is recomputed; without it, every layer keeps all it saves. Checked against the
    peak an H100 measured for the 7B recipe (docs/performance.md; tests/training/test_grpo.py holds them together)."""
    h, i, layers, vocab = (
        int(shape[k]) for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")
    )
    kv = h // int(shape["num_attention_heads"]) * int(shape.get("num_key_value_heads", shape["num_attention_heads"]))
    linears = [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]  # q k v o, gate up down
    per_layer = sum(a * b for a, b in linears) + 2 * kv + h + 2 * h  # weights, q k v biases, norms
    heads = 1 if shape.get("tie_word_embeddings") else 2
    params = layers * per_layer + heads * vocab * h + h
    adapter = layers * sum(lora_r * (a + b) for a, b in linears)
    tokens = batch * (prompt_tokens + completion_tokens)
    one_layer = tokens * (SAVED_HIDDEN * h + SAVED_INTERMEDIATE * i) * 2
    activations = (
        {"layer inputs": layers * tokens * h * 2, "one layer recomputed": one_layer}
        if checkpointing
        else {"every layer's activations": layers * one_layer}
    )
    parts = {
        "weights (bf16)": params * 2,
        "adapter, gradients and AdamW (fp32)": adapter * 16,
        **activations,
        "the completion's logits": batch * completion_tokens * vocab * LOGIT_BYTES,
    }
    return Estimate({**{k: v / GIB for k, v in parts.items()}, "CUDA context and slack": CONTEXT_GIB})


def policy_gib(plan: MemoryPlan, policy: str, lora_r: int, grpo_args: Any, source: str) -> Estimate:
    """The trainer's peak for this recipe: `policy_training_gib` where the recipe gives it, else `policy_estimate`."""
    if plan.policy_training_gib is not None:
        return Estimate({"the recipe's memory.policy_training_gib": plan.policy_training_gib})
    return policy_estimate(
        shape_of(policy, source),
        lora_r=lora_r,
        batch=int(grpo_args.per_device_train_batch_size),
        prompt_tokens=int(plan.prompt_tokens or 0),  # given: the plan's validator asks for one of the two
        completion_tokens=int(grpo_args.max_completion_length),
        checkpointing=bool(grpo_args.gradient_checkpointing),
    )


def parts(
    plan: MemoryPlan, grpo_args: Any, eval_profile: str | None, profiles_dir: str, policy_gib: float
) -> list[Part]:
    """Every part of the run, on its GPU, in each phase (the judges in both)."""
    shares = {name: profiles.load(name, profiles_dir).gpu_memory_utilization for name in plan.judges}
    out = [
        Part(phase, plan.judges_gpu, f"judge {name} ({share:g} of the GPU)", share * plan.gpu_gib)
        for phase in ("training", "evaluation")
        for name, share in shares.items()
    ]
    out.append(Part("training", plan.policy_gpu, "the policy in training", policy_gib))
    if getattr(grpo_args, "use_vllm", False) and getattr(grpo_args, "vllm_mode", None) == "colocate":
        share = grpo_args.vllm_gpu_memory_utilization
        out.append(Part("training", plan.policy_gpu, f"TRL's colocated vLLM ({share:g})", share * plan.gpu_gib))
    if eval_profile is not None:
        share = evaluation_share(eval_profile, profiles_dir)
        name = f"the evaluation's server, profile {eval_profile} ({share:g})"
        out.append(Part("evaluation", plan.policy_gpu, name, share * plan.gpu_gib))
    return out


def evaluation_share(eval_profile: str, profiles_dir: str) -> float:
    """The GPU share the evaluation's server of the policy is planned at, and started with (`grpo.evaluate`): its
    profile's. A served candidate otherwise drops its profile's share for vLLM's default (0.92), right for a night's
    candidates, not beside a trainer's GPU."""
    return profiles.load(eval_profile, profiles_dir).gpu_memory_utilization


def lines_and_problems(plan: MemoryPlan, all_parts: list[Part]) -> tuple[list[str], list[str]]:
    """The plan as people read it, GPU by GPU and phase by phase, and each GPU of a phase that does not fit."""
    lines, problems = [f"memory plan: {plan.gpus} GPU(s) of {plan.gpu_gib:g} GiB"], []
    for phase in ("training", "evaluation"):
        for gpu in range(plan.gpus):
            here = [p for p in all_parts if (p.phase, p.gpu) == (phase, gpu)]
            if not here:
                continue
            total = sum(p.gib for p in here)
            listed = " + ".join(f"{p.name} {p.gib:.1f}" for p in here)
            fits = total <= plan.gpu_gib + 1e-9
            verdict = "" if fits else ": DOES NOT FIT"
            lines.append(f"  {phase}, GPU {gpu}: {listed} = {total:.1f} of {plan.gpu_gib:g} GiB{verdict}")
            if not fits:
                problems.append(f"{phase}, GPU {gpu}: {listed} = {total:.1f} GiB, more than its {plan.gpu_gib:g} GiB")
    return lines, problems


def check(
    plan: MemoryPlan, grpo_args: Any, estimate: Estimate, eval_profile: str | None, profiles_dir: str, source: str
) -> list[str]:
    """The plan's lines; a plan that cannot fit is refused, naming the parts of each GPU that does not fit."""
    lines, problems = lines_and_problems(plan, parts(plan, grpo_args, eval_profile, profiles_dir, estimate.gib))
    if problems:
        raise ConfigError(f"{source}: memory: the plan does not fit:\n  " + "\n  ".join(problems))
    return [*lines, "  " + estimate.line()]
