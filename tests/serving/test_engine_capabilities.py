"""What an engine can do is written once, on its `Engine` class: no module outside serving/servers/engines.py tells
engines apart by name, so that a new engine is one class and its capabilities, not a hunt for `== "vllm"`."""

import re
from pathlib import Path

import pytest

from cupid.serving.servers import lifecycle, profiles
from cupid.serving.servers.engines import ENGINES, Engine, TransformersEngine, VllmEngine, capabilities

REPO = Path(__file__).resolve().parents[2]
PACKAGE = ("cupid", "matcher", "serving", "eval", "training")  # the folders of the `cupid` package (package-dir)
NAMES = "|".join(map(re.escape, ENGINES))
# A name compared (`== "vllm"`, `"vllm" != x`, `engine in ("vllm", ...)`) or a table keyed by engine names
BY_NAME = re.compile(
    rf"""(==|!=)\s*["']({NAMES})["']|["']({NAMES})["']\s*(==|!=)|engine\S*\s+(not\s+)?in\s*[(\[{{]\s*["']({NAMES})["']"""
    rf"""|\{{\s*["']({NAMES})["']\s*:\s*\d"""
)


def by_name(root: Path) -> list[str]:
    """Each line of the package's modules, engines.py aside, that tells engines apart by name."""
    found = []
    for folder in PACKAGE:
        for path in sorted((root / folder).rglob("*.py")):
            if path.relative_to(root).as_posix() == "serving/servers/engines.py":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if BY_NAME.search(line):
                    found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_no_module_outside_engines_compares_engine_names():
    assert by_name(REPO) == []


@pytest.mark.parametrize(
    "line",
    [
        'if profile.engine == "vllm":',
        'return self.serve.get("engine", "vllm") != "vllm"',
        'LIVE = {"vllm": 256, "transformers": 16}',
        'if engine in ("transformers",):',
    ],
)
def test_the_check_finds_a_comparison(tmp_path, line):
    """The check can fail: a comparison by name in any package module is reported with its place."""
    (tmp_path / "serving").mkdir()
    (tmp_path / "serving" / "placed.py").write_text(f"{line}\n")
    assert by_name(tmp_path) == [f"serving/placed.py:1: {line}"]


def test_capabilities_are_each_engine_own():
    """vLLM enforces answer formats, batches hundreds, takes LoRA and its own arguments, and runs on cuda or cpu;
    `transformers serve` does none of it, on CPU; a name no engine has (an old record's) can do nothing special."""
    assert (VllmEngine.structured_output, VllmEngine.lora, VllmEngine.engine_args) == (True, True, True)
    assert (TransformersEngine.structured_output, TransformersEngine.lora) == (False, False)
    assert VllmEngine.live_concurrency > TransformersEngine.live_concurrency
    assert (VllmEngine.device_of("cpu"), VllmEngine.device_of("cuda"), TransformersEngine.device_of("cuda")) == (
        "cpu",
        "cuda",
        "cpu",
    )
    assert capabilities("no-such-engine") is Engine and capabilities(None) is Engine


def test_a_live_endpoint_follows_its_engine():
    """How a client talks to a server is read from its engine's capabilities."""
    vllm = lifecycle.endpoint_fields("http://h:1/v1", "vllm", None)
    plain = lifecycle.endpoint_fields("http://h:1/v1", "transformers", None)
    assert (vllm["structured_output"], vllm["max_concurrency"]) == (True, VllmEngine.live_concurrency)
    assert (plain["structured_output"], plain["max_concurrency"]) == (False, TransformersEngine.live_concurrency)


def test_a_profile_asks_its_engine():
    """A transformers profile runs on CPU whatever its device says, and is refused LoRA adapters."""
    plain = profiles.Profile(name="t", engine="transformers", model="m", port=1)
    assert (plain.on_gpu, plain.device_chosen, plain.engine_can) == (False, None, TransformersEngine)
    gpu = profiles.Profile(name="v", engine="vllm", model="m", port=1, device="cuda")
    assert (gpu.on_gpu, gpu.device_chosen) == (True, "cuda")
    with pytest.raises(ValueError, match="vllm engine only"):
        profiles.Profile(name="t", engine="transformers", model="m", port=1, lora_adapters={"a": "b"})
