"""Whether the Hugging Face Hub can be reached, asked once in about a second, before a load that would retry for half
a minute (`huggingface_hub` backs off five times on a name that does not resolve) and then fail anyway.

Offline by choice (`HF_HUB_OFFLINE=1`) the loaders read their cache: nothing is asked. A Hub whose host answers is
left to the loader, which says what it found.
"""

from __future__ import annotations

import os
import socket
from functools import cache
from urllib.parse import urlparse

PROBE_TIMEOUT_S = 1.5
DEFAULT_ENDPOINT = "https://huggingface.co"


def offline_by_choice() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def unreachable() -> str | None:
    """Why the Hub cannot be reached (its host does not resolve, or refuses a connection), or None: it answers, or
    this process is offline by choice. The Hub is asked once a process and endpoint."""
    if offline_by_choice():
        return None
    return _probe(os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT))


@cache
def _probe(endpoint: str) -> str | None:
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as e:
        return f"{host}:{port} cannot be reached ({e.strerror or type(e).__name__})"
