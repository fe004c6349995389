"""What the test files share besides fixtures: the checkout's root, the session server's model and profile fields,
endpoints files, copies of the sample data, and the processes a test starts or looks for."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import yaml

from cupid.eval.benchmark import data as cupid_data
from cupid.serving.servers import vllm_args
from cupid.serving.servers.instant import start as start_instant

REPO = Path(__file__).resolve().parents[1]
TINY_NAME = "tiny-random-llama"  # the session server's served name
# The shipped tiny profile's KV cache (3 GiB: SmolLM2-135M's 8 full-length requests) holds ~6M tokens of the
# random-weight model (2 layers of 64): 1 GiB still holds ~2M, and each vLLM start of it faults in 2 GiB fewer, which
# saves CPU at every start (docs/performance.md).
RANDOM_KV_GIB = 1
# Its matrices are 64 wide: a second OpenMP thread only synchronizes with the first. On one (a core reserved, as the
# profile field says), a server of it answered the same requests in the same time for less CPU, which the suite's
# other worker gets (docs/performance.md).
RANDOM_RESERVED_CORES = 1
# A serve profile's fields for the random-weight model, in every profile that serves it.
RANDOM_SERVING = {"cpu_kvcache_space_gib": RANDOM_KV_GIB, "cpu_reserved_cores": RANDOM_RESERVED_CORES}


@functools.cache
def tiny_lora_rank() -> int:
    """The --max-lora-rank of the session server, which loads LoRA adapters at run time (the training check's, of
    configs/train/tiny.yaml's rank). Asked when first needed, not at import: reading vLLM's ranks imports vLLM (slow,
    the more so in a fresh install, where it compiles), and the controller imports this module alone, before any
    worker starts."""
    return vllm_args.lora_rank_for(yaml.safe_load((REPO / "configs/train/tiny.yaml").read_text())["lora"]["r"])


def write_endpoints(path: Path, **entries: dict) -> Path:
    path.write_text(yaml.safe_dump(entries))
    return path


def sample_copies(path: Path, copies: int, marked: bool = False) -> Path:
    """The sample's rows `copies` times, each copy's personas renamed: data with enough personas for an interval
    (the sample's 4 give none). `marked`: each request ends with `(case <its persona>)`, so a candidate (the instant
    server's `--no-preference-for`) can answer some personas differently."""
    rows = [json.loads(line) for line in cupid_data.SAMPLE_PATH.read_text().splitlines()]

    def copy(row: dict, n: int) -> dict:
        persona = f"{row['persona_id']}-{n}"
        request = f"{row['current_request']} (case {persona})" if marked else row["current_request"]
        return {**row, "persona_id": persona, "current_request": request}

    path.write_text("".join(json.dumps(copy(row, n)) + "\n" for n in range(copies) for row in rows))
    return path


def running_in_group(pgid: int) -> list[int]:
    """Processes of a process group that still run (psutil: independent of the product's own bookkeeping)."""
    import psutil

    out = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def heeds_ctrl_c() -> None:
    """`preexec_fn` of a child a test interrupts: as from a terminal. pytest-xdist's workers ignore SIGINT and a child
    inherits that: it would never see the Ctrl-C the test sends, and run to its end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def running_instant(*args: str) -> Iterator[str]:
    """An instant server with `args` (`cupid.serving.servers.instant`'s options) for the block; its base URL."""
    proc, url = start_instant(*args)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait()
