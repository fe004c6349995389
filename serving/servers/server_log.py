"""What a server's log says when its start failed: the root cause, a likely cause in words, the last lines."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from cupid.common.errors import LOG_TAIL, ServeError

if TYPE_CHECKING:
    from cupid.serving.servers.profiles import Profile

# First match wins: the specific vLLM messages come before the generic ones they contain.
LIKELY_CAUSES = [
    (
        r"less than desired CPU memory utilization",
        (
            "vLLM's CPU build reserves a fraction of RAM unless the KV cache is sized: "
            "set cpu_kvcache_space_gib in the profile"
        ),
    ),
    (
        r"Unknown quantization method",
        (
            "the model's config.json names a quantization vLLM does not know "
            "(a GGUF conversion? `cupid serve prepare-tiny` writes a plain one)"
        ),
    ),
    (
        r"less than desired GPU memory utilization",
        (
            "the GPU has less free memory than the profile's gpu_memory_utilization asks for "
            "(another process holds some: see nvidia-smi)"
        ),
    ),
    (
        (
            r"larger than the available KV cache memory"
            r"|larger than the maximum number of tokens that can be stored in KV cache"
            r"|No available memory for the cache blocks"
        ),
        "the KV cache does not fit: raise gpu_memory_utilization or lower max_model_len",
    ),
    (
        r"out of memory|CUDA error: out of memory|OutOfMemoryError",
        "out of memory: lower the GPU memory fraction or max model length",
    ),
    (r"address already in use|Errno 98", "the port is taken"),
    (r"LoRA rank \d+ (is )?(greater|larger) than|max_lora_rank", "a LoRA adapter's rank is above max_lora_rank"),
    (
        r"No CUDA GPUs|Found no NVIDIA driver|CUDA is not available|libcuda|no kernel image is available",
        "no usable CUDA device",
    ),
    (
        (
            r"Repository Not Found|not a valid model identifier|OSError: .*does not appear to have"
            r"|No such file or directory|is not a local folder|couldn't connect to 'https://huggingface.co'"
            r"|401 Client Error|no file named \S+\.(safetensors|bin)|Cannot find any model weights"
        ),
        "model not found (a Hub id needs network access or a local copy; a local path must exist)",
    ),
]


def tail(path: str | Path, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def likely_cause(log_text: str) -> str | None:
    for pattern, cause in LIKELY_CAUSES:
        if re.search(pattern, log_text, flags=re.IGNORECASE):
            return cause
    return None


# An exception's own line, as a traceback or a logged error ends: `SomeError: message`, after vLLM's log prefix.
_RAISED = re.compile(r"^(?:\(.*?\) ERROR .*?\] )?\s*([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
_WRAPPERS = ("See root cause above", "Engine core initialization failed")


def root_cause(log_text: str) -> str | None:
    """The first exception a log reports, past the wrappers that only point back at it: vLLM's engine
    processes log the real error long before the server's final traceback."""
    for line in log_text.splitlines():
        found = _RAISED.match(line)
        if found and not any(w in line for w in _WRAPPERS):
            return f"{found.group(1)}: {found.group(2).strip()}"
    return None


def startup_failure(profile: Profile, log_path: Path, what: str) -> ServeError:
    try:
        log_text = log_path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        log_text = ""
    hint = ""
    if first := root_cause(log_text):
        hint += f"\nroot cause: {first}"
    if cause := likely_cause(log_text):
        hint += f"\nlikely cause: {cause}"
    return ServeError(
        f"'{profile.handle}' ({profile.engine}, {profile.model}): {what}{hint}\n"
        f"{LOG_TAIL.lstrip()}{log_path} ---\n{tail(log_path)}"
    )
