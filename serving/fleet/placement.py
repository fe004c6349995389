"""Where the servers of a run or a night go: judges once, candidates in turn, GPUs split between them.

The rule is simple enough to predict from the GPU count alone, so a plan is printed and checked before
anything starts (and tested for 1, 2 and 8 GPUs without any):

- judges (decomposer, matcher, judge, summarizer) share the first GPUs, each with its profile's memory
  fraction, for the whole night;
- candidates get the GPUs the judges leave, cut into slots of the largest candidate's size (tensor x
  pipeline x data parallel); slots run side by side, each slot serves its candidates one after another;
- where the judges leave no GPU (one GPU), candidates take turns on the judges' GPU with the memory
  the judges leave: the fraction is the profile's, capped at `SHARED_CEILING` minus the judges';
- on CPU (vLLM's CPU build) there is one slot: candidates take turns beside the judges.

A server is pinned to its GPUs with CUDA_VISIBLE_DEVICES, so vLLM numbers them from 0 inside it. The plan's
servers, started on first need, are a `serving.fleet.run_servers.RunServers`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cupid.serving.fleet.gpu_memory import Gpu, Plan
from cupid.serving.servers.profiles import Profile

# What the servers sharing a GPU may take together: vLLM's fractions are of the whole GPU, and the CUDA
# context of each process sits outside them.
SHARED_CEILING = 0.95


@dataclass
class Placed:
    """One server as it will start: its profile (port and fraction set) and the GPUs it sees."""

    profile: Profile
    gpus: tuple[int, ...] = ()

    @property
    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, self.gpus))} if self.gpus else {}

    def line(self) -> str:
        p = self.profile
        where = f"GPU {','.join(map(str, self.gpus))}" if self.gpus else p.device_chosen or p.engine
        share = f", {p.gpu_memory_utilization:g} of each GPU" if p.on_gpu else ""
        adapters = f" + LoRA {', '.join(p.lora_adapters)}" if p.lora_adapters else ""
        return f"{p.name}: {p.served}{adapters} on {where}, :{p.port}{share}"


def place(
    judges: list[Profile], candidates: list[Profile], gpus: list[Gpu], first_port: int = 8100
) -> tuple[list[Placed], list[list[Placed]], list[str]]:
    """Judges on the first GPUs, candidates in slots on the rest (or in turn beside the judges); ports from
    `first_port` up, one per slot, so side-by-side candidates never share one. Returns the judges, the slots (each
    its candidates, served one after another) and what makes the plan unworkable."""
    problems: list[str] = []
    on_gpu = [p for p in [*judges, *candidates] if p.on_gpu]
    if on_gpu and not gpus:
        problems.append(f"{', '.join(p.name for p in on_gpu)}: GPU profile(s), but no GPU is visible (nvidia-smi)")
    n = len(gpus)

    judge_width = max((p.gpus_per_node for p in judges), default=0)
    placed_judges = [Placed(p, tuple(range(p.gpus_per_node))) for p in judges]
    if judge_width > n and gpus:
        problems.append(f"the judges need {judge_width} GPU(s), {n} visible")

    width = max((p.gpus_per_node for p in candidates), default=0)
    free = list(range(judge_width, n))
    if width == 0:  # CPU candidates: one slot, beside the judges
        groups: list[tuple[int, ...]] = [()]
    elif len(free) >= width:  # GPUs of their own: as many slots as fit
        groups = [tuple(free[i : i + width]) for i in range(0, len(free) - width + 1, width)]
    else:  # one GPU (or too few left): in turn on the judges' GPUs, with the memory they leave
        groups = [tuple(range(width))] if width <= n else []
        if gpus and width > n:
            problems.append(f"a candidate needs {width} GPU(s) (tensor x pipeline x data parallel), {n} visible")
    shared = bool(groups) and bool(groups[0]) and groups[0][0] < judge_width
    judges_share = sum(p.gpu_memory_utilization for p in judges if p.on_gpu)

    slots: list[list[Placed]] = [[] for _ in groups] or [[]]
    for i, profile in enumerate(candidates):
        slot = i % len(slots)
        if profile.on_gpu and shared:
            profile = profile.with_args(
                gpu_memory_utilization=round(min(profile.gpu_memory_utilization, SHARED_CEILING - judges_share), 2)
            )
        gpu_ids = groups[slot][: profile.gpus_per_node] if groups else ()
        slots[slot].append(Placed(profile.model_copy(update={"port": first_port + slot}), gpu_ids))

    problems += _memory_problems(placed_judges, slots, gpus, shared)
    return placed_judges, [s for s in slots if s], problems


def _memory_problems(judges: list[Placed], slots: list[list[Placed]], gpus: list[Gpu], shared: bool) -> list[str]:
    """The one-GPU checks of `Plan` (fractions add up, weights fit) on each set of servers up together."""
    judge_profiles = [j.profile for j in judges]
    candidates = [c.profile for slot in slots for c in slot]
    if shared:  # each candidate meets the judges on their GPU, one at a time
        groups = [[*judge_profiles, c] for c in candidates]
    else:
        groups = [judge_profiles, *([c] for c in candidates)]
    out: list[str] = []
    for c in candidates:
        if c.on_gpu and c.gpu_memory_utilization <= 0:
            out.append(
                f"'{c.name}': the judges leave it no GPU memory "
                f"(they take {SHARED_CEILING - c.gpu_memory_utilization:.2f} "
                f"of the GPU it shares with them, at most {SHARED_CEILING} in all): lower their gpu_memory_utilization"
            )
    for group in groups:
        if all(p.gpu_memory_utilization > 0 for p in group if p.on_gpu):
            out += [problem for problem in Plan(group, [], gpus).problems() if problem not in out]
    return out
