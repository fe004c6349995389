"""The servers this project starts (`cupid serve`): serve profiles and their vLLM arguments, the engines, a server's
life (up, down, status, its records, ports, probes, logs and watchdog), the instant test server and the tiny model.
The client side (`serving.client`, `serving.registry`, `serving.endpoint`, `serving.cache`) never imports this room:
what it must know of these servers (the ones running, how to start one) is handed to it (`lifecycle.live_endpoints`,
`profiles.start_hint`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cupid.common.faces import lazy

# What the rest of the package uses of this room, by the module that defines it (imported on first use)
EXPORTS = {
    "Engine": "cupid.serving.servers.engines",
    "PREFERENCE": "cupid.serving.servers.instant",
    "Profile": "cupid.serving.servers.profiles",
    "RANDOM_CONFIG": "cupid.serving.servers.tiny_model",
    "ServerRecord": "cupid.serving.servers.state",
    "VLLM_INSTALL": "cupid.serving.servers.engines",
    "engine_env": "cupid.serving.servers.vllm_args",
    "free_port": "cupid.serving.servers.ports",
    "get_engine": "cupid.serving.servers.engines",
    "llm_kwargs": "cupid.serving.servers.vllm_args",
    "lora_rank_for": "cupid.serving.servers.vllm_args",
    "port_free": "cupid.serving.servers.ports",
    "start": "cupid.serving.servers.instant",
    "live_endpoints": "cupid.serving.servers.lifecycle",
    "taken": "cupid.serving.servers.ports",
    "vllm_build": "cupid.serving.servers.engines",
    "vllm_defaults": "cupid.serving.servers.vllm_args",
}
__all__ = [
    "PREFERENCE",
    "RANDOM_CONFIG",
    "VLLM_INSTALL",
    "Engine",
    "Profile",
    "ServerRecord",
    "engine_env",
    "free_port",
    "get_engine",
    "live_endpoints",
    "llm_kwargs",
    "lora_rank_for",
    "port_free",
    "start",
    "taken",
    "vllm_build",
    "vllm_defaults",
]
__getattr__, __dir__ = lazy(__name__, EXPORTS)

if TYPE_CHECKING:
    from cupid.serving.servers.engines import VLLM_INSTALL, Engine, get_engine, vllm_build
    from cupid.serving.servers.instant import PREFERENCE, start
    from cupid.serving.servers.lifecycle import live_endpoints
    from cupid.serving.servers.ports import free_port, port_free, taken
    from cupid.serving.servers.profiles import Profile
    from cupid.serving.servers.state import ServerRecord
    from cupid.serving.servers.tiny_model import RANDOM_CONFIG
    from cupid.serving.servers.vllm_args import engine_env, llm_kwargs, lora_rank_for, vllm_defaults
