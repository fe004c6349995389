"""A GRPO run's GPU memory plan: what each part holds on which GPU, while training and while evaluating, checked
against each GPU's memory before the policy loads (`cupid train grpo --dry-run` prints it).

The parts: the reward's judge servers (their serve profiles' `gpu_memory_utilization`, up through the whole run), the
trainer's policy (the recipe's estimate: weights, the adapter with its optimizer state, activations), TRL's colocated
vLLM (`vllm_gpu_memory_utilization` of the GPU it shares with the policy), then, once the trainer's memory is released,
the evaluation's server of the policy (its profile's share). A vLLM share is a fraction of the whole GPU, whatever else
holds memory on it, so shares and the policy's estimate add up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cupid.serving import profiles
from cupid.serving.config import ConfigError


class MemoryPlan(BaseModel):
    """`memory:` of a GRPO recipe for GPUs: how many, their size, and where the policy and the judges run."""

    model_config = ConfigDict(extra="forbid")

    gpus: int = Field(ge=1, description="the GPUs the recipe needs")
    gpu_gib: float = Field(gt=0, description="each GPU's memory, GiB (an 80 GB card: 79.6)")
    policy_gpu: int = Field(0, ge=0, description="the trainer, its colocated vLLM and the evaluation's server")
    policy_training_gib: float = Field(
        gt=0, description="the trainer's peak: policy weights, adapter, its gradients and optimizer, activations"
    )
    judges_gpu: int = Field(0, ge=0, description="where the reward's judge servers run")
    judges: list[str] = Field(default_factory=list, description="the serve profiles of the reward's judges")

    @model_validator(mode="after")
    def _gpus_exist(self) -> MemoryPlan:
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


def parts(plan: MemoryPlan, grpo_args: Any, eval_profile: str | None, profiles_dir: str) -> list[Part]:
    """Every part of the run, on its GPU, in each phase (the judges in both)."""
    shares = {name: profiles.load(name, profiles_dir).gpu_memory_utilization for name in plan.judges}
    out = [
        Part(phase, plan.judges_gpu, f"judge {name} ({share:g} of the GPU)", share * plan.gpu_gib)
        for phase in ("training", "evaluation")
        for name, share in shares.items()
    ]
    out.append(Part("training", plan.policy_gpu, "the policy in training", plan.policy_training_gib))
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


def check(plan: MemoryPlan, grpo_args: Any, eval_profile: str | None, profiles_dir: str, source: str) -> list[str]:
    """The plan's lines; a plan that cannot fit is refused, naming the parts of each GPU that does not fit."""
    lines, problems = lines_and_problems(plan, parts(plan, grpo_args, eval_profile, profiles_dir))
    if problems:
        raise ConfigError(f"{source}: memory: the plan does not fit:\n  " + "\n  ".join(problems))
    return lines
