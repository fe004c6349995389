"""The servers a run or a night brings itself: its judge profiles (`serve:`), served once, and its
candidates that are models (`candidate: {name, model, profile, adapter}`), served in turn or side by side;
a LoRA candidate on a judge's profile that loads adapters at run time is loaded into that judge's server.

`RunServers` is the one model of them: the plan (`serving.fleet.placement` decides GPUs, memory fractions and ports
before anything starts), the servers (`serving.fleet.on_demand`: each starts on its first request) and their endpoints.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cupid.common.config import ConfigError
from cupid.common.errors import ServeError
from cupid.serving.client import ManagedServer
from cupid.serving.endpoint import Endpoint
from cupid.serving.fleet import gpu_memory
from cupid.serving.fleet.gpu_memory import Gpu
from cupid.serving.fleet.on_demand import AdapterOnServer, ServedModel, Server, by_address, endpoint_for, fingerprint
from cupid.serving.fleet.placement import Placed, place
from cupid.serving.servers import profiles
from cupid.serving.servers.profiles import Profile


@dataclass
class RunServers:
    """The servers a run, a night or a training check brings, as one model: where each goes (its GPUs, memory
    fraction and port: `serving.fleet.placement`), each server (started on its first request), the endpoint a run talks
    to it by (each judge by its profile name, each candidate by its name), the LoRA candidates loaded into a judge's
    server; all stopped together by `stop_all`."""

    gpus: list[Gpu] = field(default_factory=list)
    judges: list[Server] = field(default_factory=list)  # served once, for the whole run or night
    slots: list[list[Server]] = field(default_factory=list)  # candidates: slots side by side, each slot's in turn
    riders: dict[str, AdapterOnServer] = field(default_factory=dict)  # candidates loaded into a judge's server
    others: list[Server] = field(default_factory=list)  # servers added outside the plan (`add`)
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # what makes the plan unworkable (`check` refuses it)
    say: Callable[[str], None] | None = None

    @property
    def servers(self) -> list[Server]:
        return [*self.judges, *self.candidates(), *self.others]

    def candidates(self) -> list[Server]:
        return [server for slot in self.slots for server in slot]

    @property
    def candidate_servers(self) -> dict[str, Server]:
        """Each candidate with a server of its own, by name."""
        return {server.profile.name: server for server in self.candidates()}

    @property
    def slot_names(self) -> list[list[str]]:
        """Candidate names per slot, in their order."""
        return [[server.profile.name for server in slot] for slot in self.slots]

    def add(self, placed: Placed) -> Server:
        """A server of its own among these (started on need, stopped with the others)."""
        server = Server(placed, self.say)
        self.others.append(server)
        return server

    def load(self, name: str, host: Server, served: str, adapter: str) -> AdapterOnServer:
        """A LoRA adapter (a candidate `name`, answering as `served`) loaded into `host` on need, again after a restart
        of it, unloaded by `stop_all`."""
        rider = AdapterOnServer(host, served, adapter)
        host.after_restart.append(rider.reload)
        self.riders[name] = rider
        return rider

    def server_of(self, candidate: str) -> Server | AdapterOnServer | None:
        return self.candidate_servers.get(candidate) or self.riders.get(candidate)

    def for_run(self, endpoints: dict[str, Endpoint], candidate: str) -> dict[str, ManagedServer]:
        """A run's endpoints that wait for a server: the judges' by address, its own candidate's by name
        (candidates in one slot share an address, one after another)."""
        servers: dict[str, ManagedServer] = dict(by_address(self.judges, endpoints))
        if own := self.server_of(candidate):
            servers[candidate] = own
        return servers

    def check(self) -> None:
        if self.problems:
            raise ServeError("refusing this plan:\n  " + "\n  ".join(self.problems))

    def stop_all(self) -> list[str]:
        """Take the adapters out of the servers found answering, then stop what was started here (with the adapters
        in them); the names stopped."""
        for rider in self.riders.values():
            if not rider.host.owned:
                rider.stop()
        return [server.name for server in self.servers if server.stop()]

    def lines(self) -> list[str]:
        """The plan as printed: GPUs, judges, candidates slot by slot, those on a judge's server, problems."""
        gpus = f"{len(self.gpus)} x {self.gpus[0].name} ({self.gpus[0].total_gib:.0f} GiB)" if self.gpus else "no GPU"
        out = [f"plan on {gpus}:"]
        if self.judges:
            out.append("  judges, served once:")
            out += [f"    {j.line()}" for j in self.judges]
        side = f"{len(self.slots)} side by side" if len(self.slots) > 1 else "one at a time"
        if self.slots:
            out.append(f"  candidates, {side}:")
        for number, slot in enumerate(self.slots, start=1):
            out.append(f"    slot {number}:" + (" in turn" if len(slot) > 1 else ""))
            out += [f"      {c.line()}" for c in slot]
        if self.riders:
            out.append("  candidates on a judge's server:")
            out += [f"    {name}: {rider.line()}" for name, rider in self.riders.items()]
        out += [f"  problem: {p}" for p in self.problems]
        return out


