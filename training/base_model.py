"""The base model of a training run: where it is (`resolve_base`: a local directory, the bundled tiny model or a Hub
id) and how it loads (`load_base`: frozen, 4-bit NF4 when the config quantizes, as `bnb_config` builds
transformers' BitsAndBytesConfig). The fine-tune, the export and the agreement check load the same base through here,
and none imports another stage for it; GRPO's policy (`resolve_policy`, `load_policy`) is found and loaded here too,
so that every stage's model comes in by one door."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cupid.common.config import ConfigError
from cupid.common.files import prepared_model
from cupid.training.config import TrainConfig


def resolve_base(cfg: TrainConfig) -> str:
    """A local model directory, `tiny` (the bundled CPU model), or a Hub id; a path that does not exist
    fails here, naming the config field, instead of deep inside from_pretrained."""
    value = cfg.base_model
    if value == "tiny":
        from cupid.serving.servers import tiny_model

        return str(tiny_model.ensure())
    path = Path(value).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{cfg.source}: base_model: {path} has no config.json (not a model directory)")
        return str(path)
    looks_like_hub_id = value.count("/") == 1 and not value.startswith((".", "/", "~")) and "\\" not in value
    if not looks_like_hub_id:
        raise ConfigError(f"{cfg.source}: base_model: directory {path} does not exist")
    return value


def resolve_policy(policy: str) -> str:
    """GRPO's policy as the config names it: `prepared:NAME` is the model the project prepared under the state
    directory, anything else (a local directory, a Hub id) as given."""
    return prepared_model(policy)


def load_policy(policy: str):
    """GRPO's policy in full precision, as its config names it (`resolve_policy`): the trainer trains a LoRA adapter
    on it and never quantizes it."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve_policy(policy))


def load_base(base: str, cfg: TrainConfig, dtype):
    """The frozen base, 4-bit NF4 when configured. A GGUF origin note in config.json (the tiny model's)
    is dropped: the directory holds plain weights. Any other pre-quantized base is refused."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(base)
    except OSError as e:
        raise ConfigError(f"{cfg.source}: base_model: cannot load {base}: {e}") from None
    existing = getattr(config, "quantization_config", None)
    if existing is not None:
        method = existing.get("quant_method") if isinstance(existing, dict) else getattr(existing, "quant_method", None)
        if method != "gguf":
            raise ConfigError(
                f"{cfg.source}: base_model: {base} is already quantized ({method}); give the full-precision model"
            )
        del config.quantization_config
    kwargs: dict[str, Any] = {"config": config, "dtype": dtype}
    if quantization := bnb_config(cfg, dtype):
        kwargs["quantization_config"] = quantization
    if torch.cuda.is_available():
        kwargs["device_map"] = {"": 0}
    model = AutoModelForCausalLM.from_pretrained(base, **kwargs)
    if cfg.quantization.load_in_4bit:
        keep_cpu_weights_unpacked(model)
    return model


def keep_cpu_weights_unpacked(model) -> int:
    """Stop bitsandbytes (0.50) from repacking 4-bit weights in place for its CPU kernel.

    On a CPU with AVX512-BF16, the first forward of a Linear4bit in eval mode without gradients
    rewrites its weight into a CPU-only layout. From then on, (1) training forwards go through an op
    with no autograd, so no gradient flows back through the frozen layers (torch only warns), and
    (2) transformers' `dequantize()` reads the repacked bytes as the standard layout and returns
    wrong weights. Both happened here after a loss evaluation; with the repacking off, train, eval
    and dequantize all use the standard layout (on GPU the flag is never consulted).
    """
    import bitsandbytes as bnb

    modules = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    for module in modules:
        module.support_avx512bf16_for_cpu = False
    return len(modules)


def bnb_config(cfg: TrainConfig, dtype: Any = None):
    """transformers' `BitsAndBytesConfig` of the run (None: plain LoRA): the config's `quantization:` arguments over
    the chain's defaults, computing in `dtype`. BitsAndBytesConfig only logs an argument it does not know and goes on,
    so each is checked against its signature here and refused by name."""
    import inspect

    from transformers import BitsAndBytesConfig

    if not cfg.quantization.active:
        return None
    given = cfg.quantization.args
    accepted = {
        name
        for name, p in inspect.signature(BitsAndBytesConfig.__init__).parameters.items()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self"
    }
    if unknown := sorted(set(given) - accepted):
        raise ConfigError(
            f"{cfg.source}: quantization.{unknown[0]}: not an argument of transformers' BitsAndBytesConfig"
        )
    try:
        return BitsAndBytesConfig(**given, bnb_4bit_compute_dtype=dtype)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{cfg.source}: quantization: transformers' BitsAndBytesConfig refuses it: {e}") from None
