"""Servers a run brings itself: judge profiles and candidates that are models rather than endpoints.

A server starts on the first request the cache cannot answer, so a night whose answers are all cached
starts nothing; a failed start is kept and given to every request that needed it, so the run records
the reason instead of stopping. A server a run started that stops answering (its process gone, or its
health check failing HEALTH_CHECKS times) is restarted once (RESTARTS), its log kept beside the new one, and
the requests that failed meanwhile are sent again; if it cannot come back, every later request fails with why. Every
server is tied to this process, and the servers of a run are stopped together (`RunServers.stop_all`), on errors and
Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cupid.common.config import ConfigError, validate
from cupid.common.errors import ServeError, failure_line
from cupid.serving.endpoint import Endpoint
from cupid.serving.fleet.placement import Placed
from cupid.serving.servers import lifecycle, lora, probes, profiles, server_log, state
from cupid.serving.servers.engines import get_engine
from cupid.serving.servers.profiles import Profile, made_by
from cupid.serving.servers.vllm_args import lora_rank_for


class ServedModel(BaseModel):
    """A candidate to serve: a Hub id or local directory, or a LoRA adapter on one, with serve fields
    inherited from a profile (`configs/serve/NAME.yaml`) and overridden under `serve`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="the candidate's name in runs and on the leaderboard")
    model: str | None = Field(default=None, description="Hub id or local directory; default: the profile's model")
    profile: str | None = Field(
        default=None, description="serve profile to inherit dtype, max length, engine args ... from"
    )
    adapter: str | None = Field(default=None, description="LoRA adapter directory, served on `model` as this candidate")
    serve: dict[str, Any] = Field(default_factory=dict, description="serve-profile fields over the inherited ones")
    endpoint: dict[str, Any] = Field(
        default_factory=dict, description="endpoint fields (max_tokens, constrain_candidate, ...)"
    )

    @model_validator(mode="after")
    def _has_model(self) -> ServedModel:
        if self.model is None and self.profile is None:
            raise ValueError("give `model` (a Hub id or directory), `profile`, or both")
        if clash := sorted({"name", "port", "served_name", "lora_adapters"} & self.serve.keys()):
            raise ValueError(f"serve.{clash[0]} is set by the run (name, port and served names follow the candidate)")
        if clash := sorted({"base_url", "model"} & self.endpoint.keys()):
            raise ValueError(f"endpoint.{clash[0]} follows the server the run starts; remove it")
        return self

    def to_profile(self, directory: str | Path = profiles.DEFAULT_DIR) -> Profile:
        """The profile this candidate is served with. Its served name carries a fingerprint of the weights, so
        the request cache never answers for a model that changed under the same name."""
        where = f"candidate '{self.name}'"
        base = profiles.load(self.profile, directory).model_dump(exclude_unset=True) if self.profile else {}
        # The profile's adapters are its own; its GPU fraction is tuned for its own sharing, and a candidate's
        # comes from the plan (or `serve:`).
        fields = {
            k: v for k, v in base.items() if k not in ("name", "lora_adapters", "runtime_lora_rank", "served_name")
        }
        args = {k: v for k, v in base.get("vllm", {}).items() if k not in ("max_lora_rank", "gpu_memory_utilization")}
        fields.update(self.serve)
        fields["vllm"] = {**args, **(self.serve.get("vllm") or {})}
        if self.model:
            fields["model"] = self.model
        served = f"{self.name}@{fingerprint(fields['model'], self.adapter)}"
        if self.adapter:
            fields.update(served_name=f"{self.name}-base", lora_adapters={served: self.adapter})
            fields["vllm"].setdefault("max_lora_rank", _rank_for(self.adapter))
        else:
            fields["served_name"] = served
        fields.setdefault("port", 8100)
        return validate(Profile, {**fields, "name": self.name}, where)

    def rides_on(self, judges: list[Profile]) -> Profile | None:
        """The judge whose server answers this candidate, with the adapter loaded into it while it runs: a LoRA
        candidate on a judge's profile (same model, no `serve:` fields of its own), where that profile loads
        adapters at run time (`runtime_lora_rank`) of the adapter's rank. None: it is served on its own."""
        if not self.adapter or self.serve:
            return None
        host = next((j for j in judges if j.name == self.profile), None)
        if host is None or host.runtime_lora_rank is None or (self.model and self.model != host.model):
            return None
        return host if _rank_for(self.adapter) <= host.runtime_lora_rank else None

    def to_endpoint(self, profile: Profile) -> Endpoint:
        """The adapter answers as the candidate where there is one; the base model otherwise."""
        return endpoint_for(profile, next(iter(profile.lora_adapters), None), **self.endpoint)


