"""The QLoRA fine-tune: TRL's SFTTrainer on the match data, PEFT LoRA on a bitsandbytes 4-bit base.

Decisions, each following the recipe (spec §5) unless the config says otherwise:
- The data is TRL's conversational prompt-completion format, so the loss is on the assistant turn
  only (its end-of-turn token included) with the model's own chat template, unpatched.
- Gradient clipping is off unless `max_grad_norm` is set (torchtune's `clip_grad_norm: null`);
  warmup is an integer number of optimizer steps (transformers reads a value below 1 as a ratio).
- The loss is normalized by the number of completion tokens over the accumulation window
  (transformers passes `num_items_in_batch`; torchtune does the same).
- Examples longer than `max_length` are counted in the report: TRL cuts them, and drops those
  left with no completion token.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from rich.console import Console

from cupid.common.config import ConfigError
from cupid.training import trl_args
from cupid.training.config import TrainConfig, chain_sft_args
from cupid.training.matchdata import data_dir, read_examples


class SftReport(BaseModel):
    """`<out>/train_report.json`, key for key: what the fine-tune ran on and measured, typed for those who read it."""

    # a NaN (a diverged loss) is written NaN, as json.dumps of the dict wrote it, also inside free-form fields
    model_config = ConfigDict(ser_json_inf_nan="constants")

    base_model: str
    adapter: str
    resumed_from: str | None
    precision: str
    quantization: dict[str, Any] | None  # the `quantization:` arguments; null: plain LoRA
    lora: dict[str, Any]
    trainable_parameters: int
    total_parameters: int
    n_train_examples: int
    n_validation_examples: int
    n_over_max_length: int
    n_dropped_no_completion_left: int
    train_tokens_per_epoch: int
    completion_tokens_per_epoch: int
    optimizer_steps: int
    max_steps: int
    loss_before: dict[str, float]  # split -> mean completion-token loss
    loss_after: dict[str, float]
    logged_losses: list[dict[str, Any]]  # {step, loss} per logged step
    throughput: list[dict[str, Any]]  # one row per log: step, loss, learning_rate, num_tokens, tokens_per_s
    mean_tokens_per_s: float | None
    peak_gpu_memory_gib: float | None  # torch.cuda.max_memory_allocated; null on CPU
    gpu_memory_gib: float | None
    train_runtime_s: float
    wall_s: float
    hyperparameters: dict[str, Any]  # the `sft:` section and TRL's SFTConfig as it ran


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


def precision(cfg: TrainConfig) -> str:
    import torch

    if cfg.sft.precision != "auto":
        return cfg.sft.precision
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"


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


def _throughput_callback(console: Console):
    from transformers import TrainerCallback

    class Throughput(TrainerCallback):
        """One line per log: step, loss, learning rate and tokens/s since the previous log."""

        def __init__(self):
            self.rows: list[dict[str, Any]] = []
            self._last: tuple[float, float] | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            self._last = None

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            now, tokens = time.monotonic(), float(logs.get("num_tokens", 0))
            rate = None
            if self._last is not None and now > self._last[0]:
                rate = (tokens - self._last[1]) / (now - self._last[0])
            self._last = (now, tokens)
            row = {
                "step": state.global_step,
                "loss": logs["loss"],
                "learning_rate": logs.get("learning_rate"),
                "num_tokens": tokens,
                "tokens_per_s": round(rate, 1) if rate else None,
            }
            self.rows.append(row)
            rate_text = f"{rate:,.0f} tokens/s" if rate else "tokens/s from the next log"
            console.print(
                f"step {state.global_step}/{state.max_steps}  loss {logs['loss']:.4f}  "
                f"lr {logs.get('learning_rate', 0):.2e}  {rate_text}",
                highlight=False,
            )

    return Throughput()


def _lengths(tokenizer, examples) -> list[tuple[int, int]]:
    """Each example's tokens through the chat template: (its prompt's, with the assistant's header; the whole)."""
    out = []
    for e in examples:
        prompt = [m.model_dump() for m in e.prompt]
        whole = prompt + [m.model_dump() for m in e.completion]
        out.append(
            (
                len(
                    tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True, return_dict=True)[
                        "input_ids"
                    ]
                ),
                len(tokenizer.apply_chat_template(whole, tokenize=True, return_dict=True)["input_ids"]),
            )
        )
    return out


