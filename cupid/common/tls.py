"""The one-off requests (health probes, model lists, adapter loads), with one TLS context per process.

`httpx.get` builds a client, and with it a TLS context that loads the CA bundle, on every call, even for a plain
`http://` address, which costs CPU on every call. A server's start polls its health every 0.2 s, so those polls took a
noticeable share of a core beside the server they wait for; through these a poll reuses the one context
(docs/performance.md has the figures)."""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's own default (its CA bundle, or SSL_CERT_FILE / SSL_CERT_DIR), built once."""
    return httpx.create_ssl_context()


def http_get(url: str, **kwargs: Any) -> httpx.Response:
    """`httpx.get` on the process's TLS context."""
    return httpx.get(url, verify=_tls_context(), **kwargs)


def http_post(url: str, **kwargs: Any) -> httpx.Response:
    """`httpx.post` on the process's TLS context."""
    return httpx.post(url, verify=_tls_context(), **kwargs)
