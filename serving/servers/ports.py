"""Ports for the servers this project starts: free now, and likely still free when a server binds them later."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers bind (uvicorn sets it): a port whose last server just stopped is free despite TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


# Its own source of randomness: `random`'s is seeded by whatever trains in this process (transformers' set_seed), and
# two processes seeded alike would then pick the same ports, one server starting on the other's.
_PORTS = random.SystemRandom()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to, for a server started now or later (tests, a training check's server, `make bench`).

    Picked below the kernel's ephemeral range, not by binding port 0: a port the kernel hands out is soon handed out
    again as the local end of some client's connection, and a server started on it minutes later finds it taken."""
    low = ephemeral_range()[0]
    if low > 10_001:
        for _ in range(100):
            port = _PORTS.randrange(10_000, low)
            if port_free(host, port):
                return port
    with socket.socket() as sock:  # an unusual ephemeral range: take one the kernel hands out
        sock.bind((host, 0))
        return sock.getsockname()[1]


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default; macOS's (49152-65535) is above it too


def holder(port: int) -> str | None:
    """Who listens on `port`, where the system tells (`pid 123: python -m ...`); None where it does not (another user's
    process without the rights to see it, no psutil)."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                command = " ".join(psutil.Process(conn.pid).cmdline())
                return f"pid {conn.pid}: {command[:100]}"
    except Exception:  # noqa: BLE001 (a hint in an error message: never an error of its own)
        return None
    return None


def taken(host: str, port: int, owner: str | None = None) -> str:
    """The line for a port that is taken: by what, where the system tells, and what to do."""
    by = f" by '{owner}'" if owner else f" ({who})" if (who := holder(port)) else ""
    return f"port {port} on {host} is taken{by}: pick another with --port"