def check_lengths(lengths: list[tuple[int, int]], max_length: int, source: str) -> int:
    """How many examples are over `max_length` (TRL cuts them); a ConfigError when truncation would leave no example
    a completion token (TRL then drops them all and stops on an empty sampler, naming neither)."""
    over = sum(whole > max_length for _, whole in lengths)
    if lengths and all(prompt >= max_length for prompt, _ in lengths):
        longest = max(whole for _, whole in lengths)
        raise ConfigError(
            f"{source}: sft.max_length {max_length}: no training example keeps a completion token after truncation "
            f"({over} of {len(lengths)} are longer; every prompt alone reaches it; the longest example is {longest} "
            f"tokens): raise sft.max_length to at least {longest}"
        )
    return over


# The chain's own defaults of SFTConfig arguments, which a config's `sft:` may change (the recipe's are in the YAML).
CHAIN_DEFAULTS: dict[str, Any] = {
    "gradient_checkpointing_kwargs": {"use_reentrant": False},
    "dataloader_num_workers": 0,
    "disable_tqdm": False,
}


def gpu_gib() -> float | None:
    """The first CUDA device's memory in GiB (an 80 GB H100 has 79.2); None without one."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None


def peak_gpu_gib() -> float | None:
    """The most memory torch held on the GPU since the process began (None on CPU)."""
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def sft_config(cfg: TrainConfig, prec: str | None = None):
    """The `trl.SFTConfig` of this run: the config's `sft:` arguments over the chain's defaults, and what the
    chain sets itself (`config.chain_sft_args`). TRL and transformers check the arguments here
    (`trl_args.build`): an unknown one, a value of another type than SFTConfig declares, or a value they refuse,
    is a ConfigError that names the file and `sft.<key>` and gives their message. Nothing is written."""
    from trl import SFTConfig

    prec = prec or precision(cfg)
    given = cfg.sft.for_gpu(gpu_gib())
    defaults = {
        **CHAIN_DEFAULTS,
        "data_seed": given.get("seed", CHAIN_DEFAULTS.get("seed")),
    }  # the data order follows the seed
    chain = chain_sft_args(cfg.out_dir, prec)
    return trl_args.build(SFTConfig, "sft", given, defaults=defaults, owned=chain, source=cfg.source)


def check(cfg: TrainConfig) -> tuple[Any, Any, Any]:
    """What the fine-tune is given, checked by each owner before anything loads: TRL's `SFTConfig`, peft's
    `LoraConfig`, transformers' `BitsAndBytesConfig` (None: plain LoRA)."""
    return sft_config(cfg), lora_config(cfg), bnb_config(cfg)


def lora_config(cfg: TrainConfig):
    """peft's `LoraConfig` of the run: the config's `lora:` arguments over the chain's defaults."""
    return trl_args.lora_config(cfg.lora.args, cfg.source)


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


