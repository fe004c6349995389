"""The state directory (`.cupid/`, or CUPID_HOME) and the record each server this project started keeps there
(`<state>/servers/<name>.json`), by which `down`, `status`, `logs` and evaluation runs find it by name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cupid.common.files import state_dir
from cupid.serving.servers.engines import capabilities
from cupid.serving.servers.profiles import AS_SERVED, Profile


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "__", name)


def servers_dir() -> Path:
    path = state_dir() / "servers"
    path.mkdir(parents=True, exist_ok=True)
    return path


def server_dir(name: str) -> Path:
    """A server's own directory beside its record: its log (`server.log`) and what its engine prepares there."""
    return servers_dir() / slug(name)


def record_path(name: str) -> Path:
    return servers_dir() / f"{slug(name)}.json"


class ServerRecord(BaseModel):
    """What is kept of a server this project started (`<state>/servers/<name>.json`): the profile as served (any
    override applied, local paths absolute) and what the running adds. How to reach it by name (`cupid eval`,
    `status`) and how to stop it (`down`). Secrets stay out: the key's variable only."""

    model_config = ConfigDict(extra="ignore")  # a record written by another version

    profile: Profile
    env: dict[str, str] = Field(default_factory=dict)  # what this project set in its environment (never a secret)
    pid: int  # its process group's id too: it starts in a session of its own
    tied_to: int | None = None  # the process it lives no longer than
    log: str
    command: list[str] = Field(default_factory=list)
    started_at: float = 0.0

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        """A record of a server started before records held its profile (its fields side by side): still found by
        `status` and stopped by `down`."""
        if isinstance(data, dict) and "profile" not in data and "port" in data:
            fields = ("engine", "model", "served_name", "host", "port", "api_key_env")
            profile = {k: data[k] for k in fields if data.get(k) is not None}
            several = len(capabilities(data.get("engine")).devices) > 1  # a device of its own to keep
            device = {"device": data["device"]} if several and "device" in data else {}
            return {**data, "profile": {"name": data.get("name", ""), **profile, **device}}
        return data

    @property
    def name(self) -> str:
        return self.profile.handle

    @property
    def served_models(self) -> list[str]:
        """The served name, then each LoRA adapter it was started with."""
        return [self.profile.served, *self.profile.lora_adapters]

    @property
    def base_url(self) -> str:
        return self.profile.base_url

    @property
    def gpu_memory_utilization(self) -> float | None:
        """Its share of the GPU (plans count it against the servers they start); None off the GPU."""
        return self.profile.gpu_memory_utilization if self.profile.on_gpu else None

    def write(self) -> None:
        record_path(self.name).write_text(self.model_dump_json(indent=2))


class ServerStatus(ServerRecord):
    alive: bool  # its process runs
    healthy: bool  # and answers (a headless node: runs)


def _read(path: Path) -> ServerRecord | None:
    try:
        return ServerRecord.model_validate_json(path.read_text(), context={AS_SERVED: True})
    except (OSError, ValidationError):
        return None


def records() -> list[ServerRecord]:
    """Every server record; reading makes no directory (a run that only asks what runs writes nothing)."""
    folder = state_dir() / "servers"
    return [record for path in sorted(folder.glob("*.json")) if (record := _read(path)) is not None]


def find(name: str) -> ServerRecord | None:
    path = record_path(name)
    return _read(path) if path.is_file() else None