def judge_profiles(serve: dict[str, dict], directory: str | Path = profiles.DEFAULT_DIR) -> list[Profile]:
    """`serve:` of a run or a night: profile name -> field overrides (e.g. a smaller GPU memory fraction)."""
    out = []
    for name, overrides in serve.items():
        profile = profiles.load(name, directory)
        if overrides:
            where = f"serve.{name}"
            if clash := sorted({"name", "model", "served_name"} & overrides.keys()):
                raise ConfigError(
                    f"{where}.{clash[0]}: a judge keeps its profile's model; write another profile for another model"
                )
            profile = profiles.override(profile, overrides, where)
        out.append(profile)
    return out


def profile_fingerprints(
    serve: dict[str, dict], candidates: list[ServedModel], directory: str | Path = profiles.DEFAULT_DIR
) -> dict[str, str]:
    """Each profile a run serves (its judges', its candidate's) -> eight hex digits that change when the profile's
    fields or its weights' files change: what a tracker shows beside the scores, so two runs that served
    differently never look alike."""
    served = judge_profiles(serve, directory) + [c.to_profile(directory) for c in candidates]
    return {
        p.name: hashlib.sha256(
            f"{p.model_dump_json()} {fingerprint(p.model_path(), *p.adapter_paths().values())}".encode()
        ).hexdigest()[:8]
        for p in served
    }


def plan_servers(
    serve: dict[str, dict],
    candidates: list[ServedModel],
    gpus: list[Gpu] | None = None,
    first_port: int = 8100,
    directory: str | Path = profiles.DEFAULT_DIR,
    say: Callable[[str], None] | None = None,
) -> RunServers:
    """The plan for these judges and candidates, checked; its servers start on their first request."""
    judges = judge_profiles(serve, directory)
    hosts = {c.name: host for c in candidates if (host := c.rides_on(judges))}
    candidate_profiles = [c.to_profile(directory) for c in candidates if c.name not in hosts]
    if gpus is None:
        gpus = gpu_memory.gpus() if any(p.on_gpu for p in [*judges, *candidate_profiles]) else []
    placed_judges, placed_slots, problems = place(judges, candidate_profiles, gpus, first_port)
    run_servers = RunServers(gpus=gpus, problems=problems, say=say)
    run_servers.check()
    run_servers.judges = [Server(placed, say) for placed in placed_judges]
    run_servers.slots = [[Server(placed, say) for placed in slot] for slot in placed_slots]
    for judge in run_servers.judges:
        # an endpoints-file entry wins; the weights' fingerprint goes with every request (a refitted judge under the
        # same name is another judge)
        revision = fingerprint(judge.profile.model_path(), *judge.profile.adapter_paths().values())
        run_servers.endpoints[judge.profile.name] = endpoint_for(judge.profile, revision=revision)
    by_name = {c.name: c for c in candidates}
    judge_servers = {server.profile.name: server for server in run_servers.judges}
    for name, host in hosts.items():
        [(served, adapter)] = (
            by_name[name].to_profile(directory).adapter_paths().items()
        )  # named as if served on its own
        run_servers.load(name, judge_servers[host.name], served, adapter)
        run_servers.endpoints[name] = endpoint_for(host, served, **by_name[name].endpoint)
    for server in run_servers.candidates():
        candidate = by_name[server.profile.name]
        run_servers.endpoints[candidate.name] = candidate.to_endpoint(server.profile)
    return run_servers
