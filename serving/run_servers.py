"""The servers a run or a night brings itself: its judge profiles (`serve:`), served once, and its
candidates that are models (`candidate: {name, model, profile, adapter}`), served in turn or side by side;
a LoRA candidate on a judge's profile that loads adapters at run time is loaded into that judge's server.

One plan (`serving.placement`) decides GPUs, memory fractions and ports before anything starts; the
servers then start on first need (`serving.fleet`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cupid.serving import profiles
from cupid.serving.config import ConfigError
from cupid.serving.endpoints import Endpoint
from cupid.serving.fleet import AdapterOnServer, Fleet, ServedModel, Server, by_address, endpoint_for, fingerprint
from cupid.serving.placement import Placement, place
from cupid.serving.profiles import Gpu, Profile


@dataclass
class RunServers:
    """A plan and its (not yet started) servers, and endpoints for them: each judge by its profile name,
    each candidate by its name."""

    placement: Placement
    fleet: Fleet
    judges: list[Server] = field(default_factory=list)
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    candidate_servers: dict[str, Server] = field(default_factory=dict)
    riders: dict[str, AdapterOnServer] = field(default_factory=dict)  # candidates loaded into a judge's server

    @property
    def slots(self) -> list[list[str]]:
        """Candidate names per slot, in their order."""
        return [[placed.profile.name for placed in slot] for slot in self.placement.slots]

    def lines(self) -> list[str]:
        """The plan as printed: the placement, then the candidates that need no server of their own."""
        out = self.placement.lines()
        if self.riders:
            out.append("  candidates on a judge's server:")
            out += [f"    {name}: {rider.line()}" for name, rider in self.riders.items()]
        return out

    def server_of(self, candidate: str) -> Server | AdapterOnServer | None:
        return self.candidate_servers.get(candidate) or self.riders.get(candidate)


def servers_for(run_servers: RunServers, endpoints: dict[str, Endpoint], candidate: str) -> dict[str, Server | AdapterOnServer]:
    """A run's endpoints that wait for a server: the judges' by address, its own candidate's by name
    (candidates in one slot share an address, one after another)."""
    servers: dict[str, Server | AdapterOnServer] = dict(by_address(run_servers.judges, endpoints))
    if own := run_servers.server_of(candidate):
        servers[candidate] = own
    return servers


def judge_profiles(serve: dict[str, dict], directory: str | Path = profiles.DEFAULT_DIR) -> list[Profile]:
    """`serve:` of a run or a night: profile name -> field overrides (e.g. a smaller GPU memory fraction)."""
    out = []
    for name, overrides in serve.items():
        profile = profiles.load(name, directory)
        if overrides:
            where = f"serve.{name}"
            if clash := sorted({"name", "model", "served_name"} & overrides.keys()):
                raise ConfigError(f"{where}.{clash[0]}: a judge keeps its profile's model; write another profile for another model")
            profile = profiles.override(profile, overrides, where)
        out.append(profile)
    return out


def profile_fingerprints(serve: dict[str, dict], candidates: list[ServedModel], directory: str | Path = profiles.DEFAULT_DIR) -> dict[str, str]:
    """Each profile a run serves (its judges', its candidate's) -> eight hex digits that change when the profile's
    fields or its weights' files change: what a tracker shows beside the scores, so two runs that served
    differently never look alike."""
    served = judge_profiles(serve, directory) + [c.to_profile(directory) for c in candidates]
    return {
        p.name: hashlib.sha256(f"{p.model_dump_json()} {fingerprint(p.model_path(), *p.adapter_paths().values())}".encode()).hexdigest()[:8]
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
    """The plan for these judges and candidates, checked, and a fleet that can start each server."""
    judges = judge_profiles(serve, directory)
    hosts = {c.name: host for c in candidates if (host := c.rides_on(judges))}
    candidate_profiles = [c.to_profile(directory) for c in candidates if c.name not in hosts]
    if gpus is None:
        gpus = profiles.gpus() if any(p.on_gpu for p in [*judges, *candidate_profiles]) else []
    placement = place(judges, candidate_profiles, gpus, first_port)
    placement.check()
    fleet = Fleet(say)
    run_servers = RunServers(placement, fleet)
    for judge in placement.judges:
        run_servers.judges.append(fleet.add(judge))
        run_servers.endpoints[judge.profile.name] = endpoint_for(judge.profile)  # an endpoints-file entry wins
    by_name = {c.name: c for c in candidates}
    judge_servers = {server.profile.name: server for server in run_servers.judges}
    for name, host in hosts.items():
        [(served, adapter)] = by_name[name].to_profile(directory).adapter_paths().items()  # named as if served on its own
        run_servers.riders[name] = fleet.load(judge_servers[host.name], served, adapter)
        run_servers.endpoints[name] = endpoint_for(host, served, **by_name[name].endpoint)
    for slot in placement.slots:
        for placed in slot:
            candidate = by_name[placed.profile.name]
            run_servers.candidate_servers[candidate.name] = fleet.add(placed)
            run_servers.endpoints[candidate.name] = candidate.to_endpoint(placed.profile)
    return run_servers