def train(cfg: TrainConfig, console: Console | None = None) -> SftReport:
    """Fine-tune, save the adapter to `<out>/adapter`, write `<out>/train_report.json`; return the report."""
    console = console or Console(stderr=True)
    # Inputs first: a bad path or data line fails in a second, before the heavy imports and the model.
    base = resolve_base(cfg)
    ddir = data_dir(cfg)
    train_examples = read_examples(ddir / "train.jsonl")
    val_path = ddir / "validation.jsonl"
    val_examples = read_examples(val_path) if val_path.is_file() else []
    prec = precision(cfg)
    args = sft_config(cfg, prec)  # TRL checks the `sft:` arguments before the data and the model are loaded

    import datasets
    import torch
    from transformers import AutoTokenizer
    from transformers.trainer_utils import get_last_checkpoint
    from trl import SFTTrainer

    files = {"train": str(ddir / "train.jsonl")} | ({"validation": str(val_path)} if val_examples else {})
    # Only the two columns the trainer reads: provenance columns differ in type across rows (raw: null).
    data = datasets.load_dataset("json", data_files=files).select_columns(["prompt", "completion"])

    dtype = torch.bfloat16 if prec == "bf16" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(base)
    n_long = check_lengths(_lengths(tokenizer, train_examples), args.max_length, str(cfg.source))
    model = load_base(base, cfg, dtype)
    s, lora = cfg.sft, cfg.lora
    out = cfg.out_dir
    checkpoints = out / "checkpoints"
    peft_config = lora_config(cfg)
    throughput = _throughput_callback(console)
    trainer: Any = SFTTrainer(  # its datasets and model are set by now (typed optional in TRL)
        model=model,
        args=args,
        train_dataset=data["train"],
        eval_dataset=data["validation"] if val_examples else None,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[throughput],
    )
    n_trainable, n_total = trainer.model.get_nb_trainable_parameters()
    n_kept = len(trainer.train_dataset)
    train_tokens = sum(len(ids) for ids in trainer.train_dataset["input_ids"])
    completion_tokens = sum(sum(label != -100 for label in labels) for labels in trainer.train_dataset["labels"])
    q = cfg.quantization.args
    quantized = (
        f"4-bit {q['bnb_4bit_quant_type']}"
        if q["load_in_4bit"]
        else "8-bit"
        if q.get("load_in_8bit")
        else "unquantized"
    )
    console.print(
        f"[bold]sft[/bold]: {base}, "
        f"{quantized} "
        f"base, LoRA r={lora.r}: {n_trainable:,} trainable of {n_total:,} parameters; {n_kept} examples "
        f"({train_tokens:,} tokens, {completion_tokens:,} in completions), "
        f"{n_long} over max_length {args.max_length}; {prec}",
        highlight=False,
    )

    def losses() -> dict[str, float]:
        """Mean completion-token loss over whole splits: the same examples before and after, so the
        two numbers compare (the logged per-step losses are over different batches)."""
        out: dict[str, float] = {}
        for split in s.measure_loss_on:
            dataset = trainer.train_dataset if split == "train" else trainer.eval_dataset
            if dataset is not None:
                out[split] = round(trainer.evaluate(eval_dataset=dataset, metric_key_prefix=split)[f"{split}_loss"], 5)
        return out

    last = get_last_checkpoint(str(checkpoints)) if s.resume and checkpoints.is_dir() else None
    before = losses()
    started = time.monotonic()
    result = trainer.train(resume_from_checkpoint=last)
    wall = time.monotonic() - started
    after = losses()

    adapter_dir = out / "adapter"
    trainer.save_model(str(adapter_dir))
    tokenizer.save_pretrained(str(adapter_dir))
    steps = [row for row in trainer.state.log_history if "loss" in row]
    rates = [row["tokens_per_s"] for row in throughput.rows if row["tokens_per_s"]]
    report = SftReport(
        base_model=base,
        adapter=str(adapter_dir),
        resumed_from=last,
        precision=prec,
        quantization=cfg.quantization.args if cfg.quantization.active else None,
        lora=lora.args,
        trainable_parameters=n_trainable,
        total_parameters=n_total,
        n_train_examples=len(train_examples),
        n_validation_examples=len(val_examples),
        n_over_max_length=n_long,
        n_dropped_no_completion_left=len(train_examples) - n_kept,
        train_tokens_per_epoch=train_tokens,
        completion_tokens_per_epoch=completion_tokens,
        optimizer_steps=trainer.state.global_step,
        max_steps=trainer.state.max_steps,
        loss_before=before,
        loss_after=after,
        logged_losses=[{"step": r["step"], "loss": r["loss"]} for r in steps],
        throughput=throughput.rows,
        mean_tokens_per_s=round(sum(rates) / len(rates), 1) if rates else None,
        peak_gpu_memory_gib=peak_gpu_gib(),
        gpu_memory_gib=round(gib, 1) if (gib := gpu_gib()) else None,
        train_runtime_s=round(result.metrics.get("train_runtime", wall), 2),
        wall_s=round(wall, 2),
        hyperparameters={**s.model_dump(), "sft_config": args.to_dict()},
    )
    # json.dumps, not model_dump_json: the file keeps its bytes (non-ASCII escaped, a diverged NaN loss written NaN)
    (out / "train_report.json").write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    if any(v is not None and not math.isfinite(v) for v in after.values()):
        raise RuntimeError(f"training diverged: loss after training is {after}; see {out / 'train_report.json'}")
    return report
