"""The GPUs here (nvidia-smi) and a plan of profiles to serve together on them: fractions of GPU memory checked
against each other, against the servers already running and against each GPU, before anything starts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cupid.common.errors import ServeError
from cupid.serving.servers.profiles import Profile

if TYPE_CHECKING:  # the servers running now, as their records say
    from cupid.serving.servers.state import ServerRecord

# Per-GPU memory a vLLM process needs beyond its weights before any KV cache: CUDA context, activations
# of the profiling run, CUDA graphs. A rough figure, used only to refuse fractions that cannot work.
RUNTIME_OVERHEAD_GIB = 1.5


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
    dp = "data_parallel_size_local" if p.arg("data_parallel_size_local") else "data_parallel_size"
    factors = [(k, p.arg(k, 1)) for k in ("tensor_parallel_size", "pipeline_parallel_size", dp)]
    text = " x ".join(f"{k} {v}" for k, v in factors if v > 1) or "tensor_parallel_size 1"
    return text + (f" / nnodes {p.arg('nnodes')}" if p.value("nnodes") > 1 else "")


@dataclass
class Plan:
    """Profiles to start together, checked against each other, the servers already running and the GPU.

    All vLLM servers are taken to share the same GPUs (the visible ones), each with its fraction."""

    profiles: list[Profile]
    running: list[ServerRecord] = field(default_factory=list)  # the servers running now
    gpus: list[Gpu] = field(default_factory=list)  # empty: unknown here

    def vllm_fractions(self) -> list[tuple[str, float]]:
        planned = {p.name for p in self.profiles}
        shares = [
            (f"{r.name} (running)", r.gpu_memory_utilization)
            for r in self.running
            if r.gpu_memory_utilization and r.name not in planned
        ]
        return shares + [(p.name, p.gpu_memory_utilization) for p in self.profiles if p.on_gpu]

    def problems(self) -> list[str]:
        out: list[str] = []
        names = [p.name for p in self.profiles]
        out += [f"profile '{n}' is asked twice" for n in sorted({n for n in names if names.count(n) > 1})]
        owners: dict[tuple[str, int], str] = {
            (r.profile.host, r.profile.port): f"{r.name} (running)" for r in self.running
        }
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
                if p.gpus_per_node > len(self.gpus) and p.arg("distributed_executor_backend") != "ray":
                    out.append(
                        f"'{p.name}': {p.gpus_per_node} GPUs on this node ({_shape(p)}), "
                        f"but {len(self.gpus)} GPU(s) visible"
                    )
                    continue
                if p.weights_gib is None:
                    continue
                share = p.gpu_memory_utilization * smallest
                need = p.weights_gib / p.width + RUNTIME_OVERHEAD_GIB
                if share < need:
                    out.append(
                        f"'{p.name}': {p.gpu_memory_utilization:g} of {smallest:.1f} GiB is {share:.1f} GiB, "
                        f"less than the ~{need:.1f} GiB its weights and runtime need before any KV cache "
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
            device = f" ({p.device_chosen})" if p.device_chosen else ""
            out.append(f"{p.name}: {p.engine}{device} {p.served} on {p.host}:{p.port}{share}")
        shares = self.vllm_fractions()
        if shares:
            total = sum(f for _, f in shares)
            gib = (
                f" = {total * min(g.total_gib for g in self.gpus):.1f} GiB of {self.gpus[0].name}" if self.gpus else ""
            )
            out.append(f"GPU memory: {total:.2f} of the GPU{gib}")
        return out
