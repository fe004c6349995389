from __future__ import annotations

from typing import TYPE_CHECKING

from cupid.common.faces import lazy

# What the rest of the package uses of this room, by the module that defines it (imported on first use)
EXPORTS = {
    "Cache": "cupid.serving.cache",
    "CacheError": "cupid.serving.cache",
    "CacheSetting": "cupid.serving.cache",
    "Cached": "cupid.serving.cache",
    "ChatRequest": "cupid.serving.client",
    "Client": "cupid.serving.client",
    "DEFAULT": "cupid.serving.cache",
    "DEFAULT_FILE": "cupid.serving.registry",
    "Endpoint": "cupid.serving.endpoint",
    "EndpointLike": "cupid.serving.registry",
    "RequestFailed": "cupid.serving.client",
    "SCHEMA_VERSION": "cupid.serving.cache",
    "Stats": "cupid.serving.client",
    "bearer": "cupid.serving.endpoint",
    "cache_path": "cupid.serving.cache",
    "classify": "cupid.serving.client",
    "load_endpoints": "cupid.serving.registry",
    "lookup": "cupid.serving.registry",
    "missing_keys": "cupid.serving.registry",
    "open_cache": "cupid.serving.cache",
    "open_client": "cupid.serving.offline",
    "per_loop": "cupid.serving.client",
    "renamed_no_cache": "cupid.serving.cache",
    "require": "cupid.serving.registry",
    "require_reachable": "cupid.serving.registry",
    "resolve": "cupid.serving.registry",
}
__all__ = [
    "DEFAULT",
    "DEFAULT_FILE",
    "SCHEMA_VERSION",
    "Cache",
    "CacheError",
    "CacheSetting",
    "Cached",
    "ChatRequest",
    "Client",
    "Endpoint",
    "EndpointLike",
    "RequestFailed",
    "Stats",
    "bearer",
    "cache_path",
    "classify",
    "load_endpoints",
    "lookup",
    "missing_keys",
    "open_cache",
    "open_client",
    "per_loop",
    "renamed_no_cache",
    "require",
    "require_reachable",
    "resolve",
]
__getattr__, __dir__ = lazy(__name__, EXPORTS)

if TYPE_CHECKING:
    from cupid.serving.cache import (
        DEFAULT,
        SCHEMA_VERSION,
        Cache,
        Cached,
        CacheError,
        CacheSetting,
        cache_path,
        open_cache,
        renamed_no_cache,
    )
    from cupid.serving.client import ChatRequest, Client, RequestFailed, Stats, classify, per_loop
    from cupid.serving.endpoint import Endpoint, bearer
    from cupid.serving.offline import open_client
    from cupid.serving.registry import (
        DEFAULT_FILE,
        EndpointLike,
        load_endpoints,
        lookup,
        missing_keys,
        require,
        require_reachable,
        resolve,
    )
