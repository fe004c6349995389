"""Named OpenAI-compatible endpoints (`configs/endpoints.yaml`), the one resolver of an endpoint's name (an entry of
that file or a server running under `cupid serve up`, handed in by whoever resolves), and whether each answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cupid.common.config import ConfigError, read_yaml, validate
from cupid.common.tls import http_get
from cupid.serving.endpoint import Endpoint, bearer

DEFAULT_FILE = "configs/endpoints.yaml"
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "0.0.0.0", "::1"})  # a server on this machine
URL_SCHEMES = ("http://", "https://")  # a name that starts so is a base URL

Started = Callable[[], Mapping[str, Endpoint]]
"""The servers `cupid serve` started, by name (`serving.servers.lifecycle.live_endpoints`): handed to the resolver
by whoever resolves names, since this side of serving never imports the side that starts servers."""
Hint = Callable[[Endpoint], str]
"""What to do about an endpoint that does not answer (`serving.servers.profiles.start_hint`: the profile to start)."""


def load_endpoints(path: str | Path) -> dict[str, Endpoint]:
    data = read_yaml(path)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: expected a mapping of endpoint name -> {{base_url, model, ...}}")
    return {name: validate(Endpoint, entry, f"{path}: endpoint '{name}'") for name, entry in data.items()}


def require(endpoints: dict[str, Endpoint], name: str, path: str | Path) -> Endpoint:
    if name not in endpoints:
        raise ConfigError(f"{path}: no endpoint named '{name}' (known: {', '.join(sorted(endpoints))})")
    return endpoints[name]


def lookup(
    names: Iterable[str],
    path: str | Path = DEFAULT_FILE,
    *,
    given: Mapping[str, Endpoint] | None = None,
    served: Mapping[str, Endpoint] | None = None,
    notes: list[tuple[str, str]] | None = None,
    started: Started | None,
) -> dict[str, Endpoint]:
    """Endpoints by name, the one resolver of role names. A name is, first found: an endpoint `given` as an
    object (the Python API's), a server running under `cupid serve up` (by its profile name, its served name or an
    adapter's: what runs, on its actual port, so a running profile needs no entry and a stale entry cannot point
    elsewhere; where the endpoints file has an entry of that name too, the entry's settings on the running server's
    address and model; asked of `started`), an entry of the endpoints file, a base URL (the one model it serves), or a
    server this run brings (`served`). `notes` gets a line for each name where a running server and the file's entry
    disagree, with the running server's URL (the run says which it used, once per server). `started` is required,
    None included, so that no caller forgets the running servers by leaving it out."""
    names = sorted(set(names))
    given, file = dict(given or {}), load_endpoints(path)
    asked = [name for name in names if name not in given]
    live = started() if asked and started is not None else {}
    running = {}
    for name in (n for n in asked if n in live):
        running[name] = live[name]
        if name in file:  # the entry's settings (limits, formats, timeouts), on the server that runs
            entry = file[name]
            running[name] = entry.model_copy(update={"base_url": live[name].base_url, "model": live[name].model})
            if entry.url != live[name].url and notes is not None:
                notes.append(
                    (
                        live[name].url,
                        f"'{name}': the server `cupid serve` runs at {live[name].url} is used, not {path}'s entry "
                        f"({entry.url})",
                    )
                )
    # An entry that belongs to a profile (`profile:`, e.g. `tiny-constrained` on `tiny`'s server) follows that
    # profile's running server wherever it listens, its own model and settings kept.
    for name in (n for n in asked if n not in live and n in file and file[n].profile in live):
        entry, server = file[name], live[str(file[name].profile)]
        running[name] = entry.model_copy(update={"base_url": server.base_url})
        if entry.url != server.url and notes is not None:
            notes.append(
                (
                    server.url,
                    f"'{name}': profile '{entry.profile}' runs at {server.url} (`cupid serve`): used, not {path}'s "
                    f"entry ({entry.url})",
                )
            )
    # A base URL as a name (`--candidate http://host:8000/v1`), as the Python API takes one: the model it serves.
    urls = {n: resolve(n, started=None) for n in asked if n.startswith(URL_SCHEMES) and n not in file}
    known = {**(served or {}), **file, **urls, **running, **given}
    return {name: require(known, name, path) for name in names}


REACH_TIMEOUT_S = 3.0  # a server that is up answers its model list in milliseconds
API_PATH = "/v1"  # where an OpenAI-compatible server's API lives under its address (vLLM, OpenAI)
ANY_MODEL = "*"  # listed by a server that answers under any model name (a router's wildcard route, the instant server)

Problem = tuple[str, str | None]
"""Why a run cannot send to an endpoint, and what to do (None: how to start its server, the run's `Hint`)."""


def endpoint_problem(endpoint: Endpoint, timeout: float = REACH_TIMEOUT_S) -> Problem | None:
    """Ask the endpoint's model list (`GET <base_url>/models`, as `cupid serve status` does) what a first request would
    meet: nothing answering; no model list where the base URL lacks its API path (a 404 on every request); a model the
    server does not serve (a 404 on every request, vLLM's "model does not exist"). Any other answer, an error included
    (401 without a key), or a list this cannot read, is a server to send to."""
    import httpx

    try:
        answer = http_get(endpoint.url + "/models", timeout=timeout, headers=bearer(endpoint.api_key()))
    except httpx.HTTPError as e:
        return f"does not answer ({type(e).__name__}: {e})" if str(e) else f"does not answer ({type(e).__name__})", None
    if answer.status_code == 404:
        fix = (
            f"its base_url lacks the API path: {endpoint.url}{API_PATH}"
            if not endpoint.url.endswith(API_PATH)
            else "check its base_url's API path"
        )
        return f"has no model list at {endpoint.url}/models (HTTP 404)", fix
    try:
        served = [str(m["id"]) for m in answer.json()["data"]] if answer.status_code == 200 else []
    except (ValueError, KeyError, TypeError):
        served = []
    if served and endpoint.model not in served and ANY_MODEL not in served:
        return (
            f"does not serve model '{endpoint.model}' (it serves: {', '.join(served)})",
            "set its model to one of them",
        )
    return None


def unreachable(endpoints: Mapping[str, Endpoint], timeout: float = REACH_TIMEOUT_S) -> dict[str, Problem]:
    """Each endpoint a first request would fail on, and why (`endpoint_problem`); asked side by side."""
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(endpoints)))) as pool:
        found = dict(zip(endpoints, pool.map(lambda e: endpoint_problem(e, timeout), endpoints.values()), strict=True))
    return {name: problem for name, problem in found.items() if problem is not None}


