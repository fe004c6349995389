"""One TLS context per process for the one-off requests (health probes, model lists, adapter loads).

`httpx.get` builds a client, and with it a TLS context that loads the CA bundle, on every call, even for a plain
`http://` address: ~20 ms of a core each. A server's start polls its health every 0.2 s, so the polls cost more than
a tenth of a core beside the server they wait for; with this context a poll costs ~0.2 ms."""

from __future__ import annotations

import functools
import ssl


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's own default (its CA bundle, or SSL_CERT_FILE / SSL_CERT_DIR), built once: pass it as `verify=`."""
    import httpx

    return httpx.create_ssl_context()