def endpoint_for(profile: Profile, model: str | None = None, **fields: Any) -> Endpoint:
    """How a run talks to a server it starts from a profile: as to the same server started by `cupid serve up`."""
    defaults = lifecycle.endpoint_fields(profile.base_url, profile.engine, profile.api_key_env)
    return validate(Endpoint, {**defaults, "model": model or profile.served, **fields}, f"'{profile.name}': endpoint")


def _rank_for(adapter: str) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds the adapter's rank."""
    config = Path(adapter).expanduser().resolve() / "adapter_config.json"
    if not config.exists():
        raise ConfigError(f"LoRA adapter {config.parent} not found (no adapter_config.json); {made_by(adapter)}")
    try:
        rank = int(json.loads(config.read_text())["r"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"{config}: not a LoRA adapter (no readable adapter_config.json with its rank `r`)") from None
    return lora_rank_for(rank)


def fingerprint(*paths: str | None) -> str:
    """Eight hex digits that change when any file of the given local directories changes (name, size, mtime);
    a Hub id counts as itself (pin a revision in the profile's `vllm: {revision: ...}` for a moving one)."""
    digest = hashlib.sha256()
    for path in filter(None, paths):
        local = Path(path).expanduser()
        digest.update(path.encode())
        if local.is_dir():
            for file in sorted(f for f in local.rglob("*") if f.is_file()):
                stat = file.stat()
                digest.update(f"{file.relative_to(local)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:8]


# per night (the servers of a run live for one night or one run): a server that keeps dying is not a fault to hide
RESTARTS = 1
HEALTH_CHECKS, HEALTH_INTERVAL_S = 3, 2.0


class Server:
    """One server a run may need: started once, on first need, from any thread. A server already answering
    for it (`cupid serve up` of the same profile, or any server at its address that lists its served model)
    is used as it is and left running."""

    def __init__(self, placed: Placed, say: Callable[[str], None] | None = None):
        self.say = say or (lambda message: None)
        self.placed = placed
        self.profile = placed.profile
        self.up = False  # answering, whoever started it
        self.error: ServeError | None = None
        self.owned = False  # started by this run (and so stopped by it)
        self.started = False  # it ever was: a night reports what it had to start
        self.starting = False
        self.generation = 0  # restarts so far: a request that failed before one is sent again
        self.deaths: list[str] = []  # each time it stopped answering: why, and where its log was kept
        self.died = False  # stopped answering and did not come back: `error` says why
        self.after_restart: list[Callable[[], None]] = []  # run under the lock, before failed requests are sent again
        self._lock = threading.Lock()
        self._cancel = threading.Event()

    @property
    def name(self) -> str:
        return self.profile.handle

    @property
    def base_url(self) -> str:
        return self.profile.base_url

    def ensure(self) -> None:
        with self._lock:
            if self.error:
                raise self.error
            if self.up:
                return
            if probes.ready(self.profile, get_engine(self.profile.engine)):  # `cupid serve up`, by hand or elsewhere
                self.say(f"using the server that already answers as {self.profile.served} at {self.base_url}")
                self.up = True
                return
            self.say(
                f"starting {self.name} ({self.profile.model_path()}) on :{self.profile.port}; "
                f"log: {state.server_dir(self.name) / 'server.log'}"
            )
            began = time.monotonic()
            self.starting = True
            try:
                self.profile.check_local_files(f"'{self.name}'")
                lifecycle.up(self.profile, env=self.placed.env, tied=True, cancel=self._cancel)
                self.up = self.owned = self.started = True
            except ServeError as e:
                self.error = e
                if not self._cancel.is_set():
                    self.say(f"{self.name} did not start: {failure_line(e)}")
                raise
            finally:
                self.starting = False
            self.say(f"{self.name} ready in {time.monotonic() - began:.0f} s")

    @property
    def failed_to_start(self) -> bool:
        """Its error is a start's, not a death's (`died`)."""
        return self.error is not None and not self.died

    def gone(self) -> bool:
        """This run's server and its process has ended: no retry of a request can reach it (a request that
        failed to connect then asks for `revive` at once instead of backing off first)."""
        if not self.owned:
            return False
        record = state.find(self.name)
        return record is None or not probes.alive(record.pid)

    def revive(self, seen: int) -> bool:
        """After a request to this server failed: True when it is worth sending again, because the server was
        restarted since generation `seen` (now, or by another request's call). False when it answers its health
        check (the failure was the request's own) or is not this run's to restart. Raises when it is gone for good."""
        with self._lock:
            if self.error:
                raise self.error
            if self.generation != seen:
                return True
            if not self.owned:
                return False
            record = state.find(self.name)
            if record is not None and probes.alive(record.pid):
                for _ in range(HEALTH_CHECKS):
                    if probes.ready(self.profile, get_engine(self.profile.engine), timeout=5.0):
                        return False
                    time.sleep(HEALTH_INTERVAL_S)
                why = f"its health check failed {HEALTH_CHECKS} times"
            else:
                why = "its process is gone"
            log = state.server_dir(self.name) / "server.log"
            kept = log.with_name(f"server-died-{len(self.deaths) + 1}.log")
            if log.exists():
                log.replace(kept)  # the next start writes server.log afresh
            lifecycle.down(self.name)  # what is left of its process group, and its record
            self.up = self.owned = False
            self.deaths.append(f"{why}; its log: {kept}")
            self.say(f"{self.name} stopped answering ({why}); its log is kept in {kept}:\n{server_log.tail(kept, 10)}")
            if len(self.deaths) > RESTARTS:
                self.died = True
                self.error = ServeError(
                    f"'{self.name}' stopped answering again ({why}; log {kept}), "
                    f"after its {RESTARTS} restart(s) tonight"
                )
                self.say(str(self.error))
                raise self.error
            self.say(f"restarting {self.name} (restart {len(self.deaths)} of {RESTARTS})")
            try:
                lifecycle.up(self.profile, env=self.placed.env, tied=True, cancel=self._cancel)
            except ServeError as e:
                self.died = True
                self.error = ServeError(
                    f"'{self.name}' stopped answering ({why}; log {kept}) and did not come back: {failure_line(e)}"
                )
                self.say(str(self.error))
                raise self.error from None
            self.up = self.owned = True
            self.generation += 1
            self.say(f"{self.name} answers again")
            for hook in self.after_restart:
                hook()
            return True

    async def wait_ready(self) -> None:
        """`ensure` from a coroutine (see `_off_loop`)."""
        await _off_loop(self.ensure, f"start {self.name}")

    async def revived(self, seen: int) -> bool:
        """`revive` from a coroutine (see `_off_loop`)."""
        return await _off_loop(lambda: self.revive(seen), f"revive {self.name}")

    def line(self) -> str:
        return self.placed.line()

    def stop(self) -> bool:
        """Stop it if this run started it, a start under way included; True if there was one to stop."""
        self._cancel.set()
        was_starting = self.starting
        with self._lock:  # a start under way sees the cancel, stops its server and lets go
            stopped = self.owned or was_starting
            if self.owned:
                lifecycle.down(self.name)
            self.up = self.owned = False
            self._cancel.clear()
        if stopped:
            self.say(f"stopped {self.name}")
        return stopped


class AdapterOnServer:
    """A LoRA candidate answered by a judge's server of its base (`ServedModel.rides_on`): loaded into it on first
    need, again after that server is restarted, unloaded by `stop`. No server start of its own and, on a GPU, no
    second copy of the base beside the judges. Requests see it as a `Server` (start, restart, gone)."""

    def __init__(self, host: Server, served: str, adapter: str):
        self.host, self.served, self.adapter = host, served, adapter
        self._error: ServeError | None = None
        self._loaded: int | None = None  # the host's generation that holds the adapter
        self._ever_loaded = False
        self._lock = threading.Lock()

    @property
    def error(self) -> ServeError | None:
        return self._error or self.host.error

    @property
    def died(self) -> bool:
        return self.host.died

    @property
    def generation(self) -> int:
        return self.host.generation

    @property
    def failed_to_start(self) -> bool:
        """Its judges' server's start failed (not its load, not that server's death)."""
        return self._error is None and self.host.failed_to_start

    @property
    def started(self) -> bool:
        """It was loaded into its judges' server (a night answered from the cache never loads it)."""
        return self._ever_loaded

    def line(self) -> str:
        return f"{self.served} (LoRA {self.adapter}) loaded into {self.host.name}'s server, :{self.host.profile.port}"

    def ensure(self) -> None:
        self.host.ensure()
        if self._error:
            raise self._error
        seen = self.host.generation
        try:
            self._load_into(seen)
        except ServeError as first:
            # The server's fault, as for any request (restarted; raises when it cannot come back), or the load's
            # own. Outside this adapter's lock: `stop` never waits for a restart.
            if not self.host.revive(seen):
                raise self._failed(first) from None
            try:
                self._load_into(self.host.generation)
            except ServeError as again:
                raise self._failed(again) from None

    def reload(self) -> None:
        """The host's restart hook (under its lock, before its requests are sent again): back into the new server
        while this candidate's run is on, so that no request meets a server without it."""
        if self._loaded is None:
            return
        self._loaded = None
        try:
            self._load_into(self.host.generation)
        except ServeError as e:
            self._failed(e)

    def _load_into(self, generation: int) -> None:
        with self._lock:
            if self._loaded == generation:
                return
            lora.load_lora(self.host.base_url, self.served, self.adapter, self.host.profile.api_key())
            self._loaded, self._ever_loaded = generation, True
        self.host.say(f"loaded LoRA {self.served} into {self.host.name}'s server ({self.adapter})")

    def _failed(self, e: ServeError) -> ServeError:
        self._error = ServeError(f"LoRA {self.served} not loaded into {self.host.name}'s server: {e}")
        self.host.say(str(self._error))
        return self._error

    def gone(self) -> bool:
        return self.host.gone()

    async def wait_ready(self) -> None:
        await _off_loop(self.ensure, f"load {self.served}")

    async def revived(self, seen: int) -> bool:
        again = await self.host.revived(seen)
        if again:  # the restart's hook reloaded it where it was loaded; here it is loaded where it was not yet
            await self.wait_ready()
        return again

    def stop(self) -> bool:
        """Unload it (the judges' server goes on serving); True if it was loaded. Takes no lock: never waits for
        a load or a restart under way (an interrupted night)."""
        loaded, self._loaded = self._loaded is not None, None
        if loaded and self.host.up:
            try:
                lora.unload_lora(self.host.base_url, self.served, self.host.profile.api_key(), timeout=10)
                self.host.say(f"unloaded LoRA {self.served} from {self.host.name}'s server")
            except ServeError as e:  # the server went meanwhile: nothing is left loaded
                self.host.say(f"LoRA {self.served} not unloaded: {e}")
        return loaded


async def _off_loop(work: Callable[[], Any], name: str) -> Any:
    """Run a server's start or restart in a daemon thread of its own: an interrupted run's event loop never waits
    for it to finish (the default executor would), and `stop` cancels the start instead."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not done.done():
            done.set_exception(error) if error else done.set_result(result)

    def target() -> None:
        result, error = None, None
        try:
            result = work()
        except BaseException as e:  # noqa: BLE001 (handed to the loop, raised there)
            error = e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the run is over (its loop closed)
            pass

    threading.Thread(target=target, name=name, daemon=True).start()
    return await done


def by_address(servers: list[Server], endpoints: dict[str, Endpoint]) -> dict[str, Server]:
    """The endpoints that a server answers: same host (localhost = 127.0.0.1) and port."""
    at = {_address(s.base_url): s for s in servers}
    return {name: at[_address(e.url)] for name, e in endpoints.items() if _address(e.url) in at}


def _address(url: str) -> tuple[str, int | None]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    return ("127.0.0.1" if host in ("localhost", "0.0.0.0") else host, parts.port)