def local(endpoint: Endpoint) -> bool:
    from urllib.parse import urlparse

    return urlparse(endpoint.url).hostname in LOCAL_HOSTS


def how_to_start(endpoint: Endpoint) -> str:
    """What to do about an endpoint that does not answer, where nothing more is known of its server."""
    return (
        "start its server (`cupid serve up`)"
        if local(endpoint)
        else "check that the server runs and its address is right"
    )


class EndpointDown(ConfigError):
    """An endpoint a run must send to does not answer: the run stops at once, before sending to it."""


def down_message(
    down: Mapping[str, Problem],
    endpoints: Mapping[str, Endpoint],
    roles: Mapping[str, str] | None = None,
    hint: Hint | None = None,
) -> str:
    """`matcher 'pm' at URL does not answer (why): how to start it; nothing was sent to it`, for each endpoint a run
    cannot send to (`unreachable`). `roles`: role -> endpoint name; `hint`: what to do about a server that does not
    answer (default: `how_to_start`)."""
    lines = []
    for name, (what, fix) in down.items():
        playing = ", ".join(role for role, used in (roles or {}).items() if used == name) or "endpoint"
        lines.append(
            f"{playing} '{name}' at {endpoints[name].url} {what}: "
            f"{fix or (hint or how_to_start)(endpoints[name])}; nothing was sent to it"
        )
    return "; ".join(lines)


def require_reachable(
    endpoints: Mapping[str, Endpoint], roles: Mapping[str, str] | None = None, hint: Hint | None = None
) -> None:
    """Refuse at once when an endpoint does not answer: naming the role(s) it plays, the endpoint, its URL and how
    to start it."""
    if down := unreachable(endpoints):
        raise EndpointDown(down_message(down, endpoints, roles, hint))


def missing_keys(endpoints: dict[str, Endpoint]) -> list[str]:
    """Environment variables that endpoints need but that are not set."""
    return sorted({e.api_key_env for e in endpoints.values() if e.api_key_env and not e.api_key()})


EndpointLike = Endpoint | str
"""An `Endpoint`, a base URL (`http://localhost:8000/v1`), or a name: an entry of the endpoints file
(`configs/endpoints.yaml`), or a server running under `cupid serve up` (its profile name)."""


def resolve(
    spec: EndpointLike,
    *,
    model: str | None = None,
    endpoints_file: str | Path = DEFAULT_FILE,
    started: Started | None,
    **fields: Any,
) -> Endpoint:
    """An endpoint from any `EndpointLike`. A base URL takes `model` (default: the one model the server
    lists, its LoRA adapters aside) and any other `Endpoint` field (`structured_output=True`,
    `matcher_prompt="prefmatcher"`, ...); a name is looked up (`lookup`, with `started`)."""
    if isinstance(spec, Endpoint):
        return spec.model_copy(update=fields) if fields else spec
    if spec.startswith(URL_SCHEMES):
        return Endpoint.model_validate({"base_url": spec, "model": model or _served_model(spec), **fields})
    found = lookup([spec], endpoints_file, started=started)[spec]
    return found.model_copy(update=fields) if fields else found


def _served_model(base_url: str) -> str:
    """The one model the server serves; LoRA adapters loaded into it (vLLM lists them with their `parent`) do not
    count: they come and go while it runs."""
    import httpx

    url = base_url.rstrip("/") + "/models"
    try:
        answer = http_get(url, timeout=10)
    except httpx.TransportError as e:
        raise ConfigError(
            f"{url}: nothing answers ({type(e).__name__}: {e}): "
            "start the server (`cupid serve up`) or check the address"
        ) from None
    except httpx.HTTPError as e:
        raise ConfigError(f"{url}: no model list ({type(e).__name__}: {e}); pass model=") from None
    if answer.status_code == 404 and not base_url.rstrip("/").endswith(API_PATH):
        raise ConfigError(
            f"{url}: no model list (HTTP 404): its base_url lacks the API path: {base_url.rstrip('/')}{API_PATH}"
        )
    try:
        listed = [m["id"] for m in answer.json()["data"] if m.get("parent") is None and m["id"] != ANY_MODEL]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{url}: no model list ({type(e).__name__}: {e}); pass model=") from None
    if len(listed) != 1:
        raise ConfigError(f"{url} serves {len(listed)} models ({', '.join(listed) or 'none'}): pass model=")
    return listed[0]
