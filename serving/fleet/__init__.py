"""The servers a run or a night brings as one model: the GPUs and their memory plan (gpu_memory.py), where each
server goes (placement.py), each server started on first need and restarted once (servers.py), and the whole of them
(run_servers.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cupid.common.faces import lazy

# What the rest of the package uses of this room, by the module that defines it (imported on first use)
EXPORTS = {
    "Gpu": "cupid.serving.fleet.gpu_memory",
    "Placed": "cupid.serving.fleet.placement",
    "Plan": "cupid.serving.fleet.gpu_memory",
    "RunServers": "cupid.serving.fleet.run_servers",
    "SHARED_CEILING": "cupid.serving.fleet.placement",
    "ServedModel": "cupid.serving.fleet.servers",
    "fingerprint": "cupid.serving.fleet.servers",
    "gpus": "cupid.serving.fleet.gpu_memory",
    "judge_profiles": "cupid.serving.fleet.run_servers",
    "parse_nvidia_smi": "cupid.serving.fleet.gpu_memory",
    "plan_servers": "cupid.serving.fleet.run_servers",
    "profile_fingerprints": "cupid.serving.fleet.run_servers",
}
__all__ = [
    "SHARED_CEILING",
    "Gpu",
    "Placed",
    "Plan",
    "RunServers",
    "ServedModel",
    "fingerprint",
    "gpus",
    "judge_profiles",
    "parse_nvidia_smi",
    "plan_servers",
    "profile_fingerprints",
]
__getattr__, __dir__ = lazy(__name__, EXPORTS)

if TYPE_CHECKING:
    from cupid.serving.fleet.gpu_memory import Gpu, Plan, gpus, parse_nvidia_smi
    from cupid.serving.fleet.placement import SHARED_CEILING, Placed
    from cupid.serving.fleet.run_servers import RunServers, judge_profiles, plan_servers, profile_fingerprints
    from cupid.serving.fleet.servers import ServedModel, fingerprint
